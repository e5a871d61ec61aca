"""Syncpoints: upstream ts -> each table's Delta version, readable at that version."""

from __future__ import annotations

import os
import pickle
from decimal import Decimal

import pytest
from conftest import CF, accounts, batch

from cdc_dagster.sinks.base import Sink, SinkError, SyncpointRecord
from cdc_dagster.sinks.delta import (
    list_syncpoints,
    read_syncpoint,
    read_table_at,
    syncpoint_path,
)


def test_delta_sink_implements_the_sink_protocol(sink):
    assert isinstance(sink, Sink)
    assert pickle.loads(pickle.dumps(sink)).root == sink.root


def test_syncpoint_pins_each_tables_version_at_its_ts(sink):
    a, b = accounts(table="a", table_id=1), accounts(table="b ☃", table_id=2)
    tokens = {t.table_id: sink.acquire(CF, t) for t in (a, b)}
    for t in (a, b):
        sink.write(
            CF, t, batch(t, [{"id": 1, "balance": Decimal("10")}]), 0, 100, tokens[t.table_id]
        )
    rec = sink.record_syncpoint(CF, 100, [a, b])
    assert isinstance(rec, SyncpointRecord) and rec.ts == 100 and set(rec.versions) == {1, 2}
    assert os.path.exists(syncpoint_path(sink.root, CF, 100))
    assert syncpoint_path(sink.root, CF, 100).endswith(f"/cf-1/{100:020d}.json")
    # the tables move on after the syncpoint
    for t in (a, b):
        sink.write(
            CF,
            t,
            batch(t, [{"id": 1, "op": "d"}, {"id": 2, "balance": Decimal("5")}]),
            100,
            200,
            tokens[t.table_id],
        )
    sink.record_syncpoint(CF, 200, [a, b])
    assert list_syncpoints(sink.root, CF) == [100, 200]
    assert list_syncpoints(sink.root, "other") == []
    got = read_syncpoint(sink.root, CF, 100)
    assert got == rec
    for t in (a, b):
        old = read_table_at(sink.root, got.locations[t.table_id], got.versions[t.table_id])
        assert old.to_pylist() == [{"id": 1, "balance": Decimal("10.00"), "note": None}]
        new = read_table_at(sink.root, t)
        assert new.column("id").to_pylist() == [2]


def test_recording_a_syncpoint_again_returns_the_first_record(sink):
    t = accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, []), 0, 100, token)
    first = sink.record_syncpoint(CF, 100, [t])
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("1")}]), 100, 150, token)
    assert sink.record_syncpoint(CF, 100, [t]) == first


def test_syncpoint_refused_when_a_batch_spanned_it(sink):
    t = accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, []), 0, 150, token)
    with pytest.raises(SinkError, match=r"no Delta version committed exactly at 100"):
        sink.record_syncpoint(CF, 100, [t])
    assert read_syncpoint(sink.root, CF, 100) is None


def test_syncpoint_recorded_after_the_tables_moved_on_pins_their_version_at_its_ts(sink):
    """Syncpoints hold nothing back: the sink split its batch at 100 and went on; the record,
    made later, finds the commit that ended at 100 (and a new primary's acquire after it)."""
    t = accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("10")}]), 0, 100, token)
    token = sink.acquire(CF, t)  # a new primary takes the table over at 100
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("20")}]), 100, 150, token)
    sink.write(CF, t, batch(t, [{"id": 2, "balance": Decimal("30")}]), 150, 220, token)
    rec = sink.record_syncpoint(CF, 100, [t])
    at_100 = read_table_at(sink.root, rec.locations[t.table_id], rec.versions[t.table_id])
    assert at_100.to_pylist() == [{"id": 1, "balance": Decimal("10.00"), "note": None}]
    assert read_syncpoint(sink.root, CF, 100).versions == rec.versions
    rec_150 = sink.record_syncpoint(CF, 150, [t])
    at_150 = read_table_at(sink.root, rec_150.locations[t.table_id], rec_150.versions[t.table_id])
    assert at_150.column("balance").to_pylist() == [Decimal("20.00")]

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


def test_syncpoint_refused_when_a_table_is_already_past_it(sink):
    t = accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, []), 0, 150, token)
    with pytest.raises(SinkError, match=r"committed to 150 > 100"):
        sink.record_syncpoint(CF, 100, [t])
    assert read_syncpoint(sink.root, CF, 100) is None

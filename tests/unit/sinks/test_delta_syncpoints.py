"""Syncpoints: upstream ts -> each table's Delta version, readable at that version."""

from __future__ import annotations

import os
import pickle
from decimal import Decimal

import pytest
from conftest import CF, accounts, batch

from cdc_dagster.sinks.base import Sink, SinkError, SyncpointRecord
from cdc_dagster.sinks.delta import DeltaSink, read_syncpoint, read_table_at
from cdc_dagster.sinks.delta_syncpoint_file import list_syncpoints, syncpoint_path
from cdc_dagster.sinks.delta_vacuum import pinned_versions
from cdc_dagster.sinks.uri import open_sink
from scheduler_core.ts import compose


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


HOUR_MS = 3_600_000
T0_MS = 1_800_000_000_000


def _syncpoints_hours_apart(sink: DeltaSink, hours: list[float]) -> list[int]:
    """One row written and a syncpoint recorded at each of ``hours`` (after T0); their ts."""
    t = accounts()
    token = sink.acquire(CF, t)
    done = []
    prev = compose(T0_MS - 1)
    for i, h in enumerate(hours):
        ts = compose(T0_MS + int(h * HOUR_MS))
        rows = [{"id": i, "balance": Decimal(i)}]
        sink.write(CF, t, batch(t, rows), prev, ts, token)
        sink.record_syncpoint(CF, ts, [t])
        done.append(ts)
        prev = ts
    return done


def test_syncpoints_past_the_retention_behind_the_newest_are_removed_with_their_pins(tmp_path):
    """A syncpoint recorded removes those more than the retention (24 h by default) older
    than it, so the vacuum no longer keeps their versions; the rest stay readable."""
    sink = open_sink(f"delta://{tmp_path}/lake")
    assert sink.syncpoint_retention_hours == 24
    ts = _syncpoints_hours_apart(sink, [0, 1, 23, 24.5, 25.5])
    # at 24.5 h the one at 0 went; at 25.5 h the one at 1 h too (24.5 h behind it)
    assert list_syncpoints(sink.root, CF) == ts[2:]
    location = read_syncpoint(sink.root, CF, ts[-1]).locations[7]
    kept = {read_syncpoint(sink.root, CF, s).versions[7] for s in ts[2:]}
    assert pinned_versions(sink.root, location) == sorted(kept)
    for s in ts[2:]:
        rec = read_syncpoint(sink.root, CF, s)
        assert len(read_table_at(sink.root, location, rec.versions[7])) == ts.index(s) + 1


def test_syncpoint_retention_from_the_uri_off_keeps_every_one_and_zero_only_the_newest(
    tmp_path,
):
    off = open_sink(f"delta://{tmp_path}/off?syncpoint_retention_hours=off")
    assert off.syncpoint_retention_hours is None
    assert open_sink(off.uri) == off and pickle.loads(pickle.dumps(off)) == off
    assert off.uri.endswith("?syncpoint_retention_hours=off")
    ts = _syncpoints_hours_apart(off, [0, 100, 1000])
    assert list_syncpoints(off.root, CF) == ts
    zero = open_sink(f"delta://{tmp_path}/zero?syncpoint_retention_hours=0&compression=lz4")
    assert zero.syncpoint_retention_hours == 0 and open_sink(zero.uri) == zero
    ts = _syncpoints_hours_apart(zero, [0, 0.5, 2])
    assert list_syncpoints(zero.root, CF) == ts[-1:]
    with pytest.raises(SinkError, match="negative"):
        DeltaSink(str(tmp_path), syncpoint_retention_hours=-1)

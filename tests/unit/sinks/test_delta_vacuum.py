"""The Delta sink's vacuum: the files its writes replaced are deleted once due and past the
retention, except every version a syncpoint names; nothing a reader of the current version
or a build on a syncpoint needs goes, and a vacuum that fails never fails a write."""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
from decimal import Decimal

import pyarrow.parquet as pq
import pytest
from conftest import CF, accounts, batch
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from cdc_dagster.sinks import delta_vacuum
from cdc_dagster.sinks.base import SinkError
from cdc_dagster.sinks.delta import DeltaSink, local_path, read_table_at
from cdc_dagster.sinks.delta_paths import META_DIR, table_location
from cdc_dagster.sinks.delta_syncpoint_file import syncpoint_path
from cdc_dagster.sinks.uri import open_sink


def _data_files(sink: DeltaSink, table) -> set[str]:
    """The Parquet files in the table's directory (referenced or not)."""
    out = set()
    for d, _, names in os.walk(sink.path(table)):
        if "_delta_log" in d:
            continue
        out |= {os.path.join(d, n) for n in names if n.endswith(".parquet")}
    return out


def _version_files(sink: DeltaSink, table, version: int | None = None) -> set[str]:
    dt = DeltaTable(sink.path(table), version=version)
    return {local_path(u) for u in dt.file_uris()}


def _ids(sink: DeltaSink, table, version: int | None = None) -> list[int]:
    return sorted(read_table_at(sink.root, table, version).column("id").to_pylist())


def _make_due(sink: DeltaSink, table) -> None:
    """Age the table's vacuum marker past the interval (as if it was vacuumed long ago)."""
    marker = delta_vacuum.marker_path(sink.root, table_location(table.database, table.table))
    assert os.path.exists(marker), "the first write starts the table's vacuum clock"
    old = time.time() - delta_vacuum.VACUUM_EVERY_S - 1
    os.utime(marker, (old, old))


def _write_versions(sink: DeltaSink, table, token: int, n: int, start: int = 0) -> int:
    """``n`` batches each replacing row 1 (so each rewrites the file holding it); the ts."""
    ts = start
    for i in range(n):
        rows = [{"id": 1, "balance": Decimal(i)}, {"id": 100 + ts // 10, "balance": Decimal(1)}]
        sink.write(CF, table, batch(table, rows), ts, ts + 10, token)
        ts += 10
    return ts


@pytest.fixture
def zero(tmp_path) -> DeltaSink:
    """A sink that keeps replaced files for 0 hours (a vacuum deletes every one it may)."""
    return DeltaSink(str(tmp_path / "lake"), vacuum_retention_hours=0)


def test_a_due_vacuum_deletes_replaced_files_and_keeps_the_current_versions(zero):
    t = accounts()
    token = zero.acquire(CF, t)
    ts = _write_versions(zero, t, token, 5)
    replaced = _data_files(zero, t) - _version_files(zero, t)
    assert replaced, "the writes replaced files"
    before = _ids(zero, t)
    _make_due(zero, t)
    _write_versions(zero, t, token, 1, start=ts)  # the write after which it is due
    assert _data_files(zero, t) == _version_files(zero, t), "every replaced file deleted"
    assert _ids(zero, t) == sorted({*before, 100 + ts // 10})
    ops = [h["operation"] for h in DeltaTable(zero.path(t)).history(3)]
    assert ops[:2] == ["VACUUM END", "VACUUM START"], ops
    assert zero.committed(CF, t).committed_ts == ts + 10


def test_no_vacuum_before_the_interval_or_when_off(tmp_path):
    t = accounts()
    for sink in (
        DeltaSink(str(tmp_path / "on"), vacuum_retention_hours=0),  # not due yet
        DeltaSink(str(tmp_path / "off"), vacuum_retention_hours=None),
    ):
        token = sink.acquire(CF, t)
        _write_versions(sink, t, token, 4)
        assert _data_files(sink, t) > _version_files(sink, t)
        ops = {h["operation"] for h in DeltaTable(sink.path(t)).history()}
        assert not any(op.startswith("VACUUM") for op in ops)
    off_marker = delta_vacuum.marker_path(str(tmp_path / "off"), table_location("bank", "accounts"))
    assert not os.path.exists(off_marker)


def test_files_removed_within_the_retention_are_kept(tmp_path):
    sink = DeltaSink(str(tmp_path / "lake"), vacuum_retention_hours=1)
    t = accounts()
    token = sink.acquire(CF, t)
    ts = _write_versions(sink, t, token, 4)
    files = _data_files(sink, t)
    _make_due(sink, t)
    _write_versions(sink, t, token, 1, start=ts)
    assert files <= _data_files(sink, t), "nothing removed less than an hour ago deleted"
    marker = delta_vacuum.marker_path(sink.root, table_location(t.database, t.table))
    assert time.time() - os.stat(marker).st_mtime < 60  # it ran, and found nothing old enough
    for v in range(1, DeltaTable(sink.path(t)).version() + 1):
        assert 1 in _ids(sink, t, v)  # every version still reads


def test_every_syncpoints_version_keeps_its_files_and_reads_as_it_was(zero):
    a, b = accounts(table="a", table_id=1), accounts(table="b ☃", table_id=2)
    tokens = {t.table_id: zero.acquire(CF, t) for t in (a, b)}
    pinned = {}
    ts = 0
    for sp in (1, 2):
        for t in (a, b):
            _write_versions(zero, t, tokens[t.table_id], 3, start=ts)
        ts += 30
        rec = zero.record_syncpoint(CF, ts, [a, b])
        pinned[sp] = {t.table_id: (rec.versions[t.table_id], _ids(zero, t)) for t in (a, b)}
    zero.record_syncpoint("other-cf", ts, [a])  # another changefeed's syncpoints count too
    for t in (a, b):
        ts2 = _write_versions(zero, t, tokens[t.table_id], 3, start=ts)
        _make_due(zero, t)
        _write_versions(zero, t, tokens[t.table_id], 1, start=ts2)
        kept = set(_version_files(zero, t))
        for sp in (1, 2):
            version, ids = pinned[sp][t.table_id]
            assert _ids(zero, t, version) == ids  # a dbt build on it reads it whole
            kept |= _version_files(zero, t, version)
        assert _data_files(zero, t) == kept, "what no syncpoint or the table needs is gone"
        unpinned = pinned[1][t.table_id][0] + 1  # a version between the two syncpoints
        assert not _version_files(zero, t, unpinned) <= _data_files(zero, t)


def test_a_syncpoint_version_the_table_cannot_read_does_not_stop_the_vacuum(zero, caplog):
    t = accounts()
    token = zero.acquire(CF, t)
    ts = _write_versions(zero, t, token, 3)
    rec = zero.record_syncpoint(CF, ts, [t])
    ts = _write_versions(zero, t, token, 3, start=ts)
    version = rec.versions[t.table_id]
    # the log before a checkpoint cleaned up (as Delta's log retention does): the syncpoint's
    # version can no longer be read, the table's current one can
    dt = DeltaTable(zero.path(t))
    dt.create_checkpoint()
    log_dir = os.path.join(zero.path(t), "_delta_log")
    for v in range(dt.version()):
        os.remove(os.path.join(log_dir, f"{v:020d}.json"))
    with pytest.raises(DeltaError):
        DeltaTable(zero.path(t), version=version)
    junk = os.path.join(zero.root, META_DIR, "syncpoints", "junk")
    os.makedirs(junk)
    with open(os.path.join(junk, "1.json"), "w") as fh:
        fh.write("{not json")
    _make_due(zero, t)
    with caplog.at_level(logging.WARNING, logger=delta_vacuum.__name__):
        _write_versions(zero, t, token, 1, start=ts)
    assert _data_files(zero, t) == _version_files(zero, t)
    text = caplog.text
    assert f"syncpoint version {version} cannot be read" in text and "unreadable" in text


def test_a_file_written_but_not_committed_is_never_vacuumed(zero):
    t = accounts()
    token = zero.acquire(CF, t)
    ts = _write_versions(zero, t, token, 2)
    stray = os.path.join(zero.path(t), "part-in-flight.parquet")
    pq.write_table(read_table_at(zero.root, t), stray)
    old = time.time() - 7200
    os.utime(stray, (old, old))
    _make_due(zero, t)
    _write_versions(zero, t, token, 1, start=ts)
    assert os.path.exists(stray)


def test_a_failed_vacuum_never_fails_the_write_and_is_tried_an_interval_later(
    zero, monkeypatch, caplog
):
    t = accounts()
    token = zero.acquire(CF, t)
    ts = _write_versions(zero, t, token, 3)
    _make_due(zero, t)

    def refuse(self, *args, **kwargs):
        raise DeltaError("disk said no")

    monkeypatch.setattr(DeltaTable, "vacuum", refuse)
    with caplog.at_level(logging.WARNING, logger=delta_vacuum.__name__):
        ts = _write_versions(zero, t, token, 1, start=ts)
    assert "vacuum of" in caplog.text and "disk said no" in caplog.text
    assert zero.committed(CF, t).committed_ts == ts
    # recorded for the owner to show, and a second failure counts on from the first
    [first] = delta_vacuum.failures(zero.root)
    assert first.location == table_location(t.database, t.table)
    assert first.attempts == 1 and "DeltaError: disk said no" in first.message
    _make_due(zero, t)
    ts = _write_versions(zero, t, token, 1, start=ts)
    [second] = delta_vacuum.failures(zero.root)
    assert second.attempts == 2 and second.since_ms == first.since_ms
    assert second.last_ms >= first.last_ms
    monkeypatch.undo()
    _write_versions(zero, t, token, 1, start=ts)  # not due: the failure started a new wait
    assert _data_files(zero, t) > _version_files(zero, t)
    assert len(delta_vacuum.failures(zero.root)) == 1, "nothing vacuumed, nothing healed"
    _make_due(zero, t)
    _write_versions(zero, t, token, 1, start=ts + 10)
    assert _data_files(zero, t) == _version_files(zero, t)
    assert delta_vacuum.failures(zero.root) == [], "a vacuum that succeeds clears the record"


def test_failure_records_are_read_per_table_and_a_dropped_tables_go_with_it(zero, caplog):
    """Two tables failing (one named with a snowman, encoded), a junk record and one half
    written are skipped; a dropped table's record and clock are removed with it."""
    tables = [accounts(), accounts(table="k\u2603", table_id=2)]
    now = int(time.time() * 1000)
    for i, t in enumerate(tables):
        delta_vacuum._record_failure(zero.root, table_location(t.database, t.table), f"e{i}", now)
    base = os.path.dirname(delta_vacuum.failure_path(zero.root, "bank/x"))
    with open(os.path.join(base, "junk"), "w") as fh:
        fh.write("{")
    with open(os.path.join(base, "x.tmp-0123"), "w") as fh:
        fh.write("{")
    with caplog.at_level(logging.WARNING, logger=delta_vacuum.__name__):
        got = delta_vacuum.failures(zero.root)
    assert sorted(f.message for f in got) == ["e0", "e1"]
    assert {f.location for f in got} == {table_location(t.database, t.table) for t in tables}
    assert "unreadable" in caplog.text
    t = tables[1]
    token = zero.acquire(CF, t)
    _write_versions(zero, t, token, 1)
    location = table_location(t.database, t.table)
    assert os.path.exists(delta_vacuum.marker_path(zero.root, location))
    zero._drop(CF, t)
    assert not os.path.exists(delta_vacuum.marker_path(zero.root, location))
    assert [f.message for f in delta_vacuum.failures(zero.root)] == ["e0"]


def test_two_sinks_writing_in_turn_share_one_clock(tmp_path):
    """A capture run and its successor (or a bulk worker) are separate processes: the
    marker on disk, not memory, says when the table was last vacuumed."""
    root = str(tmp_path / "lake")
    first, second = DeltaSink(root, vacuum_retention_hours=0), None
    t = accounts()
    token = first.acquire(CF, t)
    ts = _write_versions(first, t, token, 3)
    _make_due(first, t)
    second = pickle.loads(pickle.dumps(first))
    _write_versions(second, t, token, 1, start=ts)
    assert _data_files(first, t) == _version_files(first, t)
    ts = _write_versions(first, t, token, 2, start=ts + 10)
    assert _data_files(first, t) > _version_files(first, t), "not due again so soon"


RETENTIONS = [
    ("", delta_vacuum.DEFAULT_RETENTION_HOURS),
    ("?vacuum_retention_hours=24", 24),
    ("?vacuum_retention_hours=0", 0),
    ("?vacuum_retention_hours=OFF", None),
    ("?compression=snappy&vacuum_retention_hours=off", None),
]


@pytest.mark.parametrize(("query", "hours"), RETENTIONS)
def test_the_retention_comes_from_the_uri_and_goes_back_into_it(tmp_path, query, hours):
    sink = open_sink(f"delta://{tmp_path}/lake{query}")
    assert sink.vacuum_retention_hours == hours
    assert open_sink(sink.uri) == sink
    assert pickle.loads(pickle.dumps(sink)) == sink


def test_a_negative_retention_is_refused(tmp_path):
    with pytest.raises(SinkError, match="negative"):
        DeltaSink(str(tmp_path), vacuum_retention_hours=-1)


def test_the_interval_comes_from_the_environment_when_set(zero, monkeypatch):
    t = accounts()
    token = zero.acquire(CF, t)
    monkeypatch.setenv(delta_vacuum.EVERY_ENV, "0")
    ts = _write_versions(zero, t, token, 3)  # every write after the first vacuums
    assert _data_files(zero, t) == _version_files(zero, t)
    version = DeltaTable(zero.path(t)).version()
    monkeypatch.setenv(delta_vacuum.EVERY_ENV, "ten minutes")
    with pytest.raises(SinkError, match="CDC_DAGSTER_VACUUM_EVERY_S='ten minutes' is not"):
        _write_versions(zero, t, token, 1, start=ts)
    assert DeltaTable(zero.path(t)).version() == version, "refused before writing"
    assert zero.committed(CF, t).committed_ts == ts


def test_a_vacuum_clock_that_cannot_be_kept_never_fails_the_write(zero, caplog):
    """The sink's own directory not writable as a directory (here a file where it goes):
    the writes land, each with a warning, and no vacuum runs."""
    t = accounts()
    meta = os.path.join(zero.root, META_DIR)
    os.makedirs(meta)
    with open(os.path.join(meta, "vacuum"), "w") as fh:
        fh.write("not a directory")
    token = zero.acquire(CF, t)
    with caplog.at_level(logging.WARNING, logger=delta_vacuum.__name__):
        ts = _write_versions(zero, t, token, 3)
    assert zero.committed(CF, t).committed_ts == ts
    assert caplog.text.count("vacuum of") == 3
    assert _data_files(zero, t) > _version_files(zero, t)


def test_the_syncpoint_cache_forgets_files_gone_from_its_root(tmp_path):
    """A syncpoint removed (past its retention) leaves the per-process parse cache at the
    next scan of its root; another root's entries stay."""
    roots = [str(tmp_path / "a"), str(tmp_path / "b")]
    for root in roots:
        for ts, version in ((100, 3), (200, 5)):
            path = syncpoint_path(root, CF, ts)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as fh:
                json.dump({"changefeed": CF, "ts": ts, "tables": {"7": {"version": version, "location": "bank/accounts"}}}, fh)  # fmt: skip
        assert delta_vacuum.pinned_versions(root, "bank/accounts") == [3, 5]
    os.unlink(syncpoint_path(roots[0], CF, 100))
    assert delta_vacuum.pinned_versions(roots[0], "bank/accounts") == [5]
    cached = {path for path, _ in delta_vacuum._PARSED}
    assert syncpoint_path(roots[0], CF, 100) not in cached
    assert {syncpoint_path(roots[0], CF, 200), syncpoint_path(roots[1], CF, 100)} <= cached

"""The change log: round trip, pruning, atomicity, resolved marks, schema history, GC, errors."""

from __future__ import annotations

import os
import re
import threading
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_dagster.upstream.changelog import (
    LOCK_NAME,
    ChangeLog,
    ChangeLogLockedError,
    ChangeLogWriter,
    ColumnSchema,
    CorruptChangeLogError,
    DdlOrderError,
    DdlRecord,
    MissingChangeLogFileError,
    ResolvedRegressionError,
    RowSchemaMismatchError,
    TableSchema,
    UnknownTableError,
    data_file_schema,
)
from scheduler_core.ddl import DDLKind
from scheduler_core.ts import compose

T0 = 1_699_999_980_000  # physical ms, at a minute boundary


def ts(ms: int, logical: int = 0) -> int:
    return compose(T0 + ms, logical)


def accounts(shards: int = 2, extra: tuple[ColumnSchema, ...] = ()) -> TableSchema:
    return TableSchema(
        7,
        "bank",
        "accounts",
        (
            ColumnSchema(1, "id", "int64", False),
            ColumnSchema(2, "balance", "decimal(18,2)", False, "0.00"),
            *extra,
        ),
        (1,),
        shards=shards,
    )


def create(commit_ts: int, schema: TableSchema) -> DdlRecord:
    return DdlRecord(
        commit_ts,
        DDLKind.CREATE_TABLE,
        "create_table",
        f"CREATE TABLE {schema.table}",
        creates=(schema.table_id,),
        tables={schema.table_id: schema},
    )


def add_note(commit_ts: int) -> DdlRecord:
    after = accounts(extra=(ColumnSchema(3, "note", "string", True, "x"),))
    return DdlRecord(
        commit_ts,
        DDLKind.ALTER_TABLE,
        "add_column",
        "ALTER TABLE accounts ADD COLUMN note varchar(20) DEFAULT 'x'",
        table_ids=(7,),
        tables={7: after},
    )


def rows(
    schema: TableSchema, version: int, changes: list[tuple[int, int, int, int | None]]
) -> pa.Table:
    """changes: (commit_ts, op, id, balance cents or None); deletes get the before image."""
    n = len(changes)
    cols: dict[str, pa.Array] = {
        "_commit_ts": pa.array([c[0] for c in changes], pa.int64()),
        "_seq": pa.array(range(n), pa.int32()),
        "_op": pa.array([c[1] for c in changes], pa.int8()),
        "_schema_version": pa.array([version] * n, pa.int64()),
        "c1": pa.array([None if c[1] == 3 else c[2] for c in changes], pa.int64()),
        "c2": pa.array(
            [None if c[3] is None else Decimal(c[3]) / 100 for c in changes],
            pa.decimal128(18, 2),
        ),
    }
    for col in schema.columns[2:]:
        cols[f"c{col.id}"] = pa.nulls(n, col.arrow)
    cols["b1"] = pa.array([c[2] if c[1] == 3 else None for c in changes], pa.int64())
    return pa.table(cols)


@pytest.fixture
def log(tmp_path: Path) -> tuple[ChangeLogWriter, ChangeLog]:
    w = ChangeLogWriter(tmp_path / "cl")
    w.write_ddl(create(ts(0), accounts()))
    return w, ChangeLog(tmp_path / "cl")


def test_rows_written_read_back_unchanged(log: tuple[ChangeLogWriter, ChangeLog]) -> None:
    w, r = log
    t = rows(accounts(), ts(0), [(ts(5), 1, 1, 1000), (ts(6), 2, 1, 900), (ts(7), 3, 1, None)])
    written = w.write_rows(7, 1, ts(0), t)
    files = r.data_files(7, 0, ts(10))
    assert [f.path for f in files] == [f.path for f in written]
    assert (files[0].first_ts, files[0].last_ts, files[0].shard) == (ts(5), ts(7), 1)
    back = r.read_data_file(files[0])
    assert back.schema == data_file_schema(accounts())
    assert back.to_pylist() == t.to_pylist()


def test_data_files_prunes_by_minute_dir_and_name(log: tuple[ChangeLogWriter, ChangeLog]) -> None:
    w, r = log
    s = accounts()
    a = w.write_rows(7, 0, ts(0), rows(s, ts(0), [(ts(10), 1, 1, 1), (ts(20), 1, 2, 1)]))
    b = w.write_rows(7, 0, ts(0), rows(s, ts(0), [(ts(30), 1, 3, 1)]))
    c = w.write_rows(7, 0, ts(0), rows(s, ts(0), [(ts(130_000), 1, 4, 1)]))
    assert r.data_files(7, ts(20), ts(130_000)) == b + c  # last_ts == after is out
    assert r.data_files(7, 0, ts(29)) == a
    assert r.data_files(7, ts(30), ts(129_999)) == []
    assert r.data_files(7, ts(100), ts(50)) == []
    assert len({Path(f.path).parent.name for f in a + c}) == 2  # minute dirs differ


def test_write_splits_rows_at_minute_boundaries(log: tuple[ChangeLogWriter, ChangeLog]) -> None:
    w, r = log
    t = rows(accounts(), ts(0), [(ts(59_999), 1, 1, 1), (ts(60_000), 1, 2, 1)])
    files = w.write_rows(7, 0, ts(0), t)
    assert [(f.first_ts, f.last_ts) for f in files] == [(ts(59_999),) * 2, (ts(60_000),) * 2]
    assert r.data_files(7, ts(59_999), ts(70_000)) == files[1:]


def test_no_temporary_file_is_left_visible(log: tuple[ChangeLogWriter, ChangeLog]) -> None:
    w, _ = log
    w.write_rows(7, 0, ts(0), rows(accounts(), ts(0), [(ts(1), 1, 1, 1)]))
    w.advance_resolved(7, 0, ts(2))
    w.advance_ddl_resolved(ts(2))
    names = [n for _, _, files in os.walk(w.root) for n in files if n != LOCK_NAME]
    assert names and not [n for n in names if n.startswith(".") or ".tmp-" in n]


def test_reader_ignores_dot_prefixed_temporary_files(
    log: tuple[ChangeLogWriter, ChangeLog],
) -> None:
    w, r = log
    (w.root / "tables/7/data/minute=0").mkdir(parents=True)
    (w.root / "tables/7/data/minute=0/.x.parquet.tmp-1").write_bytes(b"partial")
    (w.root / "ddl/.00000000000000000001-0000.json.tmp-1").write_text("{")
    assert r.data_files(7, 0, ts(100)) == []
    assert len(r.ddl_records()) == 1


def test_resolved_marks_never_go_back(log: tuple[ChangeLogWriter, ChangeLog]) -> None:
    w, r = log
    w.advance_resolved(7, 0, ts(10))
    w.advance_resolved(7, 0, ts(10))  # same ts: a no-op
    with pytest.raises(ResolvedRegressionError, match="go back"):
        w.advance_resolved(7, 0, ts(9))
    w.advance_ddl_resolved(ts(10))
    with pytest.raises(ResolvedRegressionError):
        w.advance_ddl_resolved(ts(5))
    assert r.shard_resolved_ts(7, 0) == ts(10)
    assert r.ddl_resolved_ts() == ts(10)


def test_table_resolved_is_min_over_shards_missing_is_zero(
    log: tuple[ChangeLogWriter, ChangeLog],
) -> None:
    w, r = log
    w.advance_resolved(7, 1, ts(10))
    assert r.table_resolved_ts(7) == 0
    w.advance_resolved(7, 0, ts(4))
    assert r.table_resolved_ts(7) == ts(4)
    with pytest.raises(UnknownTableError):
        r.table_resolved_ts(99)


def test_rows_at_or_below_resolved_are_refused(log: tuple[ChangeLogWriter, ChangeLog]) -> None:
    w, _ = log
    w.advance_resolved(7, 0, ts(10))
    with pytest.raises(RowSchemaMismatchError, match="resolved"):
        w.write_rows(7, 0, ts(0), rows(accounts(), ts(0), [(ts(10), 1, 1, 1)]))


def test_schema_history_answers_at_every_ts(log: tuple[ChangeLogWriter, ChangeLog]) -> None:
    w, r = log
    w.write_ddl(add_note(ts(100)))
    drop = DdlRecord(
        ts(200), DDLKind.DROP_TABLE, "drop_table", "DROP TABLE a", (7,), tables={7: None}
    )
    w.write_ddl(drop)
    assert r.schema_at(7, ts(0) - 1) is None
    assert r.schema_at(7, ts(0)) == accounts()
    assert r.schema_at(7, ts(99)) == accounts()
    assert [c.name for c in r.schema_at(7, ts(100)).columns] == ["id", "balance", "note"]
    assert r.schema_version_at(7, ts(150)) == ts(100)
    assert r.schema_at(7, ts(200)) is None and r.tables_at(ts(200)) == {}
    assert set(r.tables_at(ts(150))) == {7}
    assert [d.commit_ts for d in r.ddl_records(ts(0), ts(200))] == [ts(100), ts(200)]


def test_ddl_records_of_one_commit_ts_keep_their_order(tmp_path: Path) -> None:
    w = ChangeLogWriter(tmp_path)
    other = TableSchema(8, "bank", "b", accounts().columns, (1,))
    w.write_ddl(create(ts(0), accounts()))
    w.write_ddl(create(ts(0), other))
    w.write_ddl(create(ts(0), other))  # identical again: idempotent
    assert sorted(p.name for p in (tmp_path / "ddl").iterdir()) == [
        f"{ts(0):020d}-0000.json",
        f"{ts(0):020d}-0001.json",
    ]
    assert [d.creates for d in ChangeLog(tmp_path).ddl_records()] == [(7,), (8,)]
    assert ChangeLog(tmp_path).shards(8) == 1


def test_many_tables_created_at_once_are_written_as_one_by_one(tmp_path: Path) -> None:
    """``write_ddls`` (a changefeed's start: many tables' create records, their meta files
    by a few threads): the same files as ``write_ddl`` of each record in order; a batch out
    of commit-ts order, or below the log's DDL mark, is refused with nothing written."""
    tables = [TableSchema(tid, "bank", f"t{tid}", accounts().columns, (1,), shards=1 + tid % 3)
              for tid in range(10, 30)]  # fmt: skip
    batch = ChangeLogWriter(tmp_path / "batch")
    batch.write_ddls([create(ts(i), t) for i, t in enumerate(tables)])
    one_by_one = ChangeLogWriter(tmp_path / "one")
    for i, t in enumerate(tables):
        one_by_one.write_ddl(create(ts(i), t))

    def files(root: Path) -> dict[str, bytes]:
        # the writer lock names its holder and since when (seconds): not the log's content
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file() and p.name not in (".lock", LOCK_NAME)}  # fmt: skip

    assert files(tmp_path / "batch") == files(tmp_path / "one")
    batch.write_ddls([create(ts(i), t) for i, t in enumerate(tables)])  # again: idempotent
    assert files(tmp_path / "batch") == files(tmp_path / "one")
    log = ChangeLog(tmp_path / "batch")
    assert [log.shards(t.table_id) for t in tables] == [t.shards for t in tables]
    assert [d.creates for d in log.ddl_records()] == [(t.table_id,) for t in tables]

    fresh = ChangeLogWriter(tmp_path / "refused")
    with pytest.raises(DdlOrderError, match="commit-ts order"):
        fresh.write_ddls([create(ts(5), tables[0]), create(ts(4), tables[1])])
    fresh.advance_ddl_resolved(ts(10))
    with pytest.raises(DdlOrderError, match="resolved"):  # the first one, at the mark
        fresh.write_ddls([create(ts(10), tables[0]), create(ts(11), tables[1])])
    assert not list((tmp_path / "refused").rglob("meta.json"))  # none of a refused batch


def test_reader_sees_ddls_written_after_it_was_opened(
    log: tuple[ChangeLogWriter, ChangeLog],
) -> None:
    w, r = log
    assert len(r.ddl_records()) == 1
    w.write_ddl(add_note(ts(100)))
    assert len(r.ddl_records()) == 2 and r.schema_version_at(7, ts(100)) == ts(100)


def test_ddl_below_a_resolved_mark_or_written_rows_is_refused(
    log: tuple[ChangeLogWriter, ChangeLog],
) -> None:
    w, _ = log
    w.write_rows(7, 0, ts(0), rows(accounts(), ts(0), [(ts(50), 1, 1, 1)]))
    with pytest.raises(DdlOrderError, match="table 7"):
        w.write_ddl(add_note(ts(50)))
    w.advance_ddl_resolved(ts(60))
    with pytest.raises(DdlOrderError, match="resolved"):
        w.write_ddl(add_note(ts(60)))


def test_rows_spanning_a_ddl_are_refused(log: tuple[ChangeLogWriter, ChangeLog]) -> None:
    w, _ = log
    w.write_ddl(add_note(ts(100)))
    t = rows(accounts(), ts(0), [(ts(99), 1, 1, 1), (ts(100), 1, 2, 1)])
    with pytest.raises(RowSchemaMismatchError, match="schema version"):
        w.write_rows(7, 0, ts(0), t)


def test_rows_not_matching_schema_are_refused_naming_column(
    log: tuple[ChangeLogWriter, ChangeLog],
) -> None:
    w, _ = log
    t = rows(accounts(), ts(0), [(ts(1), 1, 1, 1)])
    bad_type = t.set_column(5, "c2", pa.array([1.5], pa.float64()))
    with pytest.raises(RowSchemaMismatchError, match=r"bank\.accounts.*c2 \('balance'\).*double"):
        w.write_rows(7, 0, ts(0), bad_type)
    with pytest.raises(RowSchemaMismatchError, match=r"c2 .* missing"):
        w.write_rows(7, 0, ts(0), t.drop_columns(["c2"]))
    with pytest.raises(RowSchemaMismatchError, match="unknown columns"):
        w.write_rows(7, 0, ts(0), t.append_column("c9", pa.array([1])))
    with pytest.raises(RowSchemaMismatchError, match="not nullable"):
        w.write_rows(7, 0, ts(0), rows(accounts(), ts(0), [(ts(1), 1, 1, None)]))
    with pytest.raises(RowSchemaMismatchError, match="out of range"):
        w.write_rows(7, 2, ts(0), t)
    with pytest.raises(RowSchemaMismatchError, match="schema version"):
        w.write_rows(7, 0, ts(1), t)


def test_gc_deletes_only_files_ending_at_or_below_safepoint(
    log: tuple[ChangeLogWriter, ChangeLog],
) -> None:
    w, r = log
    s = accounts()
    old = w.write_rows(7, 0, ts(0), rows(s, ts(0), [(ts(10), 1, 1, 1), (ts(20), 1, 2, 1)]))
    straddle = w.write_rows(7, 1, ts(0), rows(s, ts(0), [(ts(15), 1, 3, 1), (ts(25), 1, 4, 1)]))
    late = w.write_rows(7, 0, ts(0), rows(s, ts(0), [(ts(200_000), 1, 5, 1)]))
    w.advance_resolved(7, 0, ts(30))
    assert r.gc(ts(20)) == 1
    assert r.data_files(7, 0, ts(300_000)) == straddle + late
    assert not Path(old[0].path).exists()
    assert r.shard_resolved_ts(7, 0) == ts(30) and len(r.ddl_records()) == 1
    assert r.gc_safepoint() == ts(20) and r.gc(ts(5)) == 0 and r.gc_safepoint() == ts(20)


def test_corrupt_data_file_names_the_file(log: tuple[ChangeLogWriter, ChangeLog]) -> None:
    w, r = log
    (f,) = w.write_rows(7, 0, ts(0), rows(accounts(), ts(0), [(ts(1), 1, 1, 1)]))
    Path(f.path).write_bytes(b"not parquet")
    with pytest.raises(CorruptChangeLogError, match=re.escape(f.path)):
        r.read_data_file(f)
    Path(f.path).unlink()
    with pytest.raises(MissingChangeLogFileError, match="missing"):
        r.read_data_file(f)


def test_data_file_outside_its_name_range_is_corrupt(
    log: tuple[ChangeLogWriter, ChangeLog],
) -> None:
    w, r = log
    (f,) = w.write_rows(7, 0, ts(0), rows(accounts(), ts(0), [(ts(1), 1, 1, 1)]))
    lying = Path(f.path).with_name(f"{ts(2):020d}-{ts(3):020d}-s0-abcdef01.parquet")
    os.replace(f.path, lying)
    (g,) = r.data_files(7, 0, ts(5))
    with pytest.raises(CorruptChangeLogError, match="outside its name"):
        r.read_data_file(g)


def test_corrupt_ddl_record_or_format_is_a_typed_error(tmp_path: Path) -> None:
    w = ChangeLogWriter(tmp_path)
    w.write_ddl(create(ts(0), accounts()))
    (tmp_path / "ddl" / f"{ts(5):020d}-0000.json").write_text('{"commit_ts": 1')
    with pytest.raises(CorruptChangeLogError, match=f"{ts(5):020d}-0000.json"):
        ChangeLog(tmp_path).ddl_records()
    with pytest.raises(MissingChangeLogFileError, match="FORMAT"):
        ChangeLog(tmp_path / "nowhere")
    (tmp_path / "FORMAT").write_text('{"format": "other", "version": 1}')
    with pytest.raises(CorruptChangeLogError, match="format version 1"):
        ChangeLog(tmp_path)


def test_concurrent_reader_never_sees_a_partial_file(
    log: tuple[ChangeLogWriter, ChangeLog],
) -> None:
    w, r = log
    s = accounts()
    done = threading.Event()
    seen: list[int] = []

    def read_all() -> None:
        while not done.is_set():
            seen.extend(r.read_data_file(f).num_rows for f in r.data_files(7, 0, ts(1000)))

    reader = threading.Thread(target=read_all)
    reader.start()
    try:
        for i in range(1, 60):
            many = [(ts(i * 10), 1, k, 1) for k in range(500)]
            w.write_rows(7, i % 2, ts(0), rows(s, ts(0), many))
    finally:
        done.set()
        reader.join()
    assert seen and set(seen) == {500}


def test_second_writer_is_refused_naming_the_holder(log: tuple[ChangeLogWriter, ChangeLog]) -> None:
    w, _ = log
    with pytest.raises(ChangeLogLockedError, match=rf"pid={os.getpid()} host="):
        ChangeLogWriter(w.root)
    w.close()
    with ChangeLogWriter(w.root) as again:  # released by close()
        assert again.log.ddl_records()


def test_opening_a_writer_removes_a_killed_writers_temp_files_only(
    log: tuple[ChangeLogWriter, ChangeLog],
) -> None:
    w, r = log
    w.write_rows(7, 0, ts(0), rows(accounts(), ts(0), [(ts(1), 1, 1, 1)]))
    data = Path(r.data_files(7, 0, ts(1))[0].path)
    temps = [
        data.parent / f".{data.name}.tmp-{'a' * 32}",
        w.root / "ddl" / f".resolved.json.tmp-{'b' * 32}",
    ]
    for p in temps:
        p.write_bytes(b"partial")
    other = data.parent / ".not-ours.tmp-xyz"  # not a writer's temp name: left alone
    other.write_bytes(b"x")
    # A snapshot run (another process, not under the writer's lock) writing its plan or a
    # chunk as the puller's writer opens: its temp file is its own, left alone.
    reading = w.root / "snapshot" / "37" / "470751581114044416" / f".plan.json.tmp-{'c' * 32}"
    reading.parent.mkdir(parents=True)
    reading.write_bytes(b"being written")
    w.close()
    again = ChangeLogWriter(w.root)
    assert again.temp_files_removed == 2
    assert not any(p.exists() for p in temps) and other.exists() and data.exists()
    assert reading.exists()


def test_discard_above_drops_unresolved_rows_and_trims_a_straddling_file(
    log: tuple[ChangeLogWriter, ChangeLog],
) -> None:
    w, r = log
    w.write_rows(7, 0, ts(0), rows(accounts(), ts(0), [(ts(1), 1, 1, 1), (ts(5), 1, 2, 2)]))
    w.write_rows(7, 1, ts(0), rows(accounts(), ts(0), [(ts(3), 1, 3, 3)]))
    w.write_rows(7, 1, ts(0), rows(accounts(), ts(0), [(ts(8), 1, 4, 4)]))
    w.advance_resolved(7, 0, ts(2))
    with pytest.raises(ResolvedRegressionError, match="promised"):
        w.discard_above(ts(1))
    assert w.resolved_frontier() == ts(2)
    assert w.discard_above(ts(3)) == ts(8)
    kept = [r.read_data_file(f) for f in r.data_files(7, 0, ts(100))]
    assert sorted(x for t in kept for x in t["_commit_ts"].to_pylist()) == [ts(1), ts(3)]
    assert w.discard_above(ts(3)) == 0


def test_an_unreachable_writer_in_a_reference_cycle_does_not_keep_the_log(tmp_path: Path) -> None:
    w = ChangeLogWriter(tmp_path)
    w.cycle = w  # type: ignore[attr-defined]  # only the cycle collector frees it
    del w
    ChangeLogWriter(tmp_path).close()


def test_a_rows_file_adopted_at_one_ts_is_renamed_in_and_read_with_that_ts(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    schema = accounts(shards=1)
    with ChangeLogWriter(tmp_path / "log", fsync=False) as w:
        w.write_ddl(create(ts(1), schema))
        w.write_rows(7, 0, ts(1), rows(schema, ts(1), [(ts(5), 1, 1, 100)]))
        w.advance_resolved(7, 0, ts(2))
        chunk = rows(schema, ts(1), [(0, 1, 2, 200), (0, 1, 3, 300)]).drop_columns("_commit_ts")
        src = tmp_path / "chunk.parquet"
        pq.write_table(chunk, src)
        f = w.adopt_rows(7, 0, ts(3), src, "0123abcd")  # between the mark and the row at ts(5)
        assert not src.exists() and f.first_ts == f.last_ts == ts(3)
        with pytest.raises(RowSchemaMismatchError, match="at or below the shard's resolved"):
            pq.write_table(chunk, src)
            w.adopt_rows(7, 0, ts(2), src, "0123abcd")
        with pytest.raises(RowSchemaMismatchError, match="schema versions"):
            pq.write_table(
                chunk.set_column(2, "_schema_version", pa.array([9, 9], pa.int64())), src
            )
            w.adopt_rows(7, 0, ts(4), src, "0123abcd")
    log = ChangeLog(tmp_path / "log")
    got = [log.read_data_file(d) for d in log.data_files(7, 0, ts(9))]
    assert [t.column("_commit_ts").to_pylist() for t in got] == [[ts(3), ts(3)], [ts(5)]]
    assert got[0].column("c1").to_pylist() == [2, 3]

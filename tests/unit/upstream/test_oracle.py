"""The oracle: hand-computed replays, DDLs, the bank invariant, and reader-independent fingerprints."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_dagster.upstream.changelog import (
    ChangeLogWriter,
    ColumnSchema,
    DdlRecord,
    TableSchema,
    data_file_schema,
)
from cdc_dagster.upstream.generator import Workload, WorkloadConfig
from cdc_dagster.upstream.oracle import Oracle, OracleError, fingerprint
from scheduler_core.ddl import DDLKind
from scheduler_core.ts import compose

T0 = 1_699_999_980_000
COLS = (ColumnSchema(1, "id", "int64", False), ColumnSchema(2, "name", "string"))
ITEMS = TableSchema(3, "shop", "items", COLS, (1,))


def ts(ms: int) -> int:
    return compose(T0 + ms)


def alter(at: int, action: str, schema: TableSchema, kind: DDLKind = DDLKind.ALTER_TABLE):
    return DdlRecord(at, kind, action, action, (3,), tables={3: schema})


def write(w: ChangeLogWriter, version: int, schema: TableSchema, changes: list[tuple]) -> None:
    """changes: (ms, op, after row dict by column id or None, before id or None)."""
    data = {f.name: [] for f in data_file_schema(schema)}
    for seq, (ms, op, after, before) in enumerate(changes):
        data["_commit_ts"].append(ts(ms))
        data["_seq"].append(seq)
        data["_op"].append(op)
        data["_schema_version"].append(version)
        for c in schema.columns:
            data[f"c{c.id}"].append(None if after is None else after.get(c.id))
        data["b1"].append(before)
    w.write_rows(3, 0, version, pa.Table.from_pydict(data, schema=data_file_schema(schema)))


@pytest.fixture
def hand(tmp_path: Path) -> Oracle:
    """insert 1,2,3 @10; update 2, re-key 3->4 @20; delete 1 @30; add column @40;
    insert 5 @50; rename column @60; truncate @70; insert 6 @80; drop @90."""
    w = ChangeLogWriter(tmp_path, fsync=False)
    create = DdlRecord(
        ts(0), DDLKind.CREATE_TABLE, "create_table", "c", creates=(3,), tables={3: ITEMS}
    )
    w.write_ddl(create)
    write(w, ts(0), ITEMS, [(10, 1, {1: 1, 2: "a"}, None), (10, 1, {1: 2, 2: "b"}, None)])
    write(w, ts(0), ITEMS, [(10, 1, {1: 3, 2: "c"}, None), (20, 2, {1: 2, 2: "B"}, None)])
    write(w, ts(0), ITEMS, [(20, 2, {1: 4, 2: "c"}, 3), (30, 3, None, 1)])
    added = TableSchema(
        3, "shop", "items", (*COLS, ColumnSchema(3, "qty", "int32", True, "7")), (1,)
    )
    w.write_ddl(alter(ts(40), "add_column", added))
    write(w, ts(40), added, [(50, 1, {1: 5, 2: "e", 3: 1}, None)])
    renamed = TableSchema(
        3, "shop", "items", (*COLS, ColumnSchema(3, "n", "int32", True, "7")), (1,)
    )
    w.write_ddl(alter(ts(60), "rename_column", renamed))
    w.write_ddl(alter(ts(70), "truncate_table", renamed, DDLKind.TRUNCATE_TABLE))
    write(w, ts(70), renamed, [(80, 1, {1: 6, 2: "f", 3: None}, None)])
    w.write_ddl(DdlRecord(ts(90), DDLKind.DROP_TABLE, "drop_table", "d", (3,), tables={3: None}))
    w.advance_resolved(3, 0, ts(100))
    return Oracle(tmp_path)


def test_replay_matches_hand_computed_rows_at_each_ts(hand: Oracle) -> None:
    def at(ms: int) -> list[dict]:
        return hand.table_at(3, ts(ms)).to_pylist()

    assert at(9) == []
    assert at(10) == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]
    assert at(20) == [{"id": 1, "name": "a"}, {"id": 2, "name": "B"}, {"id": 4, "name": "c"}]
    assert at(30) == [{"id": 2, "name": "B"}, {"id": 4, "name": "c"}]
    assert at(40) == [{"id": 2, "name": "B", "qty": 7}, {"id": 4, "name": "c", "qty": 7}]
    assert at(59)[-1] == {"id": 5, "name": "e", "qty": 1}
    assert at(60) == [
        {"id": i, "name": n, "n": q} for i, n, q in [(2, "B", 7), (4, "c", 7), (5, "e", 1)]
    ]
    assert at(70) == []
    assert at(80) == [{"id": 6, "name": "f", "n": None}]
    assert at(25) == [{"id": 1, "name": "a"}, {"id": 2, "name": "B"}, {"id": 4, "name": "c"}]


def test_dropped_table_is_an_oracle_error(hand: Oracle) -> None:
    with pytest.raises(OracleError, match="does not exist"):
        hand.table_at(3, ts(90))


def test_ts_above_the_resolved_ts_is_an_oracle_error(tmp_path: Path) -> None:
    w = ChangeLogWriter(tmp_path, fsync=False)
    w.write_ddl(
        DdlRecord(ts(0), DDLKind.CREATE_TABLE, "create_table", "c", creates=(3,), tables={3: ITEMS})
    )
    w.advance_resolved(3, 0, ts(5))
    oracle = Oracle(tmp_path)
    with pytest.raises(OracleError, match="resolved only"):
        oracle.table_at(3, ts(6))
    assert oracle.table_at(3, ts(6), check_resolved=False).num_rows == 0


def test_mounted_form_has_names_and_arrow_types_of_the_schema_at_ts(hand: Oracle) -> None:
    table = hand.table_at(3, ts(65))
    assert table.schema == pa.schema(
        [pa.field("id", pa.int64(), False), ("name", pa.string()), ("n", pa.int32())]
    )


def test_oracle_equals_the_generator_model_for_every_table(tmp_path: Path) -> None:
    cfg = WorkloadConfig(
        seed=3, bank_tables=2, rows_per_table=30, txns_per_step=200, ddl_every=6, fsync=False
    )
    w = Workload(cfg, tmp_path)
    for _ in range(2):
        w.step()
        w.advance_resolved()
    oracle, last = Oracle(tmp_path), w.last_commit_ts
    for tid in w.tables:
        s = w.schema(tid)
        rows = list(w.table_rows(tid).values())
        arrays = [pa.array([r.get(c.id) for r in rows], c.arrow) for c in s.columns]
        model = pa.Table.from_arrays(arrays, schema=s.arrow_schema())
        assert fingerprint(oracle.table_at(tid, last)) == fingerprint(model), s.table


def test_bank_total_from_the_oracle_is_constant_at_every_ts(tmp_path: Path) -> None:
    cfg = WorkloadConfig(
        seed=5, bank_tables=3, rows_per_table=10, txns_per_step=60, ddl_every=8, fsync=False
    )
    w = Workload(cfg, tmp_path)
    w.step()
    w.advance_resolved()
    oracle = Oracle(tmp_path)
    first = min(oracle.log.schema_version_at(t, w.last_commit_ts) for t in w.bank_table_ids)
    start = first + 10 * (1 << 18)  # after the initial inserts
    every_ts = range(start, w.last_commit_ts + 1, 1 << 18)  # one per ms: every commit ts
    totals = {oracle.bank_total_at(t, w.bank_table_ids) for t in every_ts}
    assert len(every_ts) > 50 and totals == {Decimal("30000.00")}


WIDE = pa.table(
    {
        "id": pa.array([2, 1], pa.int64()),
        "dec": pa.array([Decimal("1.50"), Decimal("-0.00")], pa.decimal128(18, 2)),
        "f": pa.array([-0.0, 1e300], pa.float64()),
        "s": pa.array(["it's `x`; ü", None], pa.string()),
        "b": pa.array([b"\x00\xff", b""], pa.binary()),
        "d": pa.array([dt.date(1900, 1, 1), None], pa.date32()),
        "t": pa.array([dt.datetime(2020, 1, 1, 1, 2, 3, 4), None], pa.timestamp("us")),
        "tz": pa.array([dt.datetime(2020, 1, 1, tzinfo=dt.UTC), None], pa.timestamp("us", "UTC")),
    }
)


def test_fingerprint_ignores_row_and_column_order() -> None:
    shuffled = WIDE.take([1, 0]).select(list(reversed(WIDE.column_names)))
    assert fingerprint(shuffled) == fingerprint(WIDE)


def test_fingerprint_keeps_every_digit_of_wide_decimals() -> None:
    def one(text: str) -> str:
        return fingerprint(pa.table({"d": pa.array([Decimal(text)], pa.decimal128(38, 10))}))

    assert one("1234567890123456789.0123456789") != one("1234567890123456789.0123456788")


def test_fingerprint_changes_with_any_value_or_name() -> None:
    changed = WIDE.set_column(3, "s", pa.array(["it's `x`; u", None]))
    renamed = WIDE.rename_columns([*WIDE.column_names[:-1], "tz2"])
    assert len({fingerprint(WIDE), fingerprint(changed), fingerprint(renamed)}) == 3
    assert fingerprint(pa.concat_tables([WIDE, WIDE])) != fingerprint(WIDE)


def test_fingerprint_normalises_types_other_readers_return() -> None:
    other = WIDE.set_column(1, "dec", pa.array([Decimal("1.5"), Decimal(0)], pa.decimal128(38, 10)))
    other = other.set_column(3, "s", other["s"].cast(pa.large_string()))
    other = other.set_column(7, "tz", WIDE["tz"].cast(pa.timestamp("us", "Europe/Paris")))
    other = other.set_column(6, "t", WIDE["t"].cast(pa.timestamp("ns")))
    assert fingerprint(other) == fingerprint(WIDE)


def test_fingerprint_survives_parquet_and_duckdb_round_trips(tmp_path: Path) -> None:
    pq.write_table(WIDE, tmp_path / "w.parquet")
    back = pq.read_table(tmp_path / "w.parquet")
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    query = f"SELECT * FROM read_parquet('{tmp_path / 'w.parquet'}')"
    via_duckdb = con.sql(query).to_arrow_table()
    assert fingerprint(back) == fingerprint(WIDE) == fingerprint(via_duckdb)


def test_an_unresolved_answer_is_not_cached(tmp_path: Path) -> None:
    w = ChangeLogWriter(tmp_path, fsync=False)
    w.write_ddl(
        DdlRecord(ts(0), DDLKind.CREATE_TABLE, "create_table", "c", creates=(3,), tables={3: ITEMS})
    )
    write(w, ts(0), ITEMS, [(10, 1, {1: 1, 2: "a"}, None)])
    oracle = Oracle(tmp_path)
    assert oracle.table_at(3, ts(20), check_resolved=False).num_rows == 1
    write(w, ts(0), ITEMS, [(15, 1, {1: 2, 2: "b"}, None)])
    w.advance_resolved(3, 0, ts(20))
    assert oracle.table_at(3, ts(20))["id"].to_pylist() == [1, 2]

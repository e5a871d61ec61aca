"""DeltaSink.apply_ddl: every action, each applied exactly once (real deltalake)."""

from __future__ import annotations

import dataclasses
import os
from decimal import Decimal

import pytest
from conftest import CF, accounts, batch
from deltalake import DeltaTable

from cdc_dagster.schema import ColumnSchema, DdlRecord, TableSchema
from cdc_dagster.sinks.base import Committed, FencedError, SinkDDLError, SinkSchemaError
from cdc_dagster.sinks.delta import read_table_at
from scheduler_core.ddl import DDLKind

KINDS = {
    "create_table": DDLKind.CREATE_TABLE,
    "drop_table": DDLKind.DROP_TABLE,
    "truncate_table": DDLKind.TRUNCATE_TABLE,
    "rename_table": DDLKind.RENAME_TABLES,
}


def ddl(action: str, ts: int, before: dict, after: dict, query: str = "") -> DdlRecord:
    """A DDL record: ``before``/``after`` map table id -> schema (None: absent)."""
    creates = tuple(t for t in after if before.get(t) is None and after[t] is not None)
    drops = tuple(t for t in before if before[t] is not None and after.get(t) is None)
    touched = tuple(t for t in before if before[t] is not None)
    return DdlRecord(
        commit_ts=ts,
        kind=KINDS.get(action, DDLKind.ALTER_TABLE),
        action=action,
        query=query or f"-- {action}",
        table_ids=touched,
        creates=creates,
        drops=drops,
        tables=after,
    )


def apply(sink, action, ts, before: dict, after: dict) -> None:
    sink.apply_ddl(CF, ddl(action, ts, before, after), before)


def version(sink, t) -> int:
    return DeltaTable(sink.path(t)).version()


def with_columns(t: TableSchema, *cols: ColumnSchema) -> TableSchema:
    return dataclasses.replace(t, columns=tuple(cols))


@pytest.fixture
def loaded(sink):
    """accounts with rows 1, 2 at committed ts 10; returns (table, token)."""
    t = accounts()
    token = sink.acquire(CF, t)
    rows = [
        {"id": 1, "balance": Decimal("1.00"), "note": "a"},
        {"id": 2, "balance": Decimal("2.00"), "note": None},
    ]
    sink.write(CF, t, batch(t, rows), 0, 10, token)
    return t, token


def test_create_table_makes_an_empty_table_once(sink):
    t = accounts()
    apply(sink, "create_table", 100, {}, {7: t})
    v = version(sink, t)
    apply(sink, "create_table", 100, {}, {7: t})
    assert version(sink, t) == v
    assert read_table_at(sink.root, t).num_rows == 0
    assert sink.committed(CF, t) == Committed(0, 0)
    assert sink.acquire(CF, t) == 1


def test_create_table_after_an_acquire_created_it_records_the_ddl(sink):
    t = accounts()
    sink.acquire(CF, t)
    apply(sink, "create_table", 100, {}, {7: t})
    v = version(sink, t)
    apply(sink, "create_table", 100, {}, {7: t})
    assert version(sink, t) == v


def test_create_table_where_another_table_id_lives_is_refused(sink):
    sink.acquire(CF, accounts(table_id=8))
    with pytest.raises(SinkDDLError, match="belongs to table id 8") as e:
        apply(sink, "create_table", 100, {}, {7: accounts()})
    assert "bank.accounts" in str(e.value)


def test_add_column_with_default_fills_existing_rows_exactly_once(sink, loaded):
    t, token = loaded
    after = with_columns(t, *t.columns, ColumnSchema(4, "flag", "int32", False, "5"))
    apply(sink, "add_column", 20, {7: t}, {7: after})
    got = {r["id"]: r["flag"] for r in read_table_at(sink.root, after).to_pylist()}
    assert got == {1: 5, 2: 5}
    sink.write(
        CF, after, batch(after, [{"id": 3, "balance": Decimal("3"), "flag": 9}]), 10, 30, token
    )
    v = version(sink, after)
    apply(sink, "add_column", 20, {7: t}, {7: after})  # replay: skipped
    assert version(sink, after) == v
    got = {r["id"]: r["flag"] for r in read_table_at(sink.root, after).to_pylist()}
    assert got == {1: 5, 2: 5, 3: 9}
    assert sink.committed(CF, after) == Committed(30, token)


@pytest.mark.parametrize(
    "col, expected",
    [
        (ColumnSchema(4, "d", "date", True, "2024-02-29"), "2024-02-29"),
        (
            ColumnSchema(4, "d", "datetime", True, "2024-02-29 10:11:12.5"),
            "2024-02-29 10:11:12.500000",
        ),
        (ColumnSchema(4, "d", "decimal(50,2)", True, "12.34"), "12.34"),
        (ColumnSchema(4, "d", "binary", True, "aGk="), "b'hi'"),
        (ColumnSchema(4, "d", "bool", True, "1"), "True"),
        (ColumnSchema(4, "d", "time", True, "-01:00:00"), str(-3600 * 10**6)),
        (ColumnSchema(4, "d", "string", True, None), "None"),
    ],
)
def test_add_column_default_of_each_type(sink, loaded, col, expected):
    t, _ = loaded
    after = with_columns(t, *t.columns, col)
    apply(sink, "add_column", 20, {7: t}, {7: after})
    values = {str(r["d"]) for r in read_table_at(sink.root, after).to_pylist()}
    assert values == {expected}


def test_add_column_with_a_bad_default_is_a_ddl_error_naming_table_and_statement(sink, loaded):
    t, _ = loaded
    after = with_columns(t, *t.columns, ColumnSchema(4, "n", "int32", True, "abc"))
    rec = ddl("add_column", 20, {7: t}, {7: after}, "ALTER TABLE `bank`.`accounts` ADD n int")
    v = version(sink, t)
    with pytest.raises(
        SinkDDLError, match=r"bank\.accounts \(id 7\).*ADD n int.*'abc'.*run the DDL again"
    ):
        sink.apply_ddl(CF, rec, {7: t})
    assert version(sink, t) == v


def test_drop_column_once(sink, loaded):
    t, token = loaded
    after = with_columns(t, *t.columns[:2])
    apply(sink, "drop_column", 20, {7: t}, {7: after})
    v = version(sink, after)
    apply(sink, "drop_column", 20, {7: t}, {7: after})
    assert version(sink, after) == v
    assert read_table_at(sink.root, after).to_pylist() == [
        {"id": 1, "balance": Decimal("1.00")},
        {"id": 2, "balance": Decimal("2.00")},
    ]
    with pytest.raises(SinkSchemaError, match="note"):  # a batch of the old schema no longer fits
        sink.write(CF, t, batch(t, [{"id": 5, "balance": Decimal("1")}]), 10, 30, token)


def test_rename_column_keeps_values_once(sink, loaded):
    t, token = loaded
    after = with_columns(t, *t.columns[:2], ColumnSchema(3, "remark ☃", "string"))
    apply(sink, "rename_column", 20, {7: t}, {7: after})
    v = version(sink, after)
    apply(sink, "rename_column", 20, {7: t}, {7: after})
    assert version(sink, after) == v
    got = read_table_at(sink.root, after)
    assert got.column_names == ["id", "balance", "remark ☃"]
    assert got.column("remark ☃").to_pylist() == ["a", None]
    sink.write(
        CF,
        after,
        batch(after, [{"id": 1, "balance": Decimal("1"), "remark ☃": "z"}]),
        10,
        20,
        token,
    )
    got = {r["id"]: r["remark ☃"] for r in read_table_at(sink.root, after).to_pylist()}
    assert got == {1: "z", 2: None}


def test_modify_column_widens_the_type_once(sink, loaded):
    t, _ = loaded
    after = with_columns(
        t, t.columns[0], ColumnSchema(2, "balance", "decimal(30,4)", False), t.columns[2]
    )
    apply(sink, "modify_column", 20, {7: t}, {7: after})
    v = version(sink, after)
    apply(sink, "modify_column", 20, {7: t}, {7: after})
    assert version(sink, after) == v
    got = read_table_at(sink.root, after)
    assert str(got.schema.field("balance").type) == "decimal128(30, 4)"
    assert got.column("balance").to_pylist() == [Decimal("1.0000"), Decimal("2.0000")]


def test_modify_column_that_existing_values_do_not_fit_is_a_ddl_error(sink, loaded):
    t, _ = loaded
    after = with_columns(t, t.columns[0], t.columns[1], ColumnSchema(3, "note", "int32"))
    v = version(sink, t)
    with pytest.raises(SinkDDLError, match=r"column 'note'.*int32"):
        apply(sink, "modify_column", 20, {7: t}, {7: after})
    assert version(sink, t) == v


@pytest.mark.parametrize("action", ["add_index", "drop_index"])
def test_index_ddl_is_a_recorded_no_op(sink, loaded, action):
    t, _ = loaded
    v = version(sink, t)
    apply(sink, action, 20, {7: t}, {7: t})
    apply(sink, action, 20, {7: t}, {7: t})
    assert version(sink, t) == v + 1
    assert read_table_at(sink.root, t).num_rows == 2


def test_truncate_empties_the_table_once(sink, loaded):
    t, token = loaded
    apply(sink, "truncate_table", 20, {7: t}, {7: t})
    assert read_table_at(sink.root, t).num_rows == 0
    sink.write(CF, t, batch(t, [{"id": 9, "balance": Decimal("9")}]), 10, 30, token)
    apply(sink, "truncate_table", 20, {7: t}, {7: t})  # replay must not empty it again
    assert read_table_at(sink.root, t).column("id").to_pylist() == [9]
    assert sink.committed(CF, t) == Committed(30, token)


def test_drop_table_once_and_fences_late_writers(sink, loaded):
    t, token = loaded
    apply(sink, "drop_table", 20, {7: t}, {7: None})
    assert not os.path.exists(sink.path(t))
    apply(sink, "drop_table", 20, {7: t}, {7: None})
    with pytest.raises(FencedError):
        sink.write(CF, t, batch(t, [{"id": 5, "balance": Decimal("1")}]), 10, 20, token)
    assert sink.committed(CF, t) == Committed(0, 0)


def test_drop_table_leaves_a_new_table_of_the_same_name_alone(sink, loaded):
    t, _ = loaded
    apply(sink, "drop_table", 20, {7: t}, {7: None})
    new = accounts(table_id=8)
    apply(sink, "create_table", 30, {}, {8: new})
    apply(sink, "drop_table", 20, {7: t}, {7: None})  # a late replay of the old drop
    assert os.path.isdir(sink.path(new))


def test_rename_table_moves_it_once_with_checkpoint_and_token(sink, loaded):
    t, token = loaded
    after = dataclasses.replace(t, database="bank 2", table="accounts_new")
    apply(sink, "rename_table", 20, {7: t}, {7: after})
    v = version(sink, after)
    apply(sink, "rename_table", 20, {7: t}, {7: after})
    assert version(sink, after) == v
    assert not os.path.exists(sink.path(t))
    assert read_table_at(sink.root, after).num_rows == 2
    assert sink.committed(CF, after) == Committed(10, token)
    assert DeltaTable(sink.path(after)).metadata().name == "bank 2.accounts_new"


def test_swap_rename_of_two_tables_in_one_ddl(sink):
    a, b = accounts(table="a", table_id=1), accounts(table="b", table_id=2)
    for t in (a, b):
        tok = sink.acquire(CF, t)
        sink.write(CF, t, batch(t, [{"id": t.table_id, "balance": Decimal("1")}]), 0, 10, tok)
    a2, b2 = dataclasses.replace(a, table="b"), dataclasses.replace(b, table="a")
    for _ in range(2):
        apply(sink, "rename_table", 20, {1: a, 2: b}, {1: a2, 2: b2})
    assert read_table_at(sink.root, a2).column("id").to_pylist() == [1]  # now at "b"
    assert read_table_at(sink.root, b2).column("id").to_pylist() == [2]  # now at "a"


def test_rename_interrupted_after_moving_aside_completes_on_replay(sink, loaded):
    t, _ = loaded
    after = dataclasses.replace(t, table="moved")
    stage = os.path.join(sink.root, "_cdc_dagster", "renaming", "cf-1", "20")
    os.makedirs(stage)
    os.rename(sink.path(t), os.path.join(stage, "7"))  # the crash left it here
    apply(sink, "rename_table", 20, {7: t}, {7: after})
    assert read_table_at(sink.root, after).num_rows == 2


def test_rename_onto_an_existing_table_is_refused(sink, loaded):
    t, _ = loaded
    other = accounts(table="other", table_id=9)
    sink.acquire(CF, other)
    with pytest.raises(SinkDDLError, match=r"is taken.*move the other table away"):
        apply(sink, "rename_table", 20, {7: t}, {7: dataclasses.replace(t, table="other")})


def test_alter_of_a_table_missing_downstream_is_a_ddl_error(sink):
    t = accounts()
    after = with_columns(t, *t.columns[:2])
    with pytest.raises(SinkDDLError, match="missing downstream"):
        apply(sink, "drop_column", 20, {7: t}, {7: after})


def test_ddl_racing_a_writer_never_loses_either(sink, loaded, monkeypatch):
    # the DDL commit carries the fence id: a write landing in between makes it re-read
    import cdc_dagster.sinks.delta as delta_mod

    t, token = loaded
    after = with_columns(t, *t.columns, ColumnSchema(4, "flag", "int32", True, "1"))
    real = delta_mod.evolve
    done = []

    def evolve_then_a_write_lands(*args):
        if not done:
            done.append(
                sink.write(CF, t, batch(t, [{"id": 3, "balance": Decimal("3")}]), 10, 20, token)
            )
        return real(*args)

    monkeypatch.setattr(delta_mod, "evolve", evolve_then_a_write_lands)
    apply(sink, "add_column", 25, {7: t}, {7: after})
    got = {r["id"]: r["flag"] for r in read_table_at(sink.root, after).to_pylist()}
    assert got == {1: 1, 2: 1, 3: 1}


def test_drop_schema_drops_its_tables_and_directory(sink, loaded):
    t, _ = loaded
    other = accounts(table="other", table_id=9)
    sink.acquire(CF, other)
    rec = DdlRecord(
        commit_ts=20,
        kind=DDLKind.DROP_SCHEMA,
        action="drop_schema",
        query="DROP DATABASE `bank`",
        table_ids=(7, 9),
        drops=(7, 9),
        schema="bank",
        tables={7: None, 9: None},
    )
    for _ in range(2):
        sink.apply_ddl(CF, rec, {7: t, 9: other})
    assert not os.path.exists(os.path.join(sink.root, "bank"))


def test_create_schema_touches_nothing(sink):
    rec = DdlRecord(20, DDLKind.CREATE_SCHEMA, "create_schema", "CREATE DATABASE x", schema="x")
    sink.apply_ddl(CF, rec, {})
    assert not os.path.exists(os.path.join(sink.root, "x"))


def test_a_ddl_that_rewrites_the_table_writes_the_sinks_codec(tmp_path):
    """ADD COLUMN with a default rewrites every file: in the sink's codec, not delta-rs's."""
    import pyarrow.parquet as pq

    from cdc_dagster.sinks.delta import DeltaSink, local_path

    sink = DeltaSink(str(tmp_path / "lake"), compression="uncompressed")
    t = accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("1")}]), 0, 10, token)
    after = with_columns(t, *t.columns, ColumnSchema(4, "flag", "int32", False, "5"))
    apply(sink, "add_column", 20, {7: t}, {7: after})
    files = DeltaTable(sink.path(after)).file_uris()
    meta = [pq.ParquetFile(local_path(f)).metadata for f in files]
    assert {m.row_group(0).column(i).compression for m in meta for i in range(4)} == {
        "UNCOMPRESSED"
    }
    assert read_table_at(sink.root, after).column("flag").to_pylist() == [5]

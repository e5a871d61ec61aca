"""DDL statements -> ParsedDDL (sqlglot AST), the TS allocator and the type map."""

from __future__ import annotations

import pytest

from cdc_dagster.mysql.ddl import UnsupportedDDLError, is_ignored, parse_ddl
from cdc_dagster.mysql.state import SLOTS, TsAllocator
from cdc_dagster.mysql.types import default_text, logical_type
from scheduler_core.ts import compose, split

CASES = [
    ("ALTER TABLE `s`.t ADD COLUMN n varchar(20) DEFAULT 'x' AFTER id", "add_column", [("s", "t")]),
    ("ALTER TABLE t DROP COLUMN a", "drop_column", [("d", "t")]),
    ("ALTER TABLE t MODIFY COLUMN a bigint", "modify_column", [("d", "t")]),
    ("ALTER TABLE t ADD INDEX ix (a)", "add_index", [("d", "t")]),
    ("ALTER TABLE t DROP INDEX ix", "drop_index", [("d", "t")]),
    ("CREATE INDEX ix ON t (a)", "add_index", [("d", "t")]),
    ("DROP INDEX ix ON t", "drop_index", [("d", "t")]),
    ("TRUNCATE TABLE t", "truncate_table", [("d", "t")]),
    ("DROP TABLE IF EXISTS a, x.b", "drop_table", [("d", "a"), ("x", "b")]),
]


@pytest.mark.parametrize(("query", "action", "tables"), CASES)
def test_alter_like_statements_name_their_action_and_tables(query, action, tables):
    p = parse_ddl(query, "d")
    assert (p.action, list(p.tables)) == (action, tables)


def test_rename_column_and_change_column_carry_the_old_name():
    assert parse_ddl("ALTER TABLE t RENAME COLUMN a TO b", "d").column_renames == {"a": "b"}
    assert parse_ddl("ALTER TABLE t CHANGE COLUMN a b int", "d").column_renames == {"a": "b"}


def test_rename_table_command_is_split_with_the_tokenizer():
    p = parse_ddl("RENAME TABLE a TO b, `c`.`d;e` TO e.f", "db")
    assert p.renames == ((("db", "a"), ("db", "b")), (("c", "d;e"), ("e", "f")))
    assert parse_ddl("ALTER TABLE t RENAME TO u", "d").renames == ((("d", "t"), ("d", "u")),)


def test_create_and_schema_statements():
    assert parse_ddl("CREATE TABLE x.y (a int primary key)", None).creates == (("x", "y"),)
    assert parse_ddl("CREATE DATABASE d", None).schema == "d"
    assert parse_ddl("DROP DATABASE d", None).action == "drop_schema"


def test_unsupported_statements_raise_with_the_query():
    with pytest.raises(UnsupportedDDLError, match="PARTITION"):
        parse_ddl("ALTER TABLE t PARTITION BY HASH(id) PARTITIONS 2", "d")
    with pytest.raises(UnsupportedDDLError, match="no database"):
        parse_ddl("TRUNCATE TABLE t", None)


def test_ignored_statements():
    assert is_ignored("GRANT ALL ON *.* TO x") and is_ignored("/* c */ CREATE USER u")
    assert not is_ignored("ALTER TABLE t ADD COLUMN a int")


def test_ts_allocator_strictly_increases_never_goes_behind_and_leaves_slots_below_each_ts():
    a = TsAllocator(0)
    t1, t2 = a.issue(100.0), a.issue(100.0)
    assert split(t1) == (100_000, 0) and split(t2) == (100_000, SLOTS)
    assert a.issue(99.0) == t2 + SLOTS  # an older event time never goes back
    assert a.issue(101.0) == compose(101_000)
    assert TsAllocator(t1 + 1).issue(100.0) == t2  # from any last TS: the next multiple


def test_type_map_edges():
    assert logical_type("bigint", "bigint(20) unsigned") == "uint64"
    assert logical_type("decimal", "decimal(65,30)") == "decimal(65,30)"
    assert logical_type("bit", "bit(64)") == "uint64" and logical_type("bit", "bit(3)") == "int64"
    assert logical_type("enum", "enum('a','b')") == "string"
    assert default_text("string", "'it''s'") == "it's"
    assert default_text("datetime", "current_timestamp()") is None
    assert default_text("time", "'-01:00:00.5'") == str(-3_600_500_000)


@pytest.mark.parametrize(
    ("query", "columns", "indexes"),
    [
        (
            "ALTER TABLE t ADD COLUMN IF NOT EXISTS y int NOT NULL DEFAULT 3",
            ["id", "x", "y"],
            ["a"],
        ),
        ("ALTER TABLE t ADD INDEX IF NOT EXISTS ix (x)", ["id", "x"], ["a", "ix"]),
        ("ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4", ["id", "x"], ["a"]),
        ("ALTER TABLE t RENAME INDEX a TO b", ["id", "x"], ["b"]),
        ("ALTER TABLE t DROP FOREIGN KEY fk", ["id", "x"], ["a"]),
        ("ALTER TABLE t FORCE", ["id", "x"], ["a"]),
        ("ALTER TABLE t ALGORITHM=INPLACE, DROP INDEX IF EXISTS a", ["id", "x"], []),
        ("ALTER TABLE t CHANGE x x2 bigint, ADD UNIQUE KEY u (x2)", ["id", "x2"], ["a", "u"]),
    ],
)
def test_alter_statements_evolve_the_schema_from_the_ast(query, columns, indexes):
    from cdc_dagster.mysql.catalog import IdRegistry
    from cdc_dagster.mysql.evolve import altered_schema
    from cdc_dagster.schema import ColumnSchema, IndexSchema, TableSchema

    before = TableSchema(1, "d", "t", (ColumnSchema(1, "id", "int64", False),
                         ColumnSchema(2, "x", "int32")), (1,), (IndexSchema("a", (2,)),))  # fmt: skip
    parse_ddl(query, "d")
    after = altered_schema(query, before, IdRegistry(2, {1: 3}), False, True)
    assert [c.name for c in after.columns] == columns
    assert [i.name for i in after.indexes] == indexes
    assert after.columns[1].id == 2 or columns[-1] == "y"  # the renamed column keeps its id


def test_create_or_replace_is_flagged():
    assert parse_ddl("CREATE OR REPLACE TABLE t (id int primary key)", "d").replace
    assert not parse_ddl("CREATE TABLE IF NOT EXISTS t (id int primary key)", "d").replace

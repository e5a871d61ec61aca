"""PostgreSQL DDL generated from schema diffs: quoting, type map, index names, each action."""

from __future__ import annotations

import pytest

from cdc_dagster.schema import ColumnSchema, DdlRecord, IndexSchema, TableSchema
from cdc_dagster.sinks import pg_ddl
from cdc_dagster.sinks.postgres import ddl_statements
from scheduler_core.ddl import DDLKind


def sql(stmts) -> list[str]:
    return [s.as_string(None) for s in stmts]


def table(*cols: ColumnSchema, name: str = "t", indexes=()) -> TableSchema:
    return TableSchema(
        3, "shop", name, (ColumnSchema(1, "id", "int64", False), *cols), (1,), indexes
    )


@pytest.mark.parametrize(
    ("logical", "pg"),
    [("uint64", "numeric(20,0)"), ("time", "interval"), ("json", "jsonb"),
     ("decimal(65,30)", "numeric(65,30)"), ("timestamp", "timestamp(6) with time zone"),
     ("uint32", "bigint"), ("binary", "bytea")],
)  # fmt: skip
def test_type_map(logical, pg):
    assert pg_ddl.pg_type(logical) == pg


def test_create_table_quotes_every_identifier():
    t = TableSchema(3, 'a"b', "c;d", (ColumnSchema(1, "x`y", "string", False, "it's"),), (1,))
    out = sql(pg_ddl.create_table(t))
    assert out[0] == 'CREATE SCHEMA IF NOT EXISTS "a""b"'
    assert out[1] == (
        'CREATE TABLE IF NOT EXISTS "a""b"."c;d" ("x`y" text DEFAULT \'it\'\'s\'::text NOT NULL, '
        'CONSTRAINT "c;d__pkey" PRIMARY KEY ("x`y"))'
    )


def test_long_index_names_are_capped_and_stay_distinct():
    t = table(name="t" * 60)
    a, b = pg_ddl.index_name(t, "idx_one"), pg_ddl.index_name(t, "idx_two")
    assert len(a.encode()) <= 63 and len(b.encode()) <= 63 and a != b


def test_alter_diff_renames_drops_adds_and_retypes_by_column_id():
    before = table(ColumnSchema(2, "a", "int32"), ColumnSchema(3, "b", "string"))
    after = table(ColumnSchema(2, "a2", "int64", False), ColumnSchema(4, "c", "bool", True, "1"),
                  indexes=(IndexSchema("ix", (4,), True),))  # fmt: skip
    out = sql(pg_ddl.alter_table(before, after))
    assert out == [
        'ALTER TABLE "shop"."t" DROP COLUMN IF EXISTS "b"',
        'ALTER TABLE "shop"."t" RENAME COLUMN "a" TO "a2"',
        'ALTER TABLE "shop"."t" ALTER COLUMN "a2" TYPE bigint USING "a2"::bigint',
        'ALTER TABLE "shop"."t" ALTER COLUMN "a2" SET NOT NULL',
        'ALTER TABLE "shop"."t" ADD COLUMN IF NOT EXISTS "c" boolean DEFAULT true',
        'CREATE UNIQUE INDEX IF NOT EXISTS "t__ix" ON "shop"."t" ("c")',
    ]


def test_rename_table_across_databases_moves_schema_then_renames():
    before = table(name="old")
    after = TableSchema(3, "arch", "new", before.columns, (1,))
    rec = DdlRecord(
        9, DDLKind.RENAME_TABLES, "rename_table", "RENAME TABLE ...", (3,), tables={3: after}
    )
    assert sql(ddl_statements(rec, {3: before})) == [
        'CREATE SCHEMA IF NOT EXISTS "arch"',
        'ALTER TABLE "shop"."old" SET SCHEMA "arch"',
        'ALTER TABLE "arch"."old" RENAME TO "new"',
        'ALTER TABLE "arch"."new" RENAME CONSTRAINT "old__pkey" TO "new__pkey"',
    ]


def test_truncate_and_drop_schema():
    t = table()
    rec = DdlRecord(9, DDLKind.TRUNCATE_TABLE, "truncate_table", "TRUNCATE t", (3,), tables={3: t})
    assert sql(ddl_statements(rec, {3: t})) == ['TRUNCATE TABLE "shop"."t"']
    drop = DdlRecord(9, DDLKind.DROP_SCHEMA, "drop_schema", "DROP DATABASE shop", (3,),
                     schema="shop", tables={3: None})  # fmt: skip
    assert sql(ddl_statements(drop, {3: t})) == ['DROP SCHEMA IF EXISTS "shop" CASCADE']


def test_alter_without_the_schema_before_is_refused_not_skipped():
    rec = DdlRecord(9, DDLKind.ALTER_TABLE, "add_column", "ALTER ...", (3,), tables={3: table()})
    with pytest.raises(
        pg_ddl.PgDDLError, match=r"no schema before the DDL for existing tables \[3\]"
    ):
        ddl_statements(rec, {})

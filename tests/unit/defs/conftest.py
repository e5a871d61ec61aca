"""A small change log with three tables, for loading the production definitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_dagster.schema import ColumnSchema, DdlRecord, TableSchema
from cdc_dagster.upstream.changelog import ChangeLogWriter
from scheduler_core.ddl import DDLKind
from scheduler_core.ts import compose

TABLES = [(1, "bank", "accounts_0"), (2, "bank", "accounts_1"), (3, "shop", "orders")]


def write_changelog(root: Path, tables: list[tuple[int, str, str]] = TABLES) -> Path:
    """``root`` with one create_table DDL per table and the DDL stream resolved past them."""
    writer = ChangeLogWriter(root)
    ts = compose(1_700_000_000_000)
    for i, (table_id, database, table) in enumerate(tables):
        schema = TableSchema(
            table_id, database, table, (ColumnSchema(1, "id", "int64", False),), (1,), shards=1
        )
        writer.write_ddl(
            DdlRecord(
                ts + i,
                DDLKind.CREATE_TABLE,
                "create_table",
                f"CREATE TABLE `{database}`.`{table}` (id bigint primary key)",
                creates=(table_id,),
                tables={table_id: schema},
            )
        )
    writer.advance_ddl_resolved(ts + len(tables))
    return root


@pytest.fixture
def changelog(tmp_path: Path) -> Path:
    """A change log holding TABLES."""
    return write_changelog(tmp_path / "changelog")


@pytest.fixture
def cdc_env(
    monkeypatch: pytest.MonkeyPatch, etcd_endpoints: list[str], cluster_id: str, metastore: object
) -> object:
    """The control plane's resources pointed at this test's cluster on the session etcd."""
    monkeypatch.setenv("CDC_DAGSTER_ETCD", ",".join(etcd_endpoints))
    monkeypatch.setenv("CDC_DAGSTER_CLUSTER_ID", cluster_id)
    return metastore

"""What the owner says about a changefeed's sink upkeep: a Delta vacuum failing for some of
its tables (the writers' records, ``sinks/delta_vacuum.py``) is one notice naming them, the
first one's error and what to do; other changefeeds' tables, a vacuum turned off and other
sinks say nothing."""

from __future__ import annotations

import time
from pathlib import Path

from cdc_dagster.runtime.owner import sink_notices
from cdc_dagster.schema import ColumnSchema, TableSchema
from cdc_dagster.sinks import delta_vacuum
from cdc_dagster.sinks.delta_paths import table_location
from cdc_dagster.sinks.uri import delta_uri


def _table(table_id: int, database: str, name: str) -> TableSchema:
    return TableSchema(table_id, database, name, (ColumnSchema(1, "id", "int64", False),), (1,))


def _fail(root: Path, t: TableSchema, message: str, times: int = 1) -> None:
    for _ in range(times):
        location = table_location(t.database, t.table)
        delta_vacuum._record_failure(str(root), location, message, int(time.time() * 1000))


def test_failing_tables_of_the_changefeed_make_one_notice_with_what_to_do(tmp_path: Path) -> None:
    mine = [_table(i, "shop", f"t {i}") for i in range(7)]  # names encoded on disk
    other = _table(99, "crm", "leads")
    for t in mine:
        _fail(tmp_path, t, f"PermissionError: [Errno 13] {t.table}", times=2)
    _fail(tmp_path, other, "not this changefeed's")
    [notice] = sink_notices(delta_uri(str(tmp_path)), [*mine, _table(50, "shop", "fine")])
    assert notice.startswith("[vacuum] the Delta VACUUM of 7 table(s) fails (shop.t 0, shop.t 1")
    assert "and 2 more" in notice and "crm.leads" not in notice and "shop.fine" not in notice
    assert "shop.t 0: 2 failed in a row since" in notice
    assert "last: PermissionError: [Errno 13] t 0" in notice
    assert "Replication goes on" in notice and "CDC_DAGSTER_VACUUM_EVERY_S" in notice
    assert "vacuum_retention_hours=off" in notice


def test_no_notice_without_failures_with_the_vacuum_off_or_for_another_sink(
    tmp_path: Path,
) -> None:
    t = _table(1, "shop", "orders")
    uri = delta_uri(str(tmp_path))
    assert sink_notices(uri, [t]) == ()
    _fail(tmp_path, t, "OSError: gone")
    assert len(sink_notices(uri, [t])) == 1
    assert sink_notices(uri + "?vacuum_retention_hours=off", [t]) == ()
    assert sink_notices("postgresql://u@localhost/db", [t]) == ()
    assert sink_notices(uri, []) == (), "a table the changefeed no longer has (dropped)"

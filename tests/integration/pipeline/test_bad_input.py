"""Bad input: the table goes to an error state with its message, the rest goes on, and it
resumes with nothing lost once the input is fixed."""

from __future__ import annotations

import json
import os
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import INSERT, alter, rows
from scenario import Workload, delta_content, ts
from test_executor import OPEN, assert_replicated, make, start

from cdc_dagster.schema import ColumnSchema
from scheduler_core.messages import Barrier

# Spark-heavy (a job or more per tick): CI runs slow tests too.
pytestmark = pytest.mark.slow


def _files(log_dir: Path, table_id: int) -> list[Path]:
    return sorted((log_dir / "tables" / str(table_id) / "data").rglob("*.parquet"))


def _replicating(
    tmp_path: Path, spark: Any, writer: Any, tables: list[int]
) -> tuple[Workload, Any]:
    """Two steps of writes to ``tables``, an executor that replicated them: (workload, it)."""
    w = Workload(writer, tables)
    w.write(steps=2)
    ex = make(tmp_path, spark)
    ex.set_barrier(OPEN)
    start(ex, tables, ts(1))
    ex.sink_phase()
    return w, ex


def _run_broken_then_fixed(
    tmp_path: Path, spark: Any, w: Workload, damage: Any, expect: list[str]
) -> None:
    """Replicate, damage table 1's newest data file, check the error state, fix, check resume."""
    ex = make(tmp_path, spark)
    ex.set_barrier(OPEN)
    start(ex, [1, 2], ts(1))
    ex.sink_phase()
    good = ex.status(1).checkpoint.checkpoint_ts
    top = w.write(steps=2)
    victim = _files(tmp_path / "log", 1)[-1]
    backup = tmp_path / "backup.parquet"
    shutil.copy(victim, backup)
    damage(victim)
    ex.advance()
    errors = ex.errors()
    assert list(errors) == [1]
    for word in [*expect, "accounts_1", "(id 1)"]:
        assert word in errors[1], (word, errors[1])
    assert ex.status(1).checkpoint.checkpoint_ts == good  # nothing written past the error
    assert ex.status(2).checkpoint.checkpoint_ts == top  # the other table goes on
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, good)
    ex.advance()  # still broken: still held
    assert ex.status(1).checkpoint.checkpoint_ts == good
    victim.unlink()
    shutil.copy(backup, victim)
    make(tmp_path, spark).advance()  # a fresh process resumes it
    again = make(tmp_path, spark)
    assert not again.errors()
    assert again.status(1).checkpoint.checkpoint_ts == top
    assert_replicated(tmp_path, w, top)


def test_a_corrupt_change_log_file_stops_only_its_table_until_rewritten(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2])
    w.write(steps=2)
    _run_broken_then_fixed(
        tmp_path, spark, w, lambda p: p.write_bytes(b"PAR1 not parquet"), ["cannot be read"]
    )


def test_a_missing_change_log_file_stops_only_its_table_until_restored(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2])
    w.write(steps=2)

    def lose(path: Path) -> None:  # the name is listed, the content is gone
        path.unlink()
        os.symlink(path.with_name("gone.parquet"), path)

    _run_broken_then_fixed(tmp_path, spark, w, lose, ["Missing", "restore"])


def test_a_row_that_does_not_fit_its_schema_stops_its_table_until_rewritten(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2])
    w.write(steps=2)

    def null_balance(path: Path) -> None:
        data = pq.read_table(path)
        i = data.schema.get_field_index("c3")
        pq.write_table(data.set_column(i, "c3", pa.nulls(data.num_rows, data.schema[i].type)), path)

    _run_broken_then_fixed(tmp_path, spark, w, null_balance, ["'balance'", "rewrite"])


def test_an_unknown_column_type_stops_its_table_until_the_ddl_record_is_fixed(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w, ex = _replicating(tmp_path, spark, writer, [1])
    before_ddl = w.write(steps=1)
    ddl_ts = before_ddl + 1
    added = w.schemas[1]
    added = type(added)(
        **{
            **{f: getattr(added, f) for f in ("table_id", "database", "table", "primary_key")},
            "columns": (*added.columns, ColumnSchema(4, "note", "string")),
        }
    )
    writer.write_ddl(alter(ddl_ts, added))
    record = next((tmp_path / "log" / "ddl").glob(f"{ddl_ts:020d}-*.json"))
    good = record.read_text()
    bad = json.loads(good)
    bad["tables"]["1"]["columns"][-1]["type"] = "geometry"
    record.write_text(json.dumps(bad))
    w.resolve(ddl_ts + 5)
    ex.set_barrier(Barrier(ddl_ts))  # the owner holds the table at its DDL
    ex.advance()
    assert "geometry" in ex.errors()[1] and "ddl/" in ex.errors()[1]
    record.write_text(good)
    ex.advance()
    assert not ex.errors()
    assert ex.status(1).checkpoint.checkpoint_ts == ddl_ts
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, ddl_ts)
    # After the DDL the rows carry the new column (mounted with the new schema).
    writer.write_rows(
        1,
        0,
        ddl_ts,
        rows(added, [(ddl_ts + 7, 0, INSERT, {"id": 7, "note": "n", "balance": Decimal(1)}, None)]),
    )
    w.resolve(ddl_ts + 10)
    ex.pull_phase()
    assert not ex.errors()
    staged = ex.tables()[1].files[-1]
    data = pq.read_table(ex.staging.path(1, staged))
    assert data.column_names[:4] == ["id", "owner", "balance", "note"]


def test_a_lost_staged_file_is_staged_again_from_the_change_log_by_itself(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    """Staging caches the change log above the checkpoint: a staged file that is gone (a
    damaged disk, a late writer) costs one tick with the table's error shown, then the table
    is pulled again from its checkpoint and goes on with nothing lost, without anyone."""
    w, ex = _replicating(tmp_path, spark, writer, [1, 2])
    good = ex.status(1).checkpoint.checkpoint_ts
    ex.set_barrier(Barrier(good))  # stage more, sink nothing yet
    top = w.write(steps=2)
    ex.pull_phase()
    staged = ex.tables()[1].files
    assert staged, "the tick staged table 1's new rows"
    os.remove(ex.staging.path(1, staged[0]))
    ex.set_barrier(OPEN)
    ex.sink_phase()
    errors = ex.errors()
    assert list(errors) == [1]
    for word in ("cannot be read", "staged again", "nothing to do", "accounts_1"):
        assert word in errors[1], (word, errors[1])
    assert ex.status(1).checkpoint.checkpoint_ts == good  # nothing written past the damage
    assert ex.status(2).checkpoint.checkpoint_ts == top  # the other table goes on
    again = make(tmp_path, spark)  # the next tick, in a fresh process
    again.advance()
    assert not again.errors()
    assert again.status(1).checkpoint.checkpoint_ts == top
    assert_replicated(tmp_path, w, top)


def test_a_sink_error_stays_across_pulls_until_the_sink_takes_the_table_again(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    """A sink that keeps refusing is the table's error until a sink write succeeds: the pull
    of the next tick's prepare half does not clear it (the capture's problem then counted
    one attempt forever, cleared by each prepare and made anew by each commit)."""
    w, ex = _replicating(tmp_path, spark, writer, [1])
    lake = tmp_path / "delta"
    away = tmp_path / "delta-away"
    lake.rename(away)
    lake.write_bytes(b"not a directory")  # the sink's root is gone: its outage
    top = w.write(steps=1)
    ex.advance()
    assert "delta" in ex.errors()[1], ex.errors()
    w.write(steps=1)
    ex.pull_phase()  # the next tick's prepare half: new data pulled fine
    assert 1 in ex.errors(), "a pull that went fine cleared the sink's error"
    ex.sink_phase()
    assert 1 in ex.errors()
    lake.unlink()
    away.rename(lake)
    top = w.write(steps=1)
    ex.advance()
    assert not ex.errors()
    assert ex.status(1).checkpoint.checkpoint_ts == top
    assert_replicated(tmp_path, w, top)

"""A table held at its DDL: the Delta version of the batch up to the DDL claims T - 1, the
DDL's own commit claims T, and the table's checkpoint (what the DDL gate waits for) is T
(issue 17: a version that claims T holds every effect at or below T, DDLs included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers import ColumnSchema, accounts, alter
from scenario import Workload, ts
from test_executor import make, start

from cdc_dagster.sinks.delta import DeltaSink
from cdc_dagster.testing.validators import (
    DdlPlacement,
    DeltaFeed,
    PerKeyOrder,
    Validators,
    delta_types,
)
from scheduler_core.messages import Barrier
from scheduler_core.model import Checkpoint

NOTE = ColumnSchema(4, "note", "string", True, "n/a")


class Expected:
    """The scenario's content, with the ADD COLUMN at ``ddl`` (defaults filled in)."""

    def __init__(self, w: Workload, ddl: int) -> None:
        self.w, self.ddl = w, ddl

    def schema_at(self, table_id: int, at: int) -> Any:
        return accounts(table_id, extra=(NOTE,)) if at >= self.ddl else accounts(table_id)

    def table_at(self, table_id: int, at: int) -> Any:
        import pyarrow as pa

        content = self.w.expected(table_id, at)
        data = {
            "id": pa.array(list(content), pa.int64()),
            "owner": pa.array([v[0] for v in content.values()], pa.string()),
            "balance": pa.array([v[1] for v in content.values()], pa.decimal128(18, 2)),
        }
        if at >= self.ddl:
            data["note"] = pa.array(["n/a"] * len(content), pa.string())
        return pa.table(data)

    def ddl_ts(self, table_id: int) -> list[int]:
        return [self.ddl]


def test_the_batch_up_to_a_ddl_claims_the_ts_below_it_and_the_ddl_claims_its_own(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1])
    w.write(steps=2)
    ddl_ts = ts(w.step + 1)
    w.step += 1
    record = alter(ddl_ts, accounts(1, extra=(NOTE,)))
    writer.write_ddl(record)
    ex = make(tmp_path, spark)
    ex.set_barrier(Barrier(ddl_ts + 10**6, {1: ddl_ts}))  # held at its DDL
    start(ex, [1], ts(1))
    w.resolve(ddl_ts)
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == ddl_ts  # what the DDL gate waits for
    sink = DeltaSink(str(tmp_path / "delta"))
    assert sink.committed("cf", accounts(1)).committed_ts == ddl_ts - 1
    feed = DeltaFeed(tmp_path / "delta", "cf")
    check = Validators([DdlPlacement(Expected(w, ddl_ts), delta_types), PerKeyOrder(Expected(w, ddl_ts))])  # fmt: skip
    for v in feed.poll():
        check.note_version(v)
    # The table moves while held at its DDL: the new primary starts at T although the
    # downstream claims T - 1 (T holds no row change), before the DDL runs.
    ex.remove(1)
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == ddl_ts
    dst = make(tmp_path, spark, "dst")
    dst.set_barrier(Barrier(ddl_ts + 10**6, {1: ddl_ts}))
    dst.prepare(1, Checkpoint(ddl_ts, ddl_ts))
    dst.pull_phase()
    dst.commit(1, Checkpoint(ddl_ts, ddl_ts))
    sink.apply_ddl("cf", record, {1: accounts(1)})
    assert sink.committed("cf", accounts(1)).committed_ts == ddl_ts
    later = ts(w.step + 2)
    w.resolve(later)
    dst.set_barrier(Barrier(later))
    dst.advance()
    assert dst.status(1).checkpoint == Checkpoint(later, later)
    assert sink.committed("cf", accounts(1)).committed_ts == later
    for v in feed.poll():
        check.note_version(v)
    check.assert_ok()
    assert check.rows_checked > 0

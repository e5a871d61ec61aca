"""Workload.open: a producer continues the change log it wrote, whatever stopped it."""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_dagster.upstream.changelog import ChangeLog, ChangeLogLockedError, ChangeLogWriter
from cdc_dagster.upstream.generator import Workload, WorkloadConfig, WorkloadError
from cdc_dagster.upstream.oracle import Oracle, OracleError, fingerprint
from cdc_dagster.upstream.resume import CONFIG_PATH
from scheduler_core.ts import MAX_TS, compose, physical_ms

CFG = WorkloadConfig(
    seed=3, bank_tables=2, rows_per_table=15, txns_per_step=120, ddl_every=6, fsync=False
)
TOTAL = Decimal("30000.00")


def model_table(w: Workload, table_id: int) -> pa.Table:
    s, rows = w.schema(table_id), list(w.table_rows(table_id).values())
    arrays = [pa.array([r.get(c.id) for r in rows], c.arrow) for c in s.columns]
    return pa.Table.from_arrays(arrays, schema=s.arrow_schema())


def model_state(w: Workload) -> dict:
    """Everything a resumed producer must rebuild, comparable with ==."""
    return {
        "last_ts": w.last_commit_ts,
        "tables": {tid: (t.schema, t.version, t.role, t.protected) for tid, t in w.tables.items()},
        "rows": {tid: fingerprint(model_table(w, tid)) for tid in w.tables},
        "keys": {tid: sorted(t.keys) for tid, t in w.tables.items()},
        "next": {tid: (t.next_key, t.next_column) for tid, t in w.tables.items()},
        "ids": (w._next_table_id, w._scratch_count, w._renames),
        "total": w.bank_total(),
    }


def assert_log_invariants(root: Path, w: Workload) -> None:
    """What an uninterrupted run guarantees: oracle == model, the bank total, unique
    (commit_ts, seq) per table, no row at a DDL's ts, commit ts increasing in file order."""
    w.advance_resolved()
    log, oracle, last = ChangeLog(root), Oracle(root), w.last_commit_ts
    for tid in w.tables:
        assert fingerprint(oracle.table_at(tid, last)) == fingerprint(model_table(w, tid))
    assert oracle.bank_total_at(last, w.bank_table_ids) == TOTAL == w.bank_total()
    ddl_ts = [r.commit_ts for r in log.ddl_records()]
    assert ddl_ts == sorted(ddl_ts)
    for tid in {t for r in log.ddl_records() for t in r.tables}:
        seen: set[tuple[int, int]] = set()
        for f in log.data_files(tid, 0, MAX_TS):
            rows = log.read_data_file(f)
            pairs = list(zip(rows["_commit_ts"].to_pylist(), rows["_seq"].to_pylist(), strict=True))
            assert not seen & set(pairs) and len(set(pairs)) == len(pairs), tid
            seen |= set(pairs)
        assert not {ts for ts, _ in seen} & set(ddl_ts)


def run(w: Workload, steps: int, resolve: bool = True) -> Workload:
    for _ in range(steps):
        w.step()
        if resolve:
            w.advance_resolved()
    return w


def test_open_after_a_clean_stop_rebuilds_the_exact_model(tmp_path: Path) -> None:
    w = run(Workload(CFG, tmp_path), 3)
    before = model_state(w)
    w.close()
    del w
    again = Workload.open(CFG, tmp_path)
    assert model_state(again) == before
    assert again.discarded_above is None and again.resumed_from == before["last_ts"]
    run(again, 3)
    assert again.last_commit_ts > before["last_ts"]
    assert_log_invariants(tmp_path, again)


@pytest.mark.parametrize("ddls", [False, True])
def test_open_discards_a_half_written_transaction_above_the_resolved_marks(
    tmp_path: Path, ddls: bool
) -> None:
    cfg = replace(CFG, ddls=ddls)
    w = run(Workload(cfg, tmp_path), 2)
    frontier = w.last_commit_ts
    resolved_state = model_state(w)
    w.step()  # written, never resolved
    for _ in range(40):  # transactions buffered, then only the first bank table written
        w._transaction()
    w.flush(table_id=1)
    log = ChangeLog(tmp_path)
    n_ddls = len(log.ddl_records())
    files = [f.last_ts for t in range(1, 20) for f in log.data_files(t, 0, MAX_TS)]
    top = max(files)  # the last ts in the log (buffered transactions never reached it)
    assert top > frontier
    w.close()
    again = Workload.open(cfg, tmp_path)
    assert again.discarded_above == frontier
    assert again.bank_total() == TOTAL
    assert again.last_commit_ts >= top  # the clock never goes back, discarded rows included
    assert all(f.last_ts <= frontier for t in again.tables for f in log.data_files(t, 0, MAX_TS))
    if ddls:  # DDL records above the cut are whole: kept, and replayed into the model
        assert len(log.ddl_records()) == n_ddls and log.ddl_records()[-1].commit_ts > frontier
    else:
        state = model_state(again)
        assert state["rows"] == resolved_state["rows"] and state["keys"] == resolved_state["keys"]
    run(again, 3)
    assert_log_invariants(tmp_path, again)


def test_open_after_death_before_the_first_resolve_writes_the_setup_again(
    tmp_path: Path,
) -> None:
    w = Workload(CFG, tmp_path)
    w.step()
    w.close()
    again = Workload.open(CFG, tmp_path)
    assert again.bank_total() == TOTAL
    assert all(len(again.table_rows(t)) == CFG.rows_per_table for t in again.bank_table_ids)
    run(again, 2)
    assert_log_invariants(tmp_path, again)


def test_open_creates_base_tables_a_setup_never_reached(tmp_path: Path) -> None:
    w = Workload(CFG, tmp_path)
    w.close()
    for name in sorted((tmp_path / "ddl").iterdir())[-2:]:  # orders and wide never created
        name.unlink()
    again = Workload.open(CFG, tmp_path)
    assert sorted(again.tables) == [1, 2, 3, 4, 5]
    run(again, 2)
    assert_log_invariants(tmp_path, again)


def test_open_of_an_empty_directory_starts_the_same_log_as_the_constructor(
    tmp_path: Path,
) -> None:
    a = run(Workload.open(CFG, tmp_path / "a"), 2)
    b = run(Workload(CFG, tmp_path / "b"), 2)
    assert model_state(a) == model_state(b)


def test_open_refuses_a_log_written_with_another_shaping_config(tmp_path: Path) -> None:
    Workload(CFG, tmp_path).close()
    with pytest.raises(WorkloadError, match=r"seed: log 3, given 4.*cannot be continued"):
        Workload.open(replace(CFG, seed=4), tmp_path)
    with pytest.raises(WorkloadError, match=r"shards_per_table: log 2, given 3"):
        Workload.open(replace(CFG, shards_per_table=3), tmp_path)
    # rate, DDL mix and clock may change between runs
    Workload.open(replace(CFG, txns_per_step=7, ddl_every=2, ms_per_txn=5), tmp_path).close()


def test_open_refuses_a_log_not_written_by_a_workload(tmp_path: Path) -> None:
    Workload(CFG, tmp_path).close()
    (tmp_path / CONFIG_PATH).unlink()
    with pytest.raises(WorkloadError, match="not written by a Workload"):
        Workload.open(CFG, tmp_path)
    (tmp_path / CONFIG_PATH).write_text(json.dumps({"producer": "x"}))
    with pytest.raises(WorkloadError, match="not a cdc-dagster-workload config"):
        Workload.open(CFG, tmp_path)


def test_open_with_swapped_arguments_says_so(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="arguments swapped"):
        Workload.open(tmp_path, CFG)  # type: ignore[arg-type]


def test_a_second_producer_on_a_log_is_refused_and_the_first_keeps_working(
    tmp_path: Path,
) -> None:
    w = Workload(CFG, tmp_path)
    with pytest.raises(ChangeLogLockedError, match="already has a writer"):
        Workload.open(CFG, tmp_path)
    with pytest.raises(ChangeLogLockedError):
        ChangeLogWriter(tmp_path)
    run(w, 1)
    assert_log_invariants(tmp_path, w)


def test_wall_clock_resume_never_goes_behind_the_last_ts(tmp_path: Path) -> None:
    future = physical_ms(compose(2_000_000_000_000))  # 2033: ahead of the machine's clock
    w = run(Workload(replace(CFG, start_physical_ms=future), tmp_path), 1)
    last = w.last_commit_ts
    w.close()
    again = Workload.open(replace(CFG, wall_clock=True), tmp_path)
    again.step(30)
    again.step_transfers(50)
    assert again.last_commit_ts > last
    assert physical_ms(again.last_commit_ts) == physical_ms(last)  # logical steps only
    assert_log_invariants(tmp_path, again)


def test_a_garbage_collected_log_is_refused_by_resume_and_the_oracle(tmp_path: Path) -> None:
    w = run(Workload(CFG, tmp_path), 2)
    w.close()
    assert ChangeLog(tmp_path).gc(w.last_commit_ts) > 0
    with pytest.raises(WorkloadError, match=r"garbage-collected up to .*cannot continue"):
        Workload.open(CFG, tmp_path)
    with pytest.raises(OracleError, match="garbage-collected"):
        Oracle(tmp_path).table_at(1, w.last_commit_ts)

"""The embedded workload: deterministic, invariant-keeping, covering every DDL and type."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cdc_dagster.schema import ACTIONS
from cdc_dagster.upstream.changelog import OP_DELETE, OP_UPDATE, ChangeLog
from cdc_dagster.upstream.generator import ShardLag, Workload, WorkloadConfig, WorkloadError
from cdc_dagster.upstream.oracle import Oracle, fingerprint
from cdc_dagster.upstream.workload_data import WIDE_TYPES
from scheduler_core.ddl import DDLKind
from scheduler_core.ts import LOGICAL_MASK, MAX_TS, compose, physical_ms

SMALL = WorkloadConfig(seed=7, bank_tables=2, rows_per_table=20, txns_per_step=150, fsync=False)


def all_rows(log: ChangeLog, table_id: int) -> pa.Table:
    files = log.data_files(table_id, 0, MAX_TS)
    parts = [log.read_data_file(f) for f in files]
    table = pa.concat_tables(parts, promote_options="permissive")
    return table.sort_by([("_commit_ts", "ascending"), ("_seq", "ascending")])


def content(root: Path) -> tuple[list[str], list[list[dict]]]:
    log = ChangeLog(root)
    ddls = [r.dumps() for r in log.ddl_records()]
    tables = sorted({t for r in log.ddl_records() for t in r.tables})
    return ddls, [all_rows(log, t).to_pylist() for t in tables]


def run(config: WorkloadConfig, root: Path, steps: int = 3) -> Workload:
    w = Workload(config, root)
    for _ in range(steps):
        w.step()
        w.advance_resolved()
    return w


def test_same_seed_writes_the_same_change_log(tmp_path: Path) -> None:
    run(SMALL, tmp_path / "a")
    run(SMALL, tmp_path / "b")
    run(WorkloadConfig(**{**_fields(SMALL), "seed": 8}), tmp_path / "c")
    assert content(tmp_path / "a") == content(tmp_path / "b")
    assert content(tmp_path / "a") != content(tmp_path / "c")


def _fields(config: WorkloadConfig) -> dict:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def test_bank_total_is_constant_across_steps_and_ddls(tmp_path: Path) -> None:
    w = Workload(WorkloadConfig(**{**_fields(SMALL), "ddl_every": 5}), tmp_path)
    start = w.bank_total()
    assert start == Decimal("40000.00")
    for _ in range(4):
        w.step()
        assert w.bank_total() == start


def test_every_ddl_action_is_logged_with_its_kind(tmp_path: Path) -> None:
    cfg = WorkloadConfig(**{**_fields(SMALL), "ddl_every": 3, "txns_per_step": 200})
    w = run(cfg, tmp_path, steps=2)
    records = w.writer.log.ddl_records()
    by_action = {r.action: r for r in records}
    wanted = ACTIONS - {"modify_column", "drop_index", "create_schema", "drop_schema"}
    assert wanted <= by_action.keys()
    kinds = {
        "create_table": DDLKind.CREATE_TABLE,
        "drop_table": DDLKind.DROP_TABLE,
        "rename_table": DDLKind.RENAME_TABLES,
        "truncate_table": DDLKind.TRUNCATE_TABLE,
        "add_column": DDLKind.ALTER_TABLE,
    }
    assert all(by_action[a].kind is k for a, k in kinds.items())
    assert by_action["drop_table"].tables == {by_action["drop_table"].drops[0]: None}
    bank = set(w.bank_table_ids)
    destructive = {"drop_table", "truncate_table", "drop_column", "rename_column"}
    assert not [r for r in records if r.action in destructive and bank & set(r.table_ids)]


def test_add_column_default_fills_existing_rows_in_the_model(tmp_path: Path) -> None:
    cfg = WorkloadConfig(**{**_fields(SMALL), "ddl_every": 4})
    w = run(cfg, tmp_path, steps=2)
    adds = [r for r in w.writer.log.ddl_records() if r.action == "add_column"]
    assert adds
    for rec in adds:
        (tid,) = rec.table_ids
        if tid not in w.tables or rec.tables[tid] != w.schema(tid):
            continue
        col = w.schema(tid).columns[-1]
        old_rows = [r for r in w.table_rows(tid).values() if r[1] < 20]
        assert all(col.id in r for r in old_rows)


def test_lagging_shard_keeps_its_mark_behind(tmp_path: Path) -> None:
    cfg = WorkloadConfig(**{**_fields(SMALL), "ms_per_txn": 10, "lagging": (ShardLag(1, 1, 500),)})
    w = run(cfg, tmp_path)
    log, last = ChangeLog(tmp_path), w.last_commit_ts
    assert log.shard_resolved_ts(1, 0) == last
    assert log.shard_resolved_ts(1, 1) == compose(physical_ms(last) - 500)
    assert log.table_resolved_ts(1) == compose(physical_ms(last) - 500)
    assert log.table_resolved_ts(2) == last and log.ddl_resolved_ts() == last


def test_primary_key_changes_write_the_before_image(tmp_path: Path) -> None:
    w = run(SMALL, tmp_path)
    rows = all_rows(ChangeLog(tmp_path), w.bank_table_ids[0])
    updates = rows.filter(pc.equal(rows["_op"], OP_UPDATE))
    rekeyed = updates.filter(pc.is_valid(updates["b1"]))
    assert rekeyed.num_rows and pc.all(pc.not_equal(rekeyed["b1"], rekeyed["c1"])).as_py()
    deletes = rows.filter(pc.equal(rows["_op"], OP_DELETE))
    assert (
        deletes.num_rows
        and deletes["b1"].null_count == 0
        and deletes["c2"].null_count == deletes.num_rows
    )


def test_odd_identifiers_appear_and_can_be_switched_off(tmp_path: Path) -> None:
    odd = Workload(SMALL, tmp_path / "odd").schema(SMALL.wide_id)
    names = [odd.table, *(c.name for c in odd.columns)]
    for ch in ("`", '"', ";", " ", "ü"):
        assert any(ch in n for n in names), ch
    plain_cfg = WorkloadConfig(**{**_fields(SMALL), "odd_identifiers": False})
    plain = Workload(plain_cfg, tmp_path / "plain").schema(SMALL.wide_id)
    assert all(
        n.replace("_", "").isalnum() for n in [plain.table, *(c.name for c in plain.columns)]
    )


def test_wide_table_has_every_type_and_nulls(tmp_path: Path) -> None:
    w = run(WorkloadConfig(**{**_fields(SMALL), "ddls": False}), tmp_path, steps=1)
    types = {c.type for c in w.schema(SMALL.wide_id).columns}
    assert {t for _, t in WIDE_TYPES} <= types
    rows = all_rows(ChangeLog(tmp_path), SMALL.wide_id)
    live = rows.filter(pc.not_equal(rows["_op"], OP_DELETE))
    assert all(live[f"c{i}"].null_count > 0 for i in range(2, 2 + len(WIDE_TYPES)))


def test_transactions_span_tables(tmp_path: Path) -> None:
    w = run(WorkloadConfig(**{**_fields(SMALL), "ddls": False}), tmp_path, steps=1)
    log = ChangeLog(tmp_path)
    per_ts: dict[int, set[int]] = {}
    for tid in w.tables:
        for ts in all_rows(log, tid)["_commit_ts"].to_pylist():
            per_ts.setdefault(ts, set()).add(tid)
    assert max(len(v) for v in per_ts.values()) >= 3


def test_rows_carry_the_schema_version_valid_at_their_commit_ts(tmp_path: Path) -> None:
    w = run(WorkloadConfig(**{**_fields(SMALL), "ddl_every": 4}), tmp_path, steps=2)
    log = ChangeLog(tmp_path)
    for tid in w.tables:
        for f in log.data_files(tid, 0, w.last_commit_ts):
            rows = log.read_data_file(f)
            version = log.schema_version_at(tid, f.first_ts)
            assert set(rows["_schema_version"].to_pylist()) == {version}
            assert log.schema_version_at(tid, f.last_ts) == version


def test_wall_clock_mode_gives_increasing_ts_near_now(tmp_path: Path) -> None:
    w = Workload(WorkloadConfig(**{**_fields(SMALL), "wall_clock": True}), tmp_path)
    first = w.last_commit_ts
    w.step(50)
    assert w.last_commit_ts > first
    assert abs(physical_ms(w.last_commit_ts) - time.time() * 1000) < 60_000


def test_workload_refuses_a_log_that_has_ddls(tmp_path: Path) -> None:
    Workload(SMALL, tmp_path)
    with pytest.raises(WorkloadError, match="fresh log"):
        Workload(SMALL, tmp_path)


def test_vectorised_transfers_keep_the_total_and_match_the_oracle(tmp_path: Path) -> None:
    w = Workload(WorkloadConfig(**{**_fields(SMALL), "ddl_every": 5}), tmp_path)
    w.step()
    assert w.step_transfers(5_000) == 10_000
    w.step()
    w.advance_resolved()
    assert w.bank_total() == Decimal("40000.00")
    oracle = Oracle(tmp_path)
    assert oracle.bank_total_at(w.last_commit_ts, w.bank_table_ids) == Decimal("40000.00")
    for tid in w.bank_table_ids:
        s, rows = w.schema(tid), list(w.table_rows(tid).values())
        arrays = [pa.array([r.get(c.id) for r in rows], c.arrow) for c in s.columns]
        model = pa.Table.from_arrays(arrays, schema=s.arrow_schema())
        assert fingerprint(oracle.table_at(tid, w.last_commit_ts)) == fingerprint(model)


def test_wall_clock_behind_the_last_ts_steps_the_logical_part_then_the_ms(
    tmp_path: Path,
) -> None:
    w = Workload(WorkloadConfig(**{**_fields(SMALL), "wall_clock": True}), tmp_path)
    ahead = physical_ms(w.last_commit_ts) + 3_600_000  # an hour ahead of the clock
    w._last_ts = compose(ahead, LOGICAL_MASK - 1)
    assert [w._next_ts() for _ in range(2)] == [
        compose(ahead, LOGICAL_MASK),
        compose(ahead + 1),
    ]

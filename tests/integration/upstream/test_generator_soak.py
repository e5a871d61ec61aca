"""Seeded walk over many workloads: the oracle's replay equals the generator's model."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_dagster.upstream.generator import Workload, WorkloadConfig
from cdc_dagster.upstream.oracle import Oracle, fingerprint


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_oracle_replay_equals_model_under_heavy_ddl(tmp_path: Path, seed: int) -> None:
    cfg = WorkloadConfig(
        seed=seed,
        rows_per_table=10,
        txns_per_step=100,
        ddl_every=3,
        shards_per_table=1 + seed % 3,
        odd_identifiers=seed % 2 == 0,
        fsync=False,
    )
    w = Workload(cfg, tmp_path)
    for _ in range(3):
        w.step()
        w.advance_resolved()
    oracle, last = Oracle(tmp_path), w.last_commit_ts
    for tid in w.tables:
        s, rows = w.schema(tid), list(w.table_rows(tid).values())
        arrays = [pa.array([r.get(c.id) for r in rows], c.arrow) for c in s.columns]
        model = pa.Table.from_arrays(arrays, schema=s.arrow_schema())
        assert fingerprint(oracle.table_at(tid, last)) == fingerprint(model), s.table
    assert oracle.bank_total_at(last, w.bank_table_ids) == Decimal("20000.00")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_resumed_three_times_at_seeded_points_the_oracle_still_equals_the_model(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cfg = WorkloadConfig(
        seed=seed,
        rows_per_table=10,
        txns_per_step=60,
        ddl_every=3,
        fsync=False,
        shards_per_table=1 + seed % 3,
    )
    w = Workload.open(cfg, tmp_path)
    for _ in range(3):
        for _ in range(rng.randint(0, 3)):
            w.step()
            if rng.random() < 0.7:
                w.advance_resolved()
        for _ in range(rng.randint(0, 30)):  # a stop mid-step: some tables flushed, not all
            w._transaction()
        w.flush(table_id=rng.choice(list(w.tables)))
        w.close()
        w = Workload.open(cfg, tmp_path)
    w.step()
    w.advance_resolved()
    oracle, last = Oracle(tmp_path), w.last_commit_ts
    for tid in w.tables:
        s, rows = w.schema(tid), list(w.table_rows(tid).values())
        arrays = [pa.array([r.get(c.id) for r in rows], c.arrow) for c in s.columns]
        model = pa.Table.from_arrays(arrays, schema=s.arrow_schema())
        assert fingerprint(oracle.table_at(tid, last)) == fingerprint(model), s.table
    assert oracle.bank_total_at(last, w.bank_table_ids) == Decimal("20000.00") == w.bank_total()

"""Seeded walk over many workloads: the oracle's replay equals the generator's model."""

from __future__ import annotations

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

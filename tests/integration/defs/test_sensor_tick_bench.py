"""bench/sensor_tick_bench.py's core at 2,500 tables: the real owner sensor through Dagster,
real captures' reports in etcd, until every table replicates; then steady ticks."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_dagster.defs.owner.sensor import OBSERVATIONS_PER_TICK
from cdc_dagster.defs.resources import CdcResource

TABLES, CAPTURES, DATABASES = 2_500, 3, 5  # past max_table_assets (2000): grouped per schema


@pytest.fixture(scope="module")
def bench_module(load_bench: Any) -> Any:
    return load_bench("sensor_tick_bench")


@pytest.fixture
def bench(bench_module: Any, tmp_path: Path, etcd_endpoints: list[str]) -> Iterator[Any]:
    upstream = bench_module.Upstream(tmp_path / "changelog", TABLES, DATABASES)
    b = bench_module.SensorBench(
        tmp_path, etcd_endpoints, TABLES, CAPTURES, databases=DATABASES, upstream=upstream
    )
    try:
        yield b
    finally:
        b.close()
        upstream.writer.close()
        for key in b.env:
            os.environ.pop(key, None)
        CdcResource.forget_owner_loops()


def test_every_table_replicates_with_grouped_observations_and_dispatches_in_run_configs(
    bench: Any, tmp_path: Path
) -> None:
    assert bench.catalog.grouped
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        init = bench.initialize(instance, max_ticks=20)
        assert init.complete, [t.replicating for t in init.ticks]
        # 1,000 adds a tick: the burst is spread over the ticks, not 50 at a time.
        assert len(init.ticks) <= 8
        assert sum(t.adds for t in init.ticks) >= TABLES
        # The dispatches travel in the capture runs' config: one run per capture.
        assert max(t.run_requests for t in init.ticks) == CAPTURES
        assert max(t.max_config_bytes for t in init.ticks) > 10_000
        # Observations: one per schema (grouped), never one per table.
        assert max(t.observations for t in init.ticks) == DATABASES

        steady = bench.steady(instance, ticks=3)
        assert all(t.replicating == TABLES and t.adds == 0 for t in steady.ticks)
        # Heartbeats keep every capture's run coming (they renew its lease).
        assert all(t.run_requests == CAPTURES for t in steady.ticks)
        # The daemon stored each run and its config carries owner_rev and the messages.
        runs = instance.get_runs(dg.RunsFilter(job_name="capture_tick"))
        assert len(runs) == sum(t.run_requests for t in (*init.ticks, *steady.ticks))
        config = runs[0].run_config["ops"]["receive"]["config"]
        assert config["owner_rev"] > 0 and json.loads(config["messages_json"])
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)

        before = bench.steady(instance, ticks=1, which="before")
        assert before.ticks[0].observations == DATABASES  # every asset, every tick
        assert all(t.observations <= OBSERVATIONS_PER_TICK for t in steady.ticks)
        assert all(t.sensor_s >= t.owner_s > 0 for t in (*init.ticks, *steady.ticks))

"""DDL placement on the real data plane (issue 17): every Delta version claims a committed ts
whose every effect it holds, DDLs included.

The generator writes transactions and DDLs (ADD/DROP/RENAME COLUMN, TRUNCATE, CREATE, DROP
and RENAME TABLE); the in-process driver runs the owner and the captures with the
SparkTableExecutor into Delta; after every tick the validators read every new Delta version.
Before the fix, the batch a table sank up to its DDL barrier claimed the DDL's commit ts T
while the DDL was not applied yet (the next version, the DDL's, was right): ddl-placement
named that version.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cdc_dagster.pipeline.executor")
from cdc_dagster.metastore import Metastore
from cdc_dagster.runtime import spark_executor_factory
from cdc_dagster.testing.driver import Driver
from cdc_dagster.testing.validators import (
    ChangeLogOracle,
    DeltaFeed,
    ProgressFeed,
    Watch,
    delta_types,
    standard,
)
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.generator import Workload, WorkloadConfig


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from cdc_dagster.pipeline.engine import spark_session

    yield spark_session(
        os.environ.get("CDC_SPARK_MASTER", "local[2]"),
        conf={"spark.sql.shuffle.partitions": "2"},
    )


def test_every_delta_version_holds_every_effect_at_or_below_its_claim(
    spark: Any, metastore: Metastore, tmp_path: Path
) -> None:
    config = WorkloadConfig(
        seed=11, bank_tables=2, rows_per_table=8, shards_per_table=1, txns_per_step=6,
        ddl_every=4, ms_per_txn=50, odd_identifiers=False, fsync=False,
    )  # fmt: skip
    root, lake = tmp_path / "changelog", tmp_path / "lake"
    workload = Workload(config, root)
    start = ChangeLog(root).ddl_records()[-1].commit_ts  # after the bootstrap's CREATEs
    workload.advance_resolved()
    driver = Driver(
        tmp_path / "state", root, f"delta://{lake}", 1, spark_executor_factory(spark),
        metastore=metastore, start_ts=start, lease_ttl_s=120, sync_point_interval_s=1,
    )  # fmt: skip
    oracle = ChangeLogOracle(root)
    bank = (config.initial_balance * config.rows_per_table * config.bank_tables, [1, 2])
    watch = Watch(
        standard(oracle, bank=bank, types=delta_types),
        DeltaFeed(lake, "cf"),
        ProgressFeed(metastore, "cf"),
    )
    for _ in range(6):
        workload.step()
        workload.advance_resolved()
        driver.tick()
        watch.poll()
    target = workload.advance_resolved()

    def caught_up(tick: Any) -> bool:
        watch.poll()
        return driver.caught_up(tick, target)

    driver.run_until(caught_up, max_ticks=40)
    watch.final(target)
    workload.close()
    watch.validators.assert_ok()
    ddls = [r for r in ChangeLog(root).ddl_records() if r.commit_ts > start]
    assert len({r.action for r in ddls}) >= 3, [r.action for r in ddls]  # several kinds ran
    by_name = watch.validators.by_name()
    assert by_name["equals-oracle"].syncpoints_checked >= 2
    assert watch.feed.versions_read >= 20 and by_name["per-key-order"].rows_checked > 100
    assert bank[0] == Decimal("16000.00")

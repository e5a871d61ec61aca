"""One capture run in its own process: capture_prepare then capture_commit, optionally SIGKILLed.

argv: endpoints cluster_id changefeed capture staging_root run_config_json kill_point
kill_point: none | prepare-before-save | prepare-after-save | between |
            commit-before-save (sink written; no manifest, no report) | commit-after-save
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from cdc_dagster.metastore import connect
from cdc_dagster.runtime.capture import CaptureContext, capture_commit, capture_prepare
from cdc_dagster.runtime.spec import ExecutorSpec
from cdc_dagster.runtime.wire import decode
from cdc_dagster.testing.fake_runtime import DurableFakeExecutor

endpoints, cluster_id, cf_id, capture_id, staging, config_json, kill = sys.argv[1:8]
executor_kind = sys.argv[8] if len(sys.argv) > 8 else "fake"
phase = {"now": ""}


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class KillingExecutor(DurableFakeExecutor):
    def save(self) -> None:
        if kill == f"{phase['now']}-before-save":
            die()
        super().save()
        if kill == f"{phase['now']}-after-save":
            die()  # manifest saved; the etcd write (agent state, report) never happens


def factory(spec: ExecutorSpec) -> KillingExecutor:
    ex = KillingExecutor(spec)
    ex.load()
    return ex


def spark_factory() -> object:
    from cdc_dagster.pipeline.engine import spark_session
    from cdc_dagster.pipeline.executor import SparkTableExecutor
    from cdc_dagster.upstream.changelog import ChangeLog
    from cdc_dagster.upstream.uri import changelog_path

    class KillingSpark(SparkTableExecutor):
        def save(self) -> None:
            if kill == f"{phase['now']}-before-save":
                die()  # in commit: after the Delta write, before the manifest and report
            super().save()

    spark = spark_session("local[1]", conf={"spark.sql.shuffle.partitions": "1"})

    def make(spec: ExecutorSpec) -> object:
        return KillingSpark.load(
            spec.capture_id,
            spec.changefeed_id,
            ChangeLog(changelog_path(spec.upstream_uri)),
            spec.sink_uri,
            spec.staging_root,
            spark,
            spec.sync_point_interval_ms,
            registration=spec.registration,
        )

    return make


ms = connect(endpoints.split(","), cluster_id=cluster_id, retry_timeout_s=10.0)
chosen = factory if executor_kind == "fake" else spark_factory()
ctx = CaptureContext(ms, capture_id, cf_id, Path(staging), chosen, lease_ttl_s=60)  # type: ignore[arg-type]
phase["now"] = "prepare"
prepared = capture_prepare(ctx, decode(json.loads(config_json).get(cf_id, [])))
if kill == "between":
    die()
phase["now"] = "commit"
committed = capture_commit(ctx)
print(json.dumps({"prepare": prepared.lines(), "commit": committed.lines()}))

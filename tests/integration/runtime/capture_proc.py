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
from cdc_dagster.runtime.fake import DurableFakeExecutor
from cdc_dagster.runtime.spec import ExecutorSpec
from cdc_dagster.runtime.wire import decode

endpoints, cluster_id, cf_id, capture_id, staging, config_json, kill = sys.argv[1:8]
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


ms = connect(endpoints.split(","), cluster_id=cluster_id, retry_timeout_s=10.0)
ctx = CaptureContext(ms, capture_id, cf_id, Path(staging), factory)
phase["now"] = "prepare"
prepared = capture_prepare(ctx, decode(json.loads(config_json).get(cf_id, [])))
if kill == "between":
    die()
phase["now"] = "commit"
committed = capture_commit(ctx)
print(json.dumps({"prepare": prepared.lines(), "commit": committed.lines()}))

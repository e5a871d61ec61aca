"""The owner sensor's puller runs, planned without Dagster running (pure helpers)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest

from cdc_dagster.defs.mysql.job import binlog_asset_key, puller_metadata
from cdc_dagster.defs.mysql.requests import (
    CHANGEFEED_TAG,
    PULLER_JOB,
    UPSTREAM_TAG,
    PullBounds,
    PullerTarget,
    puller_run_request,
    pullers_to_run,
)
from cdc_dagster.metastore.changefeeds import ChangefeedState
from cdc_dagster.services.dagster_home import render_dagster_yaml
from scheduler_core.ts import compose

MYSQL = "mysql://cdc:${CDC_PW}@db1:3306/?server-id=4242&changelog=/var/cl/a"


def _cf(cf_id: str, uri: str, state: ChangefeedState = ChangefeedState.NORMAL) -> object:
    return SimpleNamespace(
        changefeed_id=cf_id,
        info=SimpleNamespace(upstream_uri=uri),
        status=SimpleNamespace(state=state),
    )


def test_only_running_mysql_changefeeds_without_a_run_in_flight_or_a_backoff_get_one() -> None:
    feeds = [
        _cf("b", MYSQL),
        _cf("a", MYSQL.replace("4242", "7")),
        _cf("warn", MYSQL.replace("4242", "8"), ChangefeedState.WARNING),
        _cf("gen", "changelog:///var/cl/gen"),
        _cf("paused", MYSQL, ChangefeedState.STOPPED),
        _cf("failed", MYSQL, ChangefeedState.FAILED),
        _cf("busy", MYSQL),
        _cf("waits", MYSQL),
    ]
    assert pullers_to_run(feeds, busy={"busy"}, backing_off={"waits"}) == [
        PullerTarget("a", "db1:3306/7"),
        PullerTarget("b", "db1:3306/4242"),
        PullerTarget("warn", "db1:3306/8"),
    ]


def test_run_request_is_tagged_per_upstream_without_credentials() -> None:
    literal = "mysql://cdc:s3cret@db1:3306/?server-id=4242&changelog=/x"
    (target,) = pullers_to_run([_cf("shop", literal)], busy=set())
    req = puller_run_request(target, owner_rev=12, tick=40, bounds=PullBounds(20.0))
    assert req.job_name == PULLER_JOB and req.run_key == "mysql:shop:12:40"
    assert req.tags[UPSTREAM_TAG] == "db1:3306/4242" and req.tags[CHANGEFEED_TAG] == "shop"
    assert req.run_config == {
        "ops": {"pull_binlog": {"config": {"changefeed_id": "shop", "max_seconds": 20.0}}}
    }
    assert "s3cret" not in repr(req)


def test_pull_bounds_from_the_environment() -> None:
    assert PullBounds.from_env({}) == PullBounds()
    assert PullBounds.from_env({"CDC_DAGSTER_MYSQL_PULL_S": "5"}) == PullBounds(5.0)


def test_run_metadata_is_plottable() -> None:
    stats = SimpleNamespace(row_events=500, transactions=5, ddls=1, snapshot_rows=0,
                            resolved_ts=compose(1_700_000_000_000), position="0-1-99")  # fmt: skip
    md = puller_metadata(stats, seconds=2.0, now_s=1_700_000_003.5)
    assert md["row_events_per_s"].value == 250.0 and md["resolved_lag_seconds"].value == 3.5
    assert md["binlog_position"].value == "0-1-99" and md["row_events"].value == 500
    assert binlog_asset_key("shop-1") == dg.AssetKey(["mysql_binlog", "shop_1"])


def test_dagster_yaml_limits_two_runs_per_capture_and_two_pullers_per_upstream(
    tmp_path: Path,
) -> None:
    yaml = pytest.importorskip("yaml")
    text = render_dagster_yaml(tmp_path / "storage")
    limits = yaml.safe_load(text)["concurrency"]["runs"]["tag_concurrency_limits"]
    per_value = {"applyLimitPerUniqueValue": True}
    # the working run and its successor waiting in its first op (cdc_dagster/defs/handoff.py)
    assert {"key": "dagster/partition", "value": per_value, "limit": 2} in limits
    assert {"key": UPSTREAM_TAG, "value": per_value, "limit": 2} in limits
    (tmp_path / "dagster.yaml").write_text(text)
    instance = dg.DagsterInstance.from_config(str(tmp_path))  # Dagster accepts the config
    try:
        assert instance.get_settings("concurrency")["runs"]["tag_concurrency_limits"] == limits
    finally:
        instance.dispose()

"""A puller run of a paused changefeed holds (connection closed) until a resume, then pulls
again in the same run; a resume with another configuration, a removal, a failure or the
hold's end ends the run."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

import cdc_dagster.defs.mysql.job as job
from cdc_dagster.metastore.changefeeds import ChangefeedState
from cdc_dagster.metastore.errors import ChangefeedNotFoundError, MetastoreError
from cdc_dagster.mysql.context import PullerStats

CF = "feed"
INFO = SimpleNamespace(upstream_uri="mysql://u@h:3306/?server-id=7&changelog=/tmp/x",
                       table_filter=("db.*",))  # fmt: skip


class Feeds:
    """A changefeed whose state and info the test changes while the run looks at it."""

    def __init__(self) -> None:
        self.state, self.info, self.gone, self.down = ChangefeedState.NORMAL, INFO, False, False
        self.gets = 0

    def get(self, cf_id: str) -> Any:
        self.gets += 1
        if self.gone:
            raise ChangefeedNotFoundError(cf_id)
        if self.down:
            raise MetastoreError("etcd unreachable")
        return SimpleNamespace(
            changefeed_id=cf_id, info=self.info, status=SimpleNamespace(state=self.state)
        )


class Pulls:
    """run_puller's stand-in: one pull = rows until its stop predicate says stop."""

    def __init__(self) -> None:
        self.pulls = 0

    def __call__(self, cfg: Any, stop_after: Any) -> PullerStats:
        self.pulls += 1
        n = self.pulls
        stats = PullerStats(position=f"pos-{n}")
        while not stop_after(stats):
            stats.row_events += 1
            time.sleep(0.01)
        stats.position = f"pos-{n}"
        return stats


@pytest.fixture
def setup(monkeypatch: pytest.MonkeyPatch) -> Any:
    feeds, pulls = Feeds(), Pulls()
    ms = SimpleNamespace(changefeeds=feeds)
    monkeypatch.setattr("cdc_dagster.mysql.puller.run_puller", pulls)
    monkeypatch.setattr("cdc_dagster.upstream.uri.changelog_path", lambda uri: "/tmp/x")
    monkeypatch.setattr(job, "EtcdResnapshotRequests", lambda *a: None)
    monkeypatch.setattr(job, "RESUME_POLL_S", 0.02)
    context = SimpleNamespace(log=logging.getLogger("test-pause-hold"))
    cf = feeds.get(CF)
    return feeds, pulls, ms, context, cf


def _pull(setup: Any, max_seconds: float = 30.0) -> tuple[PullerStats, float]:
    _, _, ms, context, cf = setup
    config = job.PullConfig(changefeed_id=CF, max_seconds=max_seconds)
    started = time.monotonic()
    stop = job.FollowStop(config, ms, check_s=0.05)
    stats = job._pull(context, config, ms, cf, stop)
    return stats, time.monotonic() - started


def _later(seconds: float, fn: Any) -> None:
    threading.Timer(seconds, fn).start()


def test_a_paused_changefeed_resumed_pulls_again_in_the_same_run(setup, monkeypatch):
    feeds, pulls, *_ = setup
    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PAUSE_HOLD_S", "30")
    _later(0.3, lambda: setattr(feeds, "state", ChangefeedState.STOPPED))
    _later(0.8, lambda: setattr(feeds, "state", ChangefeedState.NORMAL))
    _later(1.3, lambda: setattr(feeds, "gone", True))
    stats, took = _pull(setup)
    assert pulls.pulls == 2  # one pull before the pause, one after the resume
    assert stats.position == "pos-2" and stats.row_events > 0
    assert took < 10  # ended by the removal, not by the hold or the follow time


def test_a_resume_with_another_configuration_ends_the_run(setup, monkeypatch):
    feeds, pulls, *_ = setup
    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PAUSE_HOLD_S", "30")
    other = SimpleNamespace(upstream_uri=INFO.upstream_uri, table_filter=("db.t1",))

    def update_and_resume() -> None:
        feeds.info, feeds.state = other, ChangefeedState.NORMAL

    _later(0.3, lambda: setattr(feeds, "state", ChangefeedState.STOPPED))
    _later(0.8, update_and_resume)
    stats, took = _pull(setup)
    assert pulls.pulls == 1 and stats.position == "pos-1"
    assert took < 10


@pytest.mark.parametrize("then", ["failed", "removed", "hold over"])
def test_the_run_ends_when_the_paused_changefeed_fails_is_removed_or_stays_paused(
    setup, monkeypatch, then
):
    feeds, pulls, *_ = setup
    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PAUSE_HOLD_S", "1" if then == "hold over" else "30")
    _later(0.3, lambda: setattr(feeds, "state", ChangefeedState.STOPPED))
    if then == "failed":
        _later(0.8, lambda: setattr(feeds, "state", ChangefeedState.FAILED))
    elif then == "removed":
        _later(0.8, lambda: setattr(feeds, "gone", True))
    _, took = _pull(setup)
    assert pulls.pulls == 1
    assert took < 10


def test_etcd_away_during_the_hold_is_waited_out(setup, monkeypatch):
    feeds, pulls, *_ = setup
    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PAUSE_HOLD_S", "30")
    _later(0.3, lambda: setattr(feeds, "state", ChangefeedState.STOPPED))
    _later(0.6, lambda: setattr(feeds, "down", True))
    _later(1.0, lambda: setattr(feeds, "down", False))
    _later(1.1, lambda: setattr(feeds, "state", ChangefeedState.NORMAL))
    _later(1.6, lambda: setattr(feeds, "gone", True))
    _, took = _pull(setup)
    assert pulls.pulls == 2
    assert took < 10


def test_no_hold_without_a_budget_or_past_the_follow_time(setup, monkeypatch):
    feeds, pulls, *_ = setup
    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PAUSE_HOLD_S", "0")
    _later(0.3, lambda: setattr(feeds, "state", ChangefeedState.STOPPED))
    _, took = _pull(setup)
    assert pulls.pulls == 1 and took < 5
    # a hold never outlasts the run's follow time
    feeds.state = ChangefeedState.NORMAL
    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PAUSE_HOLD_S", "300")
    _later(0.2, lambda: setattr(feeds, "state", ChangefeedState.STOPPED))
    _, took = _pull(setup, max_seconds=1.5)
    assert took < 5

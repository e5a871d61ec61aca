"""One owner sensor evaluation ticks the owner again on what changes in etcd
(``defs/owner/wait.py``), on a real etcd: following captures' answers (played by a thread
that takes the mailbox and writes its agent state as the two tick halves do), a resume, a
lost election, etcd going away. Bounds are generous: these check behaviour, not timing."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from cdc_dagster import admin
from cdc_dagster.defs import build_definitions
from cdc_dagster.defs.catalog import Catalog, TableRef
from cdc_dagster.defs.owner import sensor as sensor_module
from cdc_dagster.defs.owner.mailbox import MailboxOutbox
from cdc_dagster.defs.owner.wait import OwnerWaiter
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.metastore import Metastore, connect
from cdc_dagster.metastore.client import Put
from cdc_dagster.runtime import OwnerStep
from cdc_dagster.testing.dagster import evaluate_sensor

HEARTBEAT = {"cf": [{"type": "heartbeat"}]}


# ------------------------------------------------------------------ answers (was settle)
def _tick_halves(ms: Metastore, capture: str, delay_s: float, halves: list[bool]) -> None:
    """A following run: after ``delay_s`` it takes its mailbox, then writes its agent state
    once per half (``in_tick`` True after prepare, False after commit), 0.3 s apart."""
    time.sleep(delay_s)
    assert ms.mailbox.take(capture, 7) == HEARTBEAT
    for in_tick in halves:
        time.sleep(0.3)
        value = json.dumps({"v": 1, "in_tick": in_tick}).encode()
        ms.client.txn([], [Put(ms.layout.agent_state("cf", capture), value)])


def _held(ms: Metastore, capture: str) -> tuple[MailboxOutbox, int]:
    """Messages held for ``capture`` by owner_rev 7, and the revision before the put."""
    before = ms.client.get_prefix(ms.layout.prefix).revision
    box = MailboxOutbox(ms.mailbox)
    box.new_owner(7)
    box.hold(capture, HEARTBEAT)
    return box, before


def test_an_answer_wakes_the_owner_once_the_tick_that_took_the_mailbox_finished(
    metastore: Metastore,
) -> None:
    ms = metastore
    old = json.dumps({"v": 1, "in_tick": False}).encode()  # its last tick, before the put
    ms.client.txn([], [Put(ms.layout.agent_state("cf", "c1"), old)])
    box, revision = _held(ms, "c1")
    run = threading.Thread(target=_tick_halves, args=(ms, "c1", 0.3, [True, False]))
    started = time.monotonic()
    run.start()
    waiter = OwnerWaiter(ms, 7, started + 10, general=False)
    try:
        why = waiter.next(revision, started, {"c1": ("cf",)}, box.marks)
    finally:
        waiter.close()
    waited = time.monotonic() - started
    run.join()
    assert why == "captures answered"
    assert 0.9 <= waited < 3, waited  # the take (0.3 s), prepare and commit (0.3 s each)


def test_waiting_for_answers_ends_at_the_deadline_when_nobody_takes_the_mailbox(
    metastore: Metastore,
) -> None:
    box, revision = _held(metastore, "c2")
    started = time.monotonic()
    waiter = OwnerWaiter(metastore, 7, started + 0.5, general=False)
    assert waiter.next(revision, started, {"c2": ("cf",)}, box.marks) is None
    waiter.close()
    assert 0.5 <= time.monotonic() - started < 1.5
    assert metastore.mailbox.held("c2") == 1  # still there for the capture's next run


def test_a_tick_between_its_halves_is_no_answer(metastore: Metastore) -> None:
    box, revision = _held(metastore, "c3")
    _tick_halves(metastore, "c3", 0.0, [True])
    started = time.monotonic()
    waiter = OwnerWaiter(metastore, 7, started + 0.5, general=False)
    assert waiter.next(revision, started, {"c3": ("cf",)}, box.marks) is None
    waiter.close()


def test_without_a_budget_nothing_but_answers_is_waited_for(metastore: Metastore) -> None:
    started = time.monotonic()
    waiter = OwnerWaiter(metastore, 7, started + 5, general=False)
    assert waiter.next(0, started, {}, {}) is None
    waiter.close()
    assert time.monotonic() - started < 0.5


# ------------------------------------------------------------------ the sensor
@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def _env(
    monkeypatch: pytest.MonkeyPatch, endpoints: list[str], cluster_id: str, wait_s: float
) -> None:
    monkeypatch.setenv("CDC_DAGSTER_ETCD", ",".join(endpoints))
    monkeypatch.setenv("CDC_DAGSTER_CLUSTER_ID", cluster_id)
    monkeypatch.setenv("CDC_DAGSTER_OWNER_ID", "dagster-test")
    monkeypatch.setenv("CDC_DAGSTER_OWNER_WAIT_S", str(wait_s))
    CdcResource.forget_owner_loops()


def _paused_changefeed(ms: Metastore, instance: dg.DagsterInstance, tmp_path: Path) -> Catalog:
    """A paused changefeed over a change log without tables, and capture c1 (its partition
    known)."""
    from cdc_dagster.upstream.changelog import ChangeLogWriter
    from cdc_dagster.upstream.uri import changelog_uri
    from scheduler_core.ts import compose

    log = ChangeLogWriter(tmp_path / "cl")
    log.advance_ddl_resolved(compose(int(time.time() * 1000) + 3_600_000))  # no DDL to wait for
    log.close()
    ms.changefeeds.create(
        "cf", f"delta://{tmp_path}/sink", upstream_uri=changelog_uri(tmp_path / "cl")
    )
    ms.changefeeds.pause("cf")
    admin.add_capture(ms, "c1")
    instance.add_dynamic_partitions("captures", ["c1"])
    return Catalog.of([TableRef(1, "bank", "a", "cf")], changefeeds=["cf"])


def _evaluate(catalog: Catalog, instance: dg.DagsterInstance, cursor: str = "0") -> dg.SensorResult:
    defs = build_definitions(catalog)
    sensor = defs.get_repository_def().get_sensor_def("cdc_owner")
    return evaluate_sensor(sensor, instance, cursor=cursor, definitions=defs)


def _recording_steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, OwnerStep]]:
    """Every owner step of the evaluation, with when it ended."""
    steps: list[tuple[float, OwnerStep]] = []
    real = sensor_module.owner_step

    def step(loop: object) -> OwnerStep:
        s = real(loop)  # type: ignore[arg-type]
        steps.append((time.monotonic(), s))
        return s

    monkeypatch.setattr(sensor_module, "owner_step", step)
    return steps


def _after(delay_s: float, action: object) -> threading.Thread:
    def run() -> None:
        time.sleep(delay_s)
        action()  # type: ignore[operator]

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_resume_during_the_wait_is_ticked_on_in_the_same_evaluation(
    etcd_endpoints: list[str], cluster_id: str, metastore: Metastore, instance: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    """The paused changefeed is resumed 1 s into a 10 s wait: the owner's next step, which
    rebuilds it and heartbeats its capture under the new epoch, comes at once, and its run
    request ends the evaluation (runs launch only once it returned)."""
    _env(monkeypatch, etcd_endpoints, cluster_id, 10)
    catalog = _paused_changefeed(metastore, instance, tmp_path)
    steps = _recording_steps(monkeypatch)
    resumed: list[float] = []
    started = time.monotonic()
    thread = _after(
        1.0, lambda: (metastore.changefeeds.resume("cf"), resumed.append(time.monotonic()))
    )
    result = _evaluate(catalog, instance, cursor="4")
    took = time.monotonic() - started
    thread.join()
    assert "cf" not in steps[0][1].tick.changefeeds  # paused: nothing held, not scheduled
    rebuilt = [(at, s) for at, s in steps if (t := s.tick.changefeeds.get("cf")) and t.rebuilt]
    assert rebuilt, [s.tick.changefeeds for _, s in steps]
    assert rebuilt[0][0] - resumed[0] < 1.0  # noticed at once, not at the daemon's next wake
    (run,) = result.run_requests
    assert run.partition_key == "c1"
    assert result.cursor == str(4 + len(steps)) and run.run_key.endswith(f":{result.cursor}")
    assert took < 5.0, took  # returned with the run, long before the budget


def test_an_evaluation_with_runs_to_launch_returns_without_waiting(
    etcd_endpoints: list[str], cluster_id: str, metastore: Metastore, instance: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    _env(monkeypatch, etcd_endpoints, cluster_id, 10)
    catalog = _paused_changefeed(metastore, instance, tmp_path)
    metastore.changefeeds.resume("cf")
    steps = _recording_steps(monkeypatch)
    started = time.monotonic()
    result = _evaluate(catalog, instance)
    assert len(result.run_requests) == 1 and len(steps) == 1
    assert time.monotonic() - started < 5.0


def test_an_idle_evaluation_waits_its_budget_and_reports_its_one_step(
    etcd_endpoints: list[str], cluster_id: str, metastore: Metastore, instance: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    _env(monkeypatch, etcd_endpoints, cluster_id, 1.0)
    catalog = _paused_changefeed(metastore, instance, tmp_path)
    steps = _recording_steps(monkeypatch)
    started = time.monotonic()
    result = _evaluate(catalog, instance, cursor="2")
    took = time.monotonic() - started
    assert len(steps) == 1 and result.cursor == "3" and not result.run_requests
    assert result.skip_reason.skip_message.startswith("owner (owner_rev")
    assert 1.0 <= took < 4.0, took


def test_losing_the_election_mid_wait_ends_the_evaluation(
    etcd_endpoints: list[str], cluster_id: str, metastore: Metastore, instance: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    _env(monkeypatch, etcd_endpoints, cluster_id, 10)
    catalog = _paused_changefeed(metastore, instance, tmp_path)
    steps = _recording_steps(monkeypatch)
    thread = _after(1.0, lambda: metastore.client.delete(metastore.layout.owner))
    started = time.monotonic()
    result = _evaluate(catalog, instance)
    took = time.monotonic() - started
    thread.join()
    assert len(steps) == 1 and result.cursor == "1"
    assert 1.0 <= took < 5.0, took


def test_etcd_stopping_mid_wait_ends_the_evaluation_normally(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from cdc_dagster.testing.etcd import EmbeddedEtcd, EtcdTuning

    server = EmbeddedEtcd(tmp_path / "etcd", tuning=EtcdTuning.for_tests())
    server.start()
    try:
        _env(monkeypatch, server.endpoints, "stopping", 10)
        with connect(server.endpoints, cluster_id="stopping", retry_timeout_s=5.0) as ms:
            catalog = _paused_changefeed(ms, instance, tmp_path)
        steps = _recording_steps(monkeypatch)
        thread = _after(1.0, server.stop)
        started = time.monotonic()
        result = _evaluate(catalog, instance)
        took = time.monotonic() - started
        thread.join()
    finally:
        server.stop()
    assert len(steps) == 1 and result.cursor == "1" and not result.run_requests
    assert 1.0 <= took < 8.0, took

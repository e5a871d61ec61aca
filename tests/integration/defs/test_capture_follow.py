"""A capture run that follows its mailbox: one run per capture ticks many times.

Real etcd, real OwnerLoop through the sensor, the capture job executed in process (in a
thread, as the daemon's run worker would) with a local Spark session. While the runs are
in progress the sensor requests no other capture run: it puts the owner's messages in the
mailboxes, and the runs' follow ops take them and tick, until every table replicates.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_dagster.testing.dagster import evaluate_sensor, owner_ticked

pytest.importorskip("cdc_dagster.pipeline.executor")

from test_capture_job import _first_create, _workload, spark  # noqa: F401 - a fixture

from cdc_dagster import admin
from cdc_dagster.defs import build_definitions
from cdc_dagster.defs.capture import handoff
from cdc_dagster.defs.catalog import catalog_from_changelog
from cdc_dagster.defs.owner.stale_runs import REGISTRATION_TAG
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.metastore import Metastore

FOLLOW_S = 25.0


@pytest.mark.slow
def test_one_run_per_capture_follows_the_owner_until_every_table_replicates(
    tmp_path: Path,
    metastore: Metastore,
    etcd_endpoints: list[str],
    cluster_id: str,
    monkeypatch: pytest.MonkeyPatch,
    spark: object,  # noqa: F811 - the imported fixture
) -> None:
    changelog = tmp_path / "changelog"
    for name, value in {
        "ETCD": ",".join(etcd_endpoints),
        "CLUSTER_ID": cluster_id,
        "STATE_DIR": str(tmp_path / "state"),
        "CHANGELOG": str(changelog),
        "OWNER_ID": "owner-1",
        "CAPTURE_LOOP_S": str(FOLLOW_S),
    }.items():
        monkeypatch.setenv(f"CDC_DAGSTER_{name}", value)
    CdcResource.forget_owner_loops()
    # Runs execute in threads of this process here (each is its own process in a
    # deployment): Dagster's per-run logging setup (dictConfig under the logging module's
    # lock) deadlocks against another run's handler emitting; no YAML handlers, no dictConfig.
    monkeypatch.setattr(dg.DagsterInstance, "get_yaml_python_handlers", lambda self: [])
    workload = _workload(changelog)
    admin.create_changefeed(
        metastore,
        "cf",
        f"delta://{tmp_path / 'lake'}",
        start_ts=_first_create(changelog),
        upstream_uri=f"changelog://{changelog}",
    )
    for c in ("c1", "c2"):
        admin.add_capture(metastore, c)
    catalog = catalog_from_changelog(changelog, 2000)
    defs = build_definitions(catalog)
    sensor = defs.get_repository_def().get_sensor_def("cdc_owner")
    job = defs.get_job_def("capture_tick")
    results: list[dg.ExecuteInProcessResult] = []
    running: dict[str, threading.Thread] = {}
    keys = catalog.replica_keys()

    def replicating(instance: dg.DagsterInstance) -> bool:
        events = [instance.get_latest_materialization_event(k) for k in keys]
        return all(
            e is not None and e.asset_materialization.metadata["state"].value == "replicating"
            for e in events
        )

    with dg.instance_for_test() as instance:
        cursor = None
        deadline = time.monotonic() + 150
        while not replicating(instance) and time.monotonic() < deadline:
            result = evaluate_sensor(sensor, instance, cursor=cursor, definitions=defs)
            cursor = result.cursor
            assert owner_ticked(result), result.skip_reason
            for req in result.dynamic_partitions_requests or []:
                instance.add_dynamic_partitions("captures", list(req.partition_keys))
            for run in result.run_requests:
                assert run.job_name == "capture_tick"
                assert run.run_config["ops"]["follow"]["config"]["seconds"] == FOLLOW_S
                # Never a second run while the capture's run follows its mailbox, but
                # its successor as it is about to end (defs/capture/handoff.py).
                previous = running.get(run.partition_key)
                if previous is not None and previous.is_alive():
                    (ending,) = [
                        r for r in instance.get_runs(
                            dg.RunsFilter(tags={"dagster/partition": run.partition_key})
                        ) if r.status == dg.DagsterRunStatus.STARTED
                    ]  # fmt: skip
                    until = handoff.follow_until(ending)
                    assert until is not None, run.partition_key
                    assert until - time.time() < handoff.handoff_s(FOLLOW_S), until
                    assert run.run_config["ops"]["receive"]["config"]["messages_json"] == "{}"

                def execute(run: dg.RunRequest = run) -> None:
                    results.append(
                        job.execute_in_process(
                            run_config=run.run_config,
                            partition_key=run.partition_key,
                            instance=instance,
                            raise_on_error=False,
                        )
                    )

                running[run.partition_key] = threading.Thread(target=execute)
                running[run.partition_key].start()
                time.sleep(1.0)  # the run records itself as started
            workload.step()  # type: ignore[attr-defined]
            workload.advance_resolved()  # type: ignore[attr-defined]
            time.sleep(1.0)
        assert replicating(instance), "tables did not reach replicating"
        for t in running.values():
            t.join(timeout=120)
        # Every run ticked more than once: the later ticks' messages came by the mailbox.
        assert 2 <= len(results) <= 8, len(results)
        more, summaries = {}, []
        for out in results:
            assert out.success, [e.message for e in out.all_events if e.is_failure]
            (summary,) = [
                e.user_message
                for e in instance.all_logs(out.run_id)
                if e.user_message and "more tick(s)" in e.user_message
            ]
            more[out.run_id] = int(summary.split(" more tick(s)")[0].split()[-1])
            summaries.append(summary)
        # Each capture's first run (not the first two to end: a successor launched as the
        # loop ended may stop, tickless, before the other capture's first run ends).
        firsts = [
            instance.get_runs(dg.RunsFilter(tags={"dagster/partition": c}))[-1].run_id
            for c in ("c1", "c2")
        ]
        assert min(more[r] for r in firsts) >= 3, summaries  # why each run stopped
        # The owner read the follow ticks' reports: the checkpoint passed the start.
        status = metastore.changefeeds.get("cf").status
        assert status.checkpoint_ts > _first_create(changelog)
        assert metastore.mailbox.held("c1") + metastore.mailbox.held("c2") <= 4


@dataclass
class _OneCapture:
    """A changelog changefeed ``cf`` into Delta, one capture ``c1``, the definitions."""

    changelog: Path
    workload: object
    defs: dg.Definitions
    sink: Any
    schemas: list[Any]

    def sunk(self, table: Any) -> int:
        return self.sink.committed("cf", table).committed_ts

    def step(self) -> int:
        """One more upstream transaction step, resolved; the new resolved ts."""
        self.workload.step()  # type: ignore[attr-defined]
        return self.workload.advance_resolved()  # type: ignore[attr-defined]


def _one_capture(
    tmp_path: Path,
    metastore: Metastore,
    etcd_endpoints: list[str],
    cluster_id: str,
    monkeypatch: pytest.MonkeyPatch,
    loop_s: float,
) -> _OneCapture:
    from cdc_dagster.sinks.uri import open_sink
    from cdc_dagster.upstream.changelog import ChangeLog

    changelog = tmp_path / "changelog"
    for name, value in {
        "ETCD": ",".join(etcd_endpoints),
        "CLUSTER_ID": cluster_id,
        "STATE_DIR": str(tmp_path / "state"),
        "CHANGELOG": str(changelog),
        "OWNER_ID": "owner-1",
        "CAPTURE_LOOP_S": str(loop_s),
    }.items():
        monkeypatch.setenv(f"CDC_DAGSTER_{name}", value)
    monkeypatch.setattr(dg.DagsterInstance, "get_yaml_python_handlers", lambda self: [])
    CdcResource.forget_owner_loops()
    workload = _workload(changelog)
    admin.create_changefeed(
        metastore,
        "cf",
        f"delta://{tmp_path / 'lake'}",
        start_ts=_first_create(changelog),
        upstream_uri=f"changelog://{changelog}",
    )
    admin.add_capture(metastore, "c1")
    return _OneCapture(
        changelog,
        workload,
        build_definitions(catalog_from_changelog(changelog, 2000)),
        open_sink(f"delta://{tmp_path / 'lake'}"),
        list(ChangeLog(changelog).tables_at(1 << 62).values()),
    )


@pytest.mark.slow
def test_a_following_capture_sinks_new_data_without_waiting_for_an_owner_tick(
    tmp_path: Path,
    metastore: Metastore,
    etcd_endpoints: list[str],
    cluster_id: str,
    monkeypatch: pytest.MonkeyPatch,
    spark: object,  # noqa: F811 - the imported fixture
) -> None:
    """Once the tables replicate, the sensor stops ticking; the upstream goes on. The runs
    tick on their own when the change log resolves further, and sink past the last barrier
    the owner sent (it was open past the DDL stream): the downstream follows the upstream."""
    from cdc_dagster.upstream.changelog import ChangeLog

    one = _one_capture(tmp_path, metastore, etcd_endpoints, cluster_id, monkeypatch, 60)
    start = _first_create(one.changelog)

    def sunk() -> int:
        return min(one.sunk(t) for t in one.schemas)

    with dg.instance_for_test() as instance:
        daemon = _Daemon(one.defs, instance)
        deadline = time.monotonic() + 120
        while sunk() <= start and time.monotonic() < deadline:
            daemon.tick()
            one.step()
            time.sleep(1.0)
        assert sunk() > start, "the tables never replicated"
        # No more owner ticks from here on: its last barrier is at most what it read then.
        last_owner_view = ChangeLog(one.changelog).ddl_resolved_ts()
        for _ in range(3):
            top = one.step()
            time.sleep(1.0)
        assert top > last_owner_view
        deadline = time.monotonic() + 30
        while sunk() < top and time.monotonic() < deadline:
            time.sleep(0.5)
        assert sunk() >= top, (sunk(), top, last_owner_view)
        daemon.join(timeout=90)
        assert all(out.success for out in daemon.results)
        lines = [
            e.user_message for out in daemon.results for e in instance.all_logs(out.run_id)
        ]  # fmt: skip
        assert any("(new resolved data)" in (line or "") for line in lines)


@pytest.mark.slow
@pytest.mark.parametrize(
    "leave", ["owner_resigns", "capture_removed", "registered_again", "run_canceling"]
)
def test_follow_stops_early_when_its_owner_or_its_capture_is_gone(
    leave: str,
    tmp_path: Path,
    metastore: Metastore,
    etcd_endpoints: list[str],
    cluster_id: str,
    monkeypatch: pytest.MonkeyPatch,
    spark: object,  # noqa: F811 - the imported fixture
) -> None:
    for name, value in {
        "ETCD": ",".join(etcd_endpoints),
        "CLUSTER_ID": cluster_id,
        "STATE_DIR": str(tmp_path / "state"),
    }.items():
        monkeypatch.setenv(f"CDC_DAGSTER_{name}", value)
    monkeypatch.setattr("cdc_dagster.defs.capture.job.RENEW_S", 0.5)
    session = metastore.election.try_campaign("owner-1", ttl_s=30)
    admin.add_capture(metastore, "c1")
    job = build_definitions(catalog_from_changelog(None, 2000)).get_job_def("capture_tick")
    config = {"capture_id": "c1", "owner_rev": session.owner_rev, "messages_json": "{}"}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("captures", ["c1"])
        out: list[dg.ExecuteInProcessResult] = []
        run = threading.Thread(
            target=lambda: out.append(
                job.execute_in_process(
                    run_config={
                        "ops": {
                            "receive": {"config": config},
                            "follow": {"config": {"seconds": 60}},
                        }
                    },
                    partition_key="c1",
                    instance=instance,
                )
            )
        )
        started = time.monotonic()
        run.start()
        # Past the first tick, into the follow loop: the follow op tags the run with when
        # its loop ends as the loop begins (a fixed 8 s here waited ~4 s longer than that).
        deadline = started + 60
        while time.monotonic() < deadline and not any(
            handoff.follow_until(r) is not None for r in instance.get_runs()
        ):
            time.sleep(0.2)
        assert run.is_alive()
        (running,) = instance.get_runs()
        assert handoff.follow_until(running) is not None, "the run never reached its loop"
        # The run says which registration it works under (the owner retires only runs of
        # an expired one: cdc_dagster/defs/owner/stale_runs.py).
        assert running.tags[REGISTRATION_TAG] == metastore.captures.attach("c1").epoch
        if leave == "owner_resigns":
            session.resign()
        elif leave == "run_canceling":  # the owner retired it, or a person in the UI
            instance.report_run_canceling(running)
        elif leave == "capture_removed":
            admin.remove_capture(metastore, "c1")
        else:  # what the owner does once a frozen run let the lease expire
            new = metastore.captures.register("c1", 60, keepalive=False)
        run.join(timeout=30)
        assert not run.is_alive() and time.monotonic() - started < 45
        (summary,) = [
            e.user_message
            for e in instance.all_logs(out[0].run_id)
            if e.user_message and "more tick(s)" in e.user_message
        ]
        want = {
            "owner_resigns": "no longer the owner",
            "capture_removed": "no longer registered",
            "registered_again": "was registered again",
            "run_canceling": "marked canceling",
        }[leave]
        assert want in summary, summary
        if leave == "registered_again":  # the run left the new registration alone
            assert metastore.captures.attach("c1").epoch == new.epoch


class _Daemon:
    """The daemon's part, in this process: evaluate the owner sensor, launch each run it
    asks for in a thread (its own process in a deployment)."""

    def __init__(self, defs: dg.Definitions, instance: dg.DagsterInstance) -> None:
        self.sensor = defs.get_repository_def().get_sensor_def("cdc_owner")
        self.job = defs.get_job_def("capture_tick")
        self.defs, self.instance, self.cursor = defs, instance, None
        self.results: list[dg.ExecuteInProcessResult] = []
        self.threads: list[threading.Thread] = []

    def tick(self) -> None:
        result = evaluate_sensor(
            self.sensor, self.instance, cursor=self.cursor, definitions=self.defs
        )
        self.cursor = result.cursor
        for req in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions("captures", list(req.partition_keys))
        for run in result.run_requests:

            def execute(run: dg.RunRequest = run) -> None:
                self.results.append(
                    self.job.execute_in_process(
                        run_config=run.run_config,
                        partition_key=run.partition_key,
                        instance=self.instance,
                        raise_on_error=False,
                    )
                )

            self.threads.append(threading.Thread(target=execute))
            self.threads[-1].start()

    def join(self, timeout: float = 120) -> None:
        for t in self.threads:
            t.join(timeout=timeout)


@pytest.mark.slow
def test_a_table_fenced_between_owner_ticks_is_taken_up_again(
    tmp_path: Path,
    metastore: Metastore,
    etcd_endpoints: list[str],
    cluster_id: str,
    monkeypatch: pytest.MonkeyPatch,
    spark: object,  # noqa: F811 - the imported fixture
) -> None:
    """A following run's own tick finds a table fenced at the sink (another holder took its
    token) and stops it. The report saying so is one etcd key the run's next ticks
    overwrite, several times between two owner ticks (5 s apart, as the daemon runs the
    sensor): the owner must still learn the table left and give it out again, and the
    table replicates again without anyone stepping in."""
    from cdc_dagster.upstream.changelog import ChangeLog

    one = _one_capture(tmp_path, metastore, etcd_endpoints, cluster_id, monkeypatch, 40)

    def run_until(done: Callable[[], bool], seconds: float, owner_every_s: float) -> None:
        deadline, last_owner = time.monotonic() + seconds, 0.0
        while not done() and time.monotonic() < deadline:
            if time.monotonic() - last_owner >= owner_every_s:
                daemon.tick()
                last_owner = time.monotonic()
            one.step()
            time.sleep(1.0)

    with dg.instance_for_test() as instance:
        daemon = _Daemon(one.defs, instance)
        start = _first_create(one.changelog)
        run_until(lambda: min(one.sunk(t) for t in one.schemas) > start, 120, 1.0)
        assert min(one.sunk(t) for t in one.schemas) > start, "the tables never replicated"
        victim = one.schemas[0]
        token = one.sink.acquire("cf", victim)  # another holder: the next write is fenced
        fenced_at = ChangeLog(one.changelog).ddl_resolved_ts()
        run_until(lambda: one.sunk(victim) > fenced_at, 90, 5.0)
        assert one.sunk(victim) > fenced_at, "the fenced table was never taken up again"
        assert one.sink.committed("cf", victim).token > token  # acquired anew
        daemon.join()  # each run follows for CAPTURE_LOOP_S


@pytest.mark.slow
def test_the_next_run_takes_over_as_the_ending_one_stops_never_beside_it(
    tmp_path: Path,
    metastore: Metastore,
    etcd_endpoints: list[str],
    cluster_id: str,
    monkeypatch: pytest.MonkeyPatch,
    spark: object,  # noqa: F811 - the imported fixture
) -> None:
    """The rollover (defs/capture/handoff.py): the sensor requests the capture's next run
    while the ending one still follows; launched at once here (as the run queue does with
    two runs allowed per capture), it waits in receive; the ending run ticks past its time
    until the next one has started, then stops; the next one's first tick comes right after
    its last. No tick of one run overlaps a tick of the other, the downstream keeps up.
    The first run is catching up (a table behind, as in a backlog's drain): it puts its end
    off, and its successor, started, waits until it caught up."""
    from cdc_dagster.defs import handoff as lanes
    from cdc_dagster.defs.capture import job as capture_job
    from cdc_dagster.pipeline import background

    loop_s = 12.0
    monkeypatch.setattr(handoff, "HANDOFF_S", 6.0)
    monkeypatch.setattr(lanes, "EXTEND_STEP_S", 3.0)
    monkeypatch.setattr(lanes, "EXTEND_MAX_S", 6.0)
    # a table is behind (tests/unit/defs/test_handoff_catch_up.py: which is) until the first
    # run holds its successor back
    catching_up = ["db.t of cf1 99 s behind"]
    real = capture_job._Follow.catching_up
    monkeypatch.setattr(capture_job._Follow, "catching_up",
                        lambda self: catching_up[0] or real(self))  # fmt: skip
    one = _one_capture(tmp_path, metastore, etcd_endpoints, cluster_id, monkeypatch, loop_s)
    start = _first_create(one.changelog)
    # when a run asked for its bulk workers to start once a CPU is idle, and when they
    # were started (background.warm_when_idle, background.warm)
    asked: list[float] = []
    warmed: list[float] = []
    real_warm, real_when_idle = background.warm, background.warm_when_idle

    def warm(workers: bool = True) -> None:
        warmed.append(time.time())
        real_warm(workers)

    def warm_when_idle(max_wait_s: float, idle_cores: float = 1.0, workers: bool = True) -> None:
        asked.append(time.time())
        real_when_idle(max_wait_s, idle_cores, workers)

    monkeypatch.setattr(background, "warm", warm)
    monkeypatch.setattr(background, "warm_when_idle", warm_when_idle)
    with dg.instance_for_test() as instance:
        daemon = _Daemon(one.defs, instance)
        deadline = time.monotonic() + 150
        while len(daemon.threads) < 3 and time.monotonic() < deadline:
            daemon.tick()
            one.step()
            time.sleep(0.5)
            if catching_up[0] and any(
                "handing over once caught up" in (e.user_message or "")
                for r in instance.get_runs()
                for e in instance.all_logs(r.run_id)
            ):
                time.sleep(1.0)  # it goes on ticking meanwhile
                catching_up[0] = ""  # caught up
        assert len(daemon.threads) >= 3, "no third run: the handoffs did not happen"
        assert not catching_up[0], "the first run never held its started successor back"
        top = one.step()
        deadline = time.monotonic() + 60
        while min(one.sunk(t) for t in one.schemas) < top and time.monotonic() < deadline:
            daemon.tick()
            time.sleep(0.5)
        assert min(one.sunk(t) for t in one.schemas) >= top > start
        daemon.join(timeout=120)
        assert all(out.success for out in daemon.results), [
            e.message for out in daemon.results for e in out.all_events if e.is_failure
        ]
        runs = sorted(
            instance.get_run_records(dg.RunsFilter(job_name="capture_tick")),
            key=lambda r: r.storage_id,
        )
        spans, logs = [], {}
        for r in runs:
            events = instance.all_logs(r.dagster_run.run_id)
            logs[r.dagster_run.run_id] = [e.user_message or "" for e in events]
            # each tick's span: a step's start to its end, and each follow tick's log line
            # (logged as it ends, with its seconds)
            ticks = []
            for e in events:
                msg = e.user_message or ""
                follow_tick = msg.startswith("tick ") and " s (prepare " in msg
                if msg.startswith("commit took") or follow_tick:
                    ticks.append(e.timestamp)
            spans.append((r.dagster_run.run_id, ticks))
        # Never beside each other: the next run's first tick ended after the earlier run's
        # last one, and soon after it (no launch in between); it had waited in receive for
        # the earlier run, which handed over to it by name.
        for (before, b_ticks), (after, a_ticks) in itertools.pairwise(spans):
            if not a_ticks or not b_ticks:
                continue
            assert a_ticks[0] > b_ticks[-1], (before, after, a_ticks[0] - b_ticks[-1])
            assert a_ticks[0] - b_ticks[-1] < 8.0, a_ticks[0] - b_ticks[-1]
            assert any("waiting for its earlier run" in m for m in logs[after]), logs[after]
            # its bulk workers were asked for before it waited (started once a CPU is idle),
            # not once its loop began: a backlog at the handover does not wait for them
            waited = next(e.timestamp for e in instance.all_logs(after)
                          if "waiting for its earlier run" in (e.user_message or ""))  # fmt: skip
            began = instance.get_run_record_by_id(after).start_time
            assert any(began - 1.0 <= t <= waited for t in asked), (began, waited, asked)
            assert any(t >= began - 1.0 for t in warmed), (began, warmed)
            summary = [m for m in logs[before] if "more tick(s)" in m]
            assert summary and f"handed over to run {after}" in summary[0], summary
        # the first run, catching up, put its end off by 3 s at a time, at most 6 s in all
        # (twice, unless a loaded machine kept its loop out of one 3-s window), then held
        # its started successor back until it caught up
        first = logs[runs[0].dagster_run.run_id]
        put_off = [m for m in first if m.startswith("catching up (db.t of cf1 99 s behind)")]
        assert put_off and len(put_off) <= 2, put_off
        for n, m in enumerate(put_off, 1):
            assert f", {3 * n} s past its time (at most 6 s)" in m, put_off
        second = runs[1].dagster_run.run_id
        held = [m for m in first if "handing over once caught up" in m]
        assert held == [
            f"the capture's next run {second} has started; handing over once caught up "
            "(db.t of cf1 99 s behind; at most 60 s past this run's time)"
        ], held
        # A run's first tick's materializations are logged by its follow op, beside the
        # loop, none by its report op (which the loop waited for).
        firsts = []
        for r in runs:
            mats = instance.all_logs(
                r.dagster_run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
            )
            assert not [e for e in mats if e.step_key == "report"]
            (first,) = [m for m in logs[r.dagster_run.run_id] if "the first tick's" in m]
            firsts.append(int(first.split("first tick's ")[1].split()[0]))
            assert len([e for e in mats if e.step_key == "follow"]) >= firsts[-1], first


def _two_changefeeds(
    tmp_path: Path,
    metastore: Metastore,
    etcd_endpoints: list[str],
    cluster_id: str,
    monkeypatch: pytest.MonkeyPatch,
    loop_s: float,
) -> _OneCapture:
    """``_one_capture`` plus a second changefeed ``cf2`` of the same change log; runs with
    no successor to wait for at their end, that never put their end off (a table more than
    ``BEHIND_S`` behind on a loaded machine would make a run *catching up*: tested by the
    rollover test above and tests/unit/defs/test_handoff_catch_up.py; here it would outlive
    the owner, whose sensor these tests stop ticking), and ticking on each step, busy or not."""
    from cdc_dagster.defs import handoff as lanes
    from cdc_dagster.defs.capture import job as capture_job

    one = _one_capture(tmp_path, metastore, etcd_endpoints, cluster_id, monkeypatch, loop_s)
    admin.create_changefeed(
        metastore,
        "cf2",
        f"delta://{tmp_path / 'lake2'}",
        start_ts=_first_create(one.changelog),
        upstream_uri=f"changelog://{one.changelog}",
    )
    monkeypatch.setattr(capture_job, "HANDOFF_MAX_S", 0.0)
    monkeypatch.setattr(lanes, "EXTEND_MAX_S", 0.0)
    monkeypatch.setattr(capture_job, "IDLE_TICK_S", 0.5)
    return one


def _tick_starts(
    monkeypatch: pytest.MonkeyPatch, changefeed_id: str, ends: list[float] | None = None
) -> list[float]:
    """A list that gets the time (monotonic) each follow tick of ``changefeed_id`` starts;
    ``ends`` gets when each ended."""
    from cdc_dagster.defs.capture import job as capture_job

    starts: list[float] = []
    real = capture_job._follow_tick

    def tick(*args: Any) -> Any:
        if args[3] != changefeed_id:
            return real(*args)
        starts.append(time.monotonic())
        try:
            return real(*args)
        finally:
            if ends is not None:
                ends.append(time.monotonic())

    monkeypatch.setattr(capture_job, "_follow_tick", tick)
    return starts


@pytest.mark.slow
def test_at_its_end_a_run_ticks_the_other_changefeeds_while_a_long_tick_finishes(
    tmp_path: Path,
    metastore: Metastore,
    etcd_endpoints: list[str],
    cluster_id: str,
    monkeypatch: pytest.MonkeyPatch,
    spark: object,  # noqa: F811 - the imported fixture
) -> None:
    """Winding down (defs/capture/job.py ``follow``): when the loop's time is up while one
    changefeed's tick is long in flight (a snapshot's 1M-row slice: 10-18 s under load), the
    run waits for it -- and meanwhile the other changefeeds go on ticking, instead of none
    ticking until it ends (the lag spikes of the capture's rollover)."""
    from cdc_dagster.defs.capture import job as capture_job

    one = _two_changefeeds(tmp_path, metastore, etcd_endpoints, cluster_id, monkeypatch, 14.0)
    until: dict[str, float] = {}
    real = capture_job._follow_tick

    def slow_cf2(*args: Any) -> Any:
        # a tick of cf2 starting in the last 4 s of the loop lasts until 4 s past its end
        end = until.get("t")
        if args[3] == "cf2" and end is not None and end - 4 < time.time() < end:
            time.sleep(end + 4 - time.time())
        return real(*args)

    monkeypatch.setattr(capture_job, "_follow_tick", slow_cf2)
    with dg.instance_for_test() as instance:
        daemon = _Daemon(one.defs, instance)
        daemon.tick()
        deadline = time.monotonic() + 90
        first_id = ""
        while time.monotonic() < deadline:
            one.step()
            time.sleep(0.5)
            runs = instance.get_runs(dg.RunsFilter(job_name="capture_tick"))
            tagged = [r for r in runs if handoff.follow_until(r) is not None]
            if tagged and "t" not in until:
                first = min(tagged, key=lambda r: handoff.follow_until(r) or 0.0)
                first_id, until["t"] = first.run_id, handoff.follow_until(first) or 0.0
            if first_id and instance.get_run_by_id(first_id).is_finished:  # type: ignore[union-attr]
                break
            if "t" not in until:
                daemon.tick()  # until the run follows: its tables dispatched, cf2 served
        assert first_id, "the run never followed"
        daemon.join(timeout=60)
        end = until["t"]
        ticks: dict[str, list[float]] = {"cf": [], "cf2": []}
        summary = ""
        for e in instance.all_logs(first_id):
            msg = e.user_message or ""
            if msg.startswith("tick ") and " s (prepare " in msg:
                ticks[msg.split(" message(s) of ")[1].split(";")[0]].append(e.timestamp)
            if "more tick(s)" in msg:
                summary = msg
        assert "stopped: time is up" in summary, summary
        last_cf2 = max(ticks["cf2"])
        assert last_cf2 > end + 3, (last_cf2 - end, "cf2's long tick was not in flight")
        # cf ticked on (several times) while cf2's tick went on past the loop's end
        during = [t for t in ticks["cf"] if end + 0.5 < t < last_cf2]
        assert len(during) >= 3, ([round(t - end, 2) for t in ticks["cf"]], last_cf2 - end)


@pytest.mark.slow
def test_a_changefeed_ticks_on_while_another_ones_materializations_are_written_slowly(
    tmp_path: Path,
    metastore: Metastore,
    etcd_endpoints: list[str],
    cluster_id: str,
    monkeypatch: pytest.MonkeyPatch,
    spark: object,  # noqa: F811 - the imported fixture
) -> None:
    """The ticks' materializations are written beside the follow loop
    (defs/capture/event_writer.py): on a loaded machine a snapshot's changefeed finished a
    tick with 50 tables whose event-log writes took ~2.5 s, and the loop, writing them
    itself, started no other changefeed's tick meanwhile (the stream's lag spikes). Here
    each write of cf2's materializations takes 3 s: cf's ticks still start meanwhile."""
    one = _two_changefeeds(tmp_path, metastore, etcd_endpoints, cluster_id, monkeypatch, 16.0)
    started = _tick_starts(monkeypatch, "cf")
    slow: list[tuple[float, float]] = []  # cf2's materialization writes, begin and end
    with dg.instance_for_test() as instance:
        handle = instance.handle_new_event

        def slow_cf2(event: Any, *args: Any, **kwargs: Any) -> Any:
            dagster_event = event.dagster_event
            if dagster_event is not None and dagster_event.is_step_materialization:
                md = dagster_event.step_materialization_data.materialization.metadata
                if getattr(md.get("changefeed"), "value", "") == "cf2":
                    t0 = time.monotonic()
                    time.sleep(3.0)
                    slow.append((t0, time.monotonic()))
            return handle(event, *args, **kwargs)

        monkeypatch.setattr(instance, "handle_new_event", slow_cf2)
        daemon = _Daemon(one.defs, instance)
        daemon.tick()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(slow) < 3:
            one.step()
            time.sleep(0.5)
            daemon.tick()
        while time.monotonic() < deadline and any(t.is_alive() for t in daemon.threads):
            one.step()
            time.sleep(0.5)
        daemon.join(timeout=60)
    assert len(slow) >= 3, slow  # cf2's materializations were written (slowly)
    during = [t for t in started if any(a + 0.2 < t < b for a, b in slow)]
    # cf ticked while cf2's events were being written, not only between the writes
    assert len(during) >= 3, (len(started), len(slow))


@pytest.mark.slow
def test_while_a_served_changefeeds_snapshot_is_read_each_tick_rests_after_the_last(
    tmp_path: Path,
    metastore: Metastore,
    etcd_endpoints: list[str],
    cluster_id: str,
    monkeypatch: pytest.MonkeyPatch,
    spark: object,  # noqa: F811 - the imported fixture
) -> None:
    """``CDC_DAGSTER_SNAPSHOT_YIELD_S`` (defs/capture/job.py ``_Follow``): while a snapshot
    of a changefeed the run serves is being read (its change log's snapshot bell rung in the
    last ``READING_S``, as a chunk reader rings it), each of a changefeed's ticks starts that
    long after its last one ended; once the reads end, they come as often as before. The
    upstream changes every half second throughout."""
    from cdc_dagster.upstream.changelog import READING_S, snapshot_bell

    yield_s = 2.5
    monkeypatch.setenv("CDC_DAGSTER_SNAPSHOT_YIELD_S", str(yield_s))
    one = _two_changefeeds(tmp_path, metastore, etcd_endpoints, cluster_id, monkeypatch, 40.0)
    ended: list[float] = []
    ticks = _tick_starts(monkeypatch, "cf", ended)
    bell = snapshot_bell(one.changelog)
    bell.parent.mkdir(parents=True, exist_ok=True)

    def upstream_for(seconds: float, ring: bool) -> tuple[float, float]:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            one.step()
            if ring:  # a reader wrote a chunk
                with open(bell, "ab") as f:
                    f.write(b".")
            time.sleep(0.5)
        return t0, time.monotonic()

    with dg.instance_for_test() as instance:
        daemon = _Daemon(one.defs, instance)
        daemon.tick()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(ticks) < 3:  # the run follows
            one.step()
            time.sleep(0.5)
            daemon.tick()
        assert len(ticks) >= 3, "the run never followed"
        before = upstream_for(6.0, ring=False)
        reading = upstream_for(12.0, ring=True)
        upstream_for(READING_S + 0.5, ring=False)  # the reads' last chunk ages out
        after = upstream_for(6.0, ring=False)
        daemon.join(timeout=90)
        lines = [e.user_message or "" for out in daemon.results
                 for e in instance.all_logs(out.run_id)]  # fmt: skip
    assert all(out.success for out in daemon.results)

    def gaps(window: tuple[float, float], margin: float = 0.0) -> list[float]:
        starts = [t for t in ticks if window[0] + margin <= t <= window[1]]
        return [b - a for a, b in itertools.pairwise(starts)]

    quiet, read, again = gaps(before), gaps(reading, margin=1.0), gaps(after)
    assert len(quiet) >= 3 and len(again) >= 3, (quiet, again)
    assert len(read) >= 2, read
    assert min(read) >= yield_s - 0.05, (read, quiet)
    # ... and each of them started that long after the one before it ended
    rests = [t - max(e for e in ended if e < t) for t in ticks
             if reading[0] + 1.0 <= t <= reading[1]]  # fmt: skip
    assert rests and min(rests) >= yield_s - 0.05, rests
    # before and after the reads, ticks came as often as the upstream changed
    assert sorted(quiet)[len(quiet) // 2] < yield_s - 0.5, quiet
    assert sorted(again)[len(again) // 2] < yield_s - 0.5, again
    assert any("a snapshot is being read; each changefeed's tick starts 2.5 s after its last"
               in line for line in lines), lines  # fmt: skip
    assert any("the snapshot's reads ended" in line for line in lines)

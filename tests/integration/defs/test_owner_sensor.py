"""The owner sensor evaluated with build_sensor_context + instance_for_test over a real etcd."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from cdc_dagster import admin
from cdc_dagster.defs import build_definitions
from cdc_dagster.defs.catalog import demo_catalog
from cdc_dagster.defs.owner import sensor as sensor_module
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.metastore import Metastore
from cdc_dagster.runtime import OwnerStep, OwnerTick
from cdc_dagster.testing.dagster import evaluate_sensor

CATALOG = demo_catalog([(1, "bank", "a"), (2, "bank", "b")])


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, etcd_endpoints: list[str], cluster_id: str) -> None:
    monkeypatch.setenv("CDC_DAGSTER_ETCD", ",".join(etcd_endpoints))
    monkeypatch.setenv("CDC_DAGSTER_CLUSTER_ID", cluster_id)
    monkeypatch.setenv("CDC_DAGSTER_OWNER_ID", "dagster-test")
    CdcResource.forget_owner_loops()


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def _evaluate(instance: dg.DagsterInstance, cursor: str | None = None) -> dg.SensorResult:
    defs = build_definitions(CATALOG)
    sensor = defs.get_repository_def().get_sensor_def("cdc_owner")
    return evaluate_sensor(sensor, instance, cursor=cursor, definitions=defs)


def _tick_from_etcd(ms: Metastore) -> OwnerStep:
    """What the owner step reports, read from etcd (stands in for owner_step)."""
    owner = ms.election.current_owner()
    if owner is None or owner.owner_id != "dagster-test":
        who = f"{owner.owner_id} (owner_rev {owner.owner_rev})" if owner else "nobody"
        return OwnerStep(
            OwnerTick(False, owner.owner_id if owner else None, 0),
            notes=(f"not the owner: {who} holds the election",),
        )
    captures = tuple(sorted(c.capture_id for c in ms.captures.list_alive()))
    return OwnerStep(
        OwnerTick(True, "dagster-test", owner.owner_rev, captures=captures),
        {captures[0]: {"cf": [{"type": "heartbeat"}]}},
    )


def test_sensor_skips_naming_the_owner_when_another_holds_the_election(
    env: None, instance: dg.DagsterInstance, metastore: Metastore, monkeypatch: pytest.MonkeyPatch
) -> None:
    metastore.election.try_campaign("someone-else", ttl_s=10)
    monkeypatch.setattr(sensor_module, "owner_step", lambda loop: _tick_from_etcd(metastore))
    result = _evaluate(instance)
    assert "someone-else" in result.skip_reason.skip_message


def test_sensor_as_owner_requests_capture_runs_and_adds_partitions(
    env: None, instance: dg.DagsterInstance, metastore: Metastore, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = metastore.election.try_campaign("dagster-test", ttl_s=10)
    admin.add_capture(metastore, "c1")
    admin.add_capture(metastore, "c2")
    monkeypatch.setattr(sensor_module, "owner_step", lambda loop: _tick_from_etcd(metastore))
    result = _evaluate(instance, cursor="4")
    assert result.cursor == "5"
    (run,) = [r for r in result.run_requests]
    assert run.partition_key == "c1" and run.run_key == f"capture:c1:{session.owner_rev}:5"
    (add,) = result.dynamic_partitions_requests
    assert sorted(add.partition_keys) == ["c1", "c2"]


def test_an_owner_tick_that_launches_nothing_says_what_it_saw_instead_of_an_empty_result(
    env: None, instance: dg.DagsterInstance, metastore: Metastore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cdc_dagster.runtime.health import Health
    from cdc_dagster.runtime.owner import ChangefeedTick
    from scheduler_core.messages import Barrier

    session = metastore.election.try_campaign("dagster-test", ttl_s=10)
    changefeeds = {
        cf: ChangefeedTick(cf, 100, 200, Barrier(300), lag, None, 0, False, False)
        for cf, lag in (("demo", 3.25), ("shop", 75.0))
    }
    health = {"shop": Health("no captures are alive: run `cdc-dagster capture add`")}
    step = OwnerStep(
        OwnerTick(True, "dagster-test", session.owner_rev, changefeeds=changefeeds, health=health)
    )
    monkeypatch.setattr(sensor_module, "owner_step", lambda loop: step)
    result = _evaluate(instance, cursor="1")
    assert not result.run_requests
    assert result.skip_reason.skip_message == (
        f"owner (owner_rev {session.owner_rev}), no run to launch: demo lag 3.2 s; shop lag "
        "75.0 s, warning: no captures are alive: run `cdc-dagster capture add`"
    )


def test_admin_requests_are_written_where_the_owner_loop_reads_them(metastore: Metastore) -> None:
    admin.add_capture(metastore, "c1")
    metastore.changefeeds.create("cf", "delta:///tmp/x")
    admin.rebalance(metastore, "cf")
    admin.move_table(metastore, "cf", 3, "c1")
    requests = [r for rs in admin.pending_requests(metastore).values() for r in rs]
    bodies = [body for _, body in requests]
    assert {"op": "rebalance"} in bodies
    assert {"op": "move_table", "table_id": 3, "to": "c1"} in bodies
    keys = [key for key, _ in requests]
    assert all(k.startswith(f"{metastore.layout.prefix}admin/cf/") for k in keys)


def test_messages_for_a_capture_with_a_queued_run_wait_in_its_mailbox_for_that_run(
    env: None, instance: dg.DagsterInstance, metastore: Metastore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queued run takes, when it starts, what the owner sent while it waited (after the
    messages of its own run config); the capture's next run carries only what is newer."""
    import json

    from dagster._core.storage.dagster_run import DagsterRun

    session = metastore.election.try_campaign("dagster-test", ttl_s=10)
    rev = session.owner_rev
    admin.add_capture(metastore, "c1")
    sends = iter(
        [
            [{"type": "dispatch", "n": 1}, {"type": "heartbeat", "n": 1}],
            [{"type": "heartbeat", "n": 2}],
            [{"type": "dispatch", "n": 3}, {"type": "heartbeat", "n": 3}],
            [{"type": "heartbeat", "n": 4}],
        ]
    )
    monkeypatch.setattr(
        sensor_module,
        "owner_step",
        lambda loop: OwnerStep(
            OwnerTick(True, "dagster-test", rev, captures=("c1",)), {"c1": {"cf": next(sends)}}
        ),
    )
    first = _evaluate(instance, cursor="0")
    (run,) = first.run_requests
    queued = DagsterRun(
        job_name="capture_tick",
        status=dg.DagsterRunStatus.NOT_STARTED,
        tags=run.tags | {"dagster/partition": "c1"},
    )
    instance.add_run(queued)
    for cursor in ("1", "2"):  # two ticks while c1's run waits: held, not requested
        assert _evaluate(instance, cursor=cursor).run_requests == []
    assert metastore.mailbox.held("c1") == 2  # dispatch 3 and the newest heartbeat (3)

    instance.add_dynamic_partitions("captures", ["c1"])
    defs = build_definitions(CATALOG)
    out = defs.get_job_def("capture_tick").execute_in_process(
        run_config=run.run_config,
        op_selection=["receive"],
        partition_key="c1",
        instance=instance,
    )
    received = out.output_for_node("receive")
    assert [m["n"] for m in received.messages["cf"]] == [1, 3, 3]  # config, then the mailbox
    assert [m["type"] for m in received.messages["cf"]] == ["dispatch", "dispatch", "heartbeat"]
    assert metastore.mailbox.held("c1") == 0

    instance.delete_run(queued.run_id)  # it started and finished
    (nxt,) = _evaluate(instance, cursor="3").run_requests
    carried = json.loads(nxt.run_config["ops"]["receive"]["config"]["messages_json"])
    assert [m["n"] for m in carried["cf"]] == [4]  # nothing twice


def test_sensor_reports_the_changefeeds_health_check_each_tick(
    env: None, instance: dg.DagsterInstance, metastore: Metastore, tmp_path: Path
) -> None:
    """The checks column is a live view: no capture -> the changefeed's check fails (WARN)
    with the message; a capture -> it passes again, without anyone launching a check."""
    from cdc_dagster.defs.catalog import Catalog, TableRef
    from cdc_dagster.runtime.health import NO_CAPTURES
    from cdc_dagster.upstream.changelog import ChangeLogWriter
    from cdc_dagster.upstream.uri import changelog_uri

    ChangeLogWriter(tmp_path / "cl").close()  # an empty change log
    metastore.changefeeds.create(
        "cf", "delta:///tmp/x", upstream_uri=changelog_uri(tmp_path / "cl")
    )
    catalog = Catalog.of([TableRef(1, "bank", "a", "cf")], changefeeds=["cf"])
    defs = build_definitions(catalog)
    sensor = defs.get_repository_def().get_sensor_def("cdc_owner")

    def health(cursor: str) -> dg.AssetCheckEvaluation:
        result = evaluate_sensor(sensor, instance, cursor=cursor, definitions=defs)
        (check,) = [
            e
            for e in result.asset_events
            if isinstance(e, dg.AssetCheckEvaluation) and e.check_name == "changefeed_healthy"
        ]
        return check

    warned = health("0")
    assert warned.asset_key == dg.AssetKey(["changefeed", "cf"])
    assert not warned.passed and warned.severity == dg.AssetCheckSeverity.WARN
    assert warned.description == NO_CAPTURES
    admin.add_capture(metastore, "c1")
    assert health("1").passed

"""The owner sensor's plan and the DDL gate, without Dagster running."""

from __future__ import annotations

import json

import dagster as dg

from cdc_dagster.defs.catalog import demo_catalog
from cdc_dagster.defs.handoff import AHEAD_TAG
from cdc_dagster.defs.owner.plan import plan
from cdc_dagster.defs.tables.assets import materializations
from cdc_dagster.defs.tables.gate import DdlRequest, gate_status
from cdc_dagster.runtime import OwnerStep, OwnerTick, ReadyDdl, TableProgress
from cdc_dagster.schema import DdlRecord
from scheduler_core.ddl import DDLKind
from scheduler_core.ts import compose

CATALOG = demo_catalog([(1, "bank", "a"), (2, "bank", "b")])
WORK = {"c1": {"cf": [{"type": "heartbeat"}]}, "c2": {"cf": [{"type": "dispatch"}]}}


def owner_view(
    captures: tuple[str, ...] = ("c1", "c2"),
    work: dict = WORK,
    ddls: tuple[ReadyDdl, ...] = (),
    owner_rev: int = 42,
) -> OwnerStep:
    return OwnerStep(OwnerTick(True, "o", owner_rev, captures=captures), work, gated=ddls)


def ready_ddl(commit_ts: int, table_ids: tuple[int, ...]) -> ReadyDdl:
    record = DdlRecord(commit_ts, DDLKind.TRUNCATE_TABLE, "truncate_table", "TRUNCATE a", table_ids)
    return ReadyDdl("cf", record)


def test_not_owner_skips_naming_the_owner() -> None:
    result = plan(
        OwnerStep(
            OwnerTick(False, "dagster-other", 9),
            notes=("not the owner: dagster-other (owner_rev 9) holds the election",),
        ),
        3,
        [],
        CATALOG,
        lambda cf, t: None,
    )
    assert result.skip_reason is not None
    assert "dagster-other" in result.skip_reason.skip_message
    assert not result.run_requests


def test_one_run_per_capture_with_owner_rev_and_tick_in_run_key_and_config() -> None:
    result = plan(owner_view(), 7, ["c1", "c2"], CATALOG, lambda cf, t: None)
    runs = {r.partition_key: r for r in result.run_requests}
    assert set(runs) == {"c1", "c2"}
    assert runs["c1"].run_key == "capture:c1:42:7"
    config = runs["c2"].run_config["ops"]["receive"]["config"]
    assert config["owner_rev"] == 42 and config["tick"] == 7
    assert json.loads(config["messages_json"]) == WORK["c2"]


def test_partitions_follow_captures_joining_and_leaving() -> None:
    result = plan(owner_view(captures=("c1", "c2")), 1, ["c1", "c0"], CATALOG, lambda cf, t: None)
    adds = [
        r
        for r in result.dynamic_partitions_requests
        if isinstance(r, dg.AddDynamicPartitionsRequest)
    ]
    deletes = [
        r
        for r in result.dynamic_partitions_requests
        if isinstance(r, dg.DeleteDynamicPartitionsRequest)
    ]
    assert adds[0].partition_keys == ["c2"] and deletes[0].partition_keys == ["c0"]


def test_capture_without_work_gets_no_run() -> None:
    result = plan(owner_view(work={"c1": WORK["c1"]}), 1, ["c1", "c2"], CATALOG, lambda cf, t: None)
    assert [r.partition_key for r in result.run_requests] == ["c1"]


def test_ddl_run_only_when_checkpoint_metadata_reached_its_commit_ts() -> None:
    ddl = ready_ddl(1000, (1,))
    closed = plan(owner_view(ddls=(ddl,)), 1, ["c1", "c2"], CATALOG, lambda cf, t: {1: 999}.get(t))
    assert all(r.job_name != "apply_ddl" for r in closed.run_requests)
    opened = plan(owner_view(ddls=(ddl,)), 1, ["c1", "c2"], CATALOG, lambda cf, t: {1: 1000}.get(t))
    ddl_runs = [r for r in opened.run_requests if r.job_name == "apply_ddl"]
    assert (
        len(ddl_runs) == 1
        and ddl_runs[0].run_config["ops"]["ddl_gate"]["config"]["commit_ts"] == 1000
    )


def test_global_ddl_waits_for_every_table() -> None:
    ddl = DdlRequest("cf", 1000, ())
    assert gate_status(ddl, CATALOG, lambda cf, t: {1: 1000, 2: 5}.get(t))[0] is False
    is_open, reason = gate_status(ddl, CATALOG, lambda cf, t: {1: 1000, 2: 1000}.get(t))
    assert is_open and "2 table(s)" in reason


def test_materialization_metadata_has_timestamps_raw_ts_and_float_lag() -> None:
    ckpt = compose(1_700_000_000_000)
    reports = [TableProgress("cf", 1, "replicating", "c1", ckpt, ckpt + 5, ckpt + 9, 12)]
    (event,) = materializations(CATALOG, reports, now_ms=1_700_000_002_500)
    md = event.metadata
    assert event.asset_key == dg.AssetKey(["replica", "bank", "a"])
    assert md["checkpoint_ts_raw"].value == ckpt
    assert md["checkpoint_ts"].value == 1_700_000_000.0
    assert md["lag_seconds"].value == 2.5 and isinstance(md["lag_seconds"], dg.FloatMetadataValue)
    assert md["barrier_ts_raw"].value == ckpt + 9
    assert md["rows_applied"].value == 12 and md["capture"].value == "c1"


def test_a_capture_with_a_queued_run_gets_no_new_run_and_its_next_run_carries_every_message() -> (
    None
):
    from cdc_dagster.defs.owner.plan import Outbox

    box = Outbox()
    hb1 = {"type": "heartbeat", "seq": 1}
    d1 = {"type": "dispatch", "seq": 2}
    hb2 = {"type": "heartbeat", "seq": 3}
    d2 = {"type": "dispatch", "seq": 4}
    tick1 = owner_view(work={"c1": {"cf": [hb1, d1]}, "c2": {"cf": [hb1]}})
    result = plan(tick1, 1, ["c1", "c2"], CATALOG, lambda cf, t: None, queued={"c1"}, outbox=box)
    assert [r.partition_key for r in result.run_requests] == ["c2"]
    assert box.held("c1") == 2
    tick2 = owner_view(work={"c1": {"cf": [hb2, d2]}})
    result = plan(tick2, 2, ["c1", "c2"], CATALOG, lambda cf, t: None, queued=set(), outbox=box)
    (run,) = result.run_requests
    carried = json.loads(run.run_config["ops"]["receive"]["config"]["messages_json"])
    # Every dispatch in order; only the newest heartbeat (it supersedes the older one).
    assert carried == {"cf": [d1, hb2, d2]}
    assert box.held("c1") == 0


def test_a_capture_whose_run_is_about_to_end_gets_its_next_run_with_no_messages() -> None:
    """Handoff (defs/capture/handoff.py): the next run is requested now, carrying nothing;
    the owner's messages wait in the mailbox for whichever run ticks first (the ending one
    while it follows, else the next one's receive takes them)."""
    from cdc_dagster.defs.owner.plan import Outbox

    box = Outbox()
    hb = {"type": "heartbeat", "seq": 1}
    step = owner_view(("c1", "c2", "c3"), work={"c1": {"cf": [hb]}, "c2": {"cf": [hb]}})
    result = plan(
        step, 5, ["c1", "c2", "c3"], CATALOG, lambda cf, t: None,
        queued={"c2"}, outbox=box, follow_s=300, handoff={"c1", "c3", "gone"},
    )  # fmt: skip
    runs = {r.partition_key: r for r in result.run_requests}
    # c3 has no work this step but is due its next run all the same; a capture that left
    # gets none; c2's run follows (not ending): nothing for it
    assert set(runs) == {"c1", "c3"}
    for run in runs.values():
        assert run.run_config["ops"]["receive"]["config"]["messages_json"] == "{}"
        assert run.run_config["ops"]["follow"]["config"]["seconds"] == 300
        assert run.tags[AHEAD_TAG] == "1"  # the warm run launcher gives it its newest worker
    assert box.held("c1") == 1 and box.held("c2") == 1
    # a capture's run with work (not a successor) is awaited: no such tag
    result = plan(step, 6, ["c1", "c2", "c3"], CATALOG, lambda cf, t: None, follow_s=300)
    assert {r.partition_key for r in result.run_requests} == {"c1", "c2"}
    assert all(AHEAD_TAG not in r.tags for r in result.run_requests)


def test_the_ahead_tag_is_the_one_the_warm_run_launcher_reads() -> None:
    from cdc_dagster.services import run_launcher

    assert run_launcher.AHEAD_TAG == AHEAD_TAG


def test_held_messages_of_another_owner_rev_or_a_departed_capture_are_dropped() -> None:
    from cdc_dagster.defs.owner.plan import Outbox

    box = Outbox()
    d1 = {"type": "dispatch", "seq": 2}
    plan(
        owner_view(work={"c1": {"cf": [d1]}}),
        1,
        ["c1"],
        CATALOG,
        lambda cf, t: None,
        queued={"c1"},
        outbox=box,
    )
    assert box.held("c1") == 1
    plan(owner_view(owner_rev=43, work={}), 2, ["c1"], CATALOG, lambda cf, t: None, outbox=box)
    assert box.held("c1") == 0
    plan(
        owner_view(owner_rev=43, work={"c1": {"cf": [d1]}}),
        3,
        ["c1"],
        CATALOG,
        lambda cf, t: None,
        queued={"c1"},
        outbox=box,
    )
    plan(
        owner_view(owner_rev=43, captures=("c2",), work={}),
        4,
        ["c1"],
        CATALOG,
        lambda cf, t: None,
        outbox=box,
    )
    assert box.held("c1") == 0


def test_gate_reads_tables_without_an_asset_from_the_owner_view_and_global_ddls_only_current_ones() -> (
    None
):
    from cdc_dagster.defs.tables.gate import checkpoint_lookup

    # Table 9 was created after the catalog was loaded: no asset, the owner's view decides.
    lookup = checkpoint_lookup(CATALOG, lambda key: 500, lambda cf: {9: 400})
    assert lookup("cf", 1) == 500 and lookup("cf", 9) == 400 and lookup("cf", 10) is None
    assert gate_status(DdlRequest("cf", 400, (9,)), CATALOG, lookup)[0]
    assert not gate_status(DdlRequest("cf", 450, (9,)), CATALOG, lookup)[0]
    # A global DDL: every current table (2 was dropped earlier, it blocks nothing).
    lookup = checkpoint_lookup(
        CATALOG, lambda key: 500 if key.path[-1] == "a" else 100, lambda cf: {9: 600}
    )
    assert not gate_status(DdlRequest("cf", 450, ()), CATALOG, lookup)[0]
    assert gate_status(DdlRequest("cf", 450, ()), CATALOG, lookup, {1, 9})[0]


def test_gate_opens_on_the_reported_checkpoint_when_the_materialization_was_lost() -> None:
    from cdc_dagster.defs.tables.gate import checkpoint_lookup

    # The run that committed table 1 up to the DDL was killed before it logged the asset
    # materialization; the table, stopped at the barrier, commits nothing more to report.
    lookup = checkpoint_lookup(CATALOG, lambda key: 100, lambda cf: {1: 450})
    assert lookup("cf", 1) == 450
    assert gate_status(DdlRequest("cf", 450, (1,)), CATALOG, lookup)[0]
    assert not gate_status(DdlRequest("cf", 451, (1,)), CATALOG, lookup)[0]


def _stepped(work: dict, rebuilt: bool = False) -> OwnerStep:
    from cdc_dagster.runtime.owner import ChangefeedTick
    from scheduler_core.messages import Barrier

    cf = ChangefeedTick("cf", 1, 1, Barrier(), 0.0, None, 0, False, rebuilt)
    return OwnerStep(OwnerTick(True, "o", 42, changefeeds={"cf": cf}, captures=("c1", "c2")), work)


HEARTBEATS = {"c1": {"cf": [{"type": "heartbeat"}]}, "c2": {"cf": [{"type": "heartbeat"}]}}


def test_the_owner_ticks_again_soon_only_for_answers_following_captures_give_at_once() -> None:
    from cdc_dagster.defs.owner.plan import awaiting_answers

    following = {"c1", "c2"}
    # A resume rebuilt the changefeed: its captures' first reports let it schedule tables.
    assert awaiting_answers(_stepped(HEARTBEATS, rebuilt=True), following) == {
        "c1": ("cf",),
        "c2": ("cf",),
    }
    # A dispatch (prepare, commit) is answered within the capture's next tick.
    assert awaiting_answers(_stepped(WORK), following) == {"c1": ("cf",), "c2": ("cf",)}
    # Heartbeats only: nothing to act on sooner.
    assert awaiting_answers(_stepped(HEARTBEATS), following) == {}
    # A capture without a following run gets its messages by a run launch: seconds away.
    assert awaiting_answers(_stepped(WORK), {"c1"}) == {}
    # Not the owner.
    assert awaiting_answers(OwnerStep(OwnerTick(False, "x", 1), WORK), following) == {}

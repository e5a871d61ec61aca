"""The capture job: receive -> prepare (phase 1) -> commit (phase 2) -> report -> follow.

Partitioned by capture id; in-process executor and in-memory IO (a tick is short: no
subprocess per op, nothing pickled between ops).

The first four ops are one tick with the messages of the run config. ``follow`` then keeps
the run going for ``seconds`` (the sensor sets ``CDC_DAGSTER_CAPTURE_LOOP_S``, 0: one tick
per run) and ticks again, both halves, with the same Spark session:

- each time the owner's sensor puts messages in the capture's mailbox (it does so, instead
  of requesting another run, while this run is in progress);
- and on its own, without waiting for an owner tick, each time a changefeed it serves has
  new resolved data in its change log (``FrontierWatch``): steady replication needs no
  owner decision (the barrier is open past the DDL stream; syncpoints are split at, not
  waited for), so an upstream commit is in the sink about one tick after the puller
  flushed it. Such ticks come at most every ``SELF_TICK_S``, every ``IDLE_TICK_S`` while
  they find nothing to sink (an idle upstream's heartbeats still move the checkpoints).

Each changefeed ticks in a lane of its own (``ChangefeedLanes``): one tick at a time per
changefeed, the changefeeds side by side, so a long tick of one (a snapshot's tables
released, a Spark job of many seconds) never holds another changefeed's stream.

A run launch costs seconds (a process, the code location, a Spark session); a tick with a
warm session costs about one. Each tick is as durable as a run's (the halves persist the
Agent and the executor), so a run that dies mid-loop is a capture that missed ticks, as
before. The loop stops early when another owner takes over (its messages are not for this
run) or the capture's registration is gone.
"""

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from cdc_dagster.defs.capture.event_writer import EventWriter
from cdc_dagster.defs.capture.fencing import Received, StaleRunError, check_owner_rev
from cdc_dagster.defs.capture.handoff import (
    FOLLOW_UNTIL_TAG,
    HANDOFF_MAX_S,
    HandOver,
    LoopEnd,
    capture_lane,
    wait_for_earlier_runs,
)
from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.owner.plan import CAPTURE_JOB
from cdc_dagster.defs.owner.stale_runs import REGISTRATION_TAG
from cdc_dagster.defs.partitions import CAPTURES
from cdc_dagster.defs.resources import CdcResource, SparkResource
from cdc_dagster.defs.tables.assets import MaterializationThrottle, materializations
from cdc_dagster.metastore.errors import (
    CaptureNotRegisteredError,
    LeaseExpiredError,
    MetastoreError,
)
from cdc_dagster.metastore.mailbox import merge
from cdc_dagster.runtime import (
    CaptureTick,
    ChangefeedLanes,
    FrontierWatch,
    LaneTick,
    TableProgress,
    spark_executor_factory,
)
from cdc_dagster.runtime.lanes import DATA, OWNER

POLL_S = 0.25  # how often an idle follow op looks at the mailbox and the change logs
SELF_TICK_S = 0.5  # the least time between two ticks a capture starts on its own
IDLE_TICK_S = 3.0  # ... while its last one sank nothing (idle upstream: checkpoints only)
RENEW_S = 10.0  # an idle follow op renews the capture's lease this often (ttl 60 s)
OWNER_CHECK_S = 1.0  # and looks whether its owner still is the owner this often
# A changefeed whose tick left a table of it further behind than this (wall clock from its
# checkpoint) and was not idle keeps its run past its time: the run puts its end off and
# hands over once caught up (defs/handoff.py: LoopEnd, HandOver's hold)
BEHIND_S = 10.0
# A run's bulk workers start once a CPU is idle, at most this long after its receive op
# began; its follow op starts them at the latest (its predecessor hands over ~HANDOFF_S =
# 20 s after it was requested, later while it catches up on a backlog: the new workers'
# imports waited 15 s at most before, and fell in the backlog's drain)
WARM_IDLE_MAX_S = 240.0

# A capture run is a tick (seconds; minutes when catching up on a large backlog), then
# follow ticks for CDC_DAGSTER_CAPTURE_LOOP_S (300 s). One still running after this long is
# hung: run monitoring (dagster.yaml) fails it, so it stops holding its capture's slot in
# the run queue; once it is gone its lease expires, the owner moves its tables, and the
# sink's fence refuses any late write of it. One whose lease expired first is stopped by the
# owner at once (cdc_dagster/defs/owner/stale_runs.py).
MAX_RUNTIME_S = 1800


class ReceiveConfig(dg.Config):
    """What the owner sensor put in the run config."""

    capture_id: str
    owner_rev: int
    tick: int = 0
    messages_json: str = "[]"


@dg.op(out=dg.Out(Received, io_manager_key="mem_io"))
def receive(context: dg.OpExecutionContext, config: ReceiveConfig, cdc: CdcResource) -> Received:
    """Fencing: the run's owner is still the owner; the capture is registered; renew its lease."""
    partition = context.partition_key if context.has_partition_key else config.capture_id
    if partition != config.capture_id:
        raise dg.Failure(f"run for partition {partition} carries capture {config.capture_id}")
    # One run of a capture ticks at a time: the next one waits here for the earlier one,
    # which ticks until this one has started (defs/capture/handoff.py).
    lane = capture_lane(config.capture_id)
    _warm_bulk_workers(context, cdc)
    wait_for_earlier_runs(context.instance, lane, context.run_id, context.log.info)
    ms = cdc.metastore()
    try:
        owner = ms.election.current_owner()
        check_owner_rev(config.capture_id, config.owner_rev, owner.owner_rev if owner else None)
        try:
            session = ms.captures.attach(config.capture_id)
            ttl = session.keep_alive()
            tag_registration(context, session.epoch)
        except CaptureNotRegisteredError:
            ttl = 0  # expired: prepare registers it anew (new epoch, empty staging)
        # What the owner sent after this run was requested (while it waited in the queue
        # and launched): its newest heartbeat's barriers, dispatches in order. Taken after
        # the config's messages, which are older (cdc_dagster/metastore/mailbox.py).
        later = ms.mailbox.take(config.capture_id, config.owner_rev)
    except StaleRunError as exc:
        raise dg.Failure(str(exc), allow_retries=False) from exc
    except MetastoreError as exc:
        raise dg.Failure(" ".join(str(exc).split())) from exc
    work = json.loads(config.messages_json)
    context.log.info(
        "capture %s: %s from owner_rev %d (tick %d)%s; lease %s",
        config.capture_id,
        ", ".join(f"{len(m)} message(s) of {cf}" for cf, m in work.items()) or "no messages",
        config.owner_rev,
        config.tick,
        "".join(f", {len(m)} later message(s) of {cf} from the mailbox" for cf, m in later.items()),
        f"renewed, ttl {ttl} s" if ttl else "expired: registering anew",
    )
    return Received(config.capture_id, config.owner_rev, config.tick, ttl, merge(work, later))


def _warm_bulk_workers(
    context: dg.OpExecutionContext, cdc: CdcResource, *, now: bool = False
) -> None:
    """Start the bulk phases' workers of a run that follows while it waits for its
    capture's earlier run, once a CPU is idle (``background.warm_when_idle``; ``now``: at
    once, as its loop begins if not yet): a backlog arriving at a handover (every
    ``CDC_DAGSTER_CAPTURE_LOOP_S``) waited for the new run's workers to start and import
    beside its sink phase (~0.6-0.8 CPU-s each, four of them for two captures on 2 cores:
    throughput bench), and so did one arriving as the new runs started. The run's own
    process pays its first MERGE's set-up then too (``background.warm_here``), with bulk
    phases off as well. The workers are the machine's cores over the captures registered
    (``background.share``; their runs share the machine)."""
    if _follow_seconds(context) <= 0:
        return
    from cdc_dagster.pipeline import background

    workers = cdc.settings().bulk_tick_rows > 0
    if workers and not now:  # the captures sharing the machine's cores: how many workers
        try:
            background.share(len(cdc.metastore().captures.desired()))
        except MetastoreError as exc:  # etcd away for a moment: the default as for one
            context.log.warning("captures not counted (%s): bulk workers as for one", exc)
    if now:
        background.warm(workers)
    else:
        background.warm_when_idle(WARM_IDLE_MAX_S, workers=workers)


def tag_registration(
    context: dg.OpExecutionContext, registration: str, tagged: str | None = None
) -> str:
    """Tag the run with the registration it works under: the owner retires only runs of an
    expired one (cdc_dagster/defs/owner/stale_runs.py), never one that has not attached.
    ``tagged``: what this op tagged last (None: the run's tags as it started; they are not
    refreshed by a write). Returns what the run is tagged with now."""
    before = context.run.tags.get(REGISTRATION_TAG, "") if tagged is None else tagged
    if registration and registration != before:
        context.instance.add_run_tags(context.run_id, {REGISTRATION_TAG: registration})
        return registration
    return before


def capture_tick(
    cdc: CdcResource,
    spark: SparkResource,
    capture_id: str,
    work: dict[str, Any],
    *,
    defer_bulk: bool = False,
) -> CaptureTick:
    """One tick of ``capture_id`` on this run's metastore connection and Spark session.

    ``defer_bulk``: a table with a bulk phase (a snapshot's released table) waits for the
    follow loop's lanes, when a follow loop comes after this tick: a run's first tick (its
    prepare and commit ops, which tick every changefeed together, at each run's start), and
    the ticks a run starts while it winds down for its successor (``follow``)."""
    settings = cdc.settings()
    defer = settings.bulk_tick_rows if defer_bulk and settings.capture_loop_s > 0 else 0
    return CaptureTick(
        cdc.metastore(),
        capture_id,
        work,
        staging_root=settings.staging_dir(),
        # The session only when a tick phase runs a Spark job (not for in-process ticks)
        executor_factory=spark_executor_factory(
            spark.live_session,
            local_max_bytes=settings.local_tick_bytes,
            batch_behind_s=settings.batch_behind_s,
            tick_rows=settings.tick_rows,
            local_max_rows=settings.local_tick_rows,
            bulk_rows=settings.bulk_tick_rows,
            defer_rows=defer,
            sink_duty=settings.sink_duty,
            snapshot_first_s=settings.snapshot_first_s,
        ),
        lease_ttl_s=settings.capture_ttl_s,
    )


@dg.op(out=dg.Out(CaptureTick, io_manager_key="mem_io"))
def prepare(
    context: dg.OpExecutionContext,
    received: Received,
    cdc: CdcResource,
    spark: SparkResource,
) -> CaptureTick:
    """Phase 1: pull, sort and mount into the capture's staging, up to resolved ts."""
    started = time.perf_counter()
    capture = capture_tick(cdc, spark, received.capture_id, received.messages, defer_bulk=True)
    lines = capture.prepare()
    context.log.info(_took("prepare", time.perf_counter() - started, lines))
    return capture


def _took(half: str, seconds: float, lines: list[str]) -> str:
    """One log message for a tick's half and its lines: a line per table, each its own
    event, took ~1-2 s of event-log writes at a run's first tick with ~100 tables, which
    the stream's next tick waited for (the run's follow loop starts after it)."""
    return "\n".join([f"{half} took {seconds:.2f} s", *(f"{half} {line}" for line in lines)])


@dg.op(out=dg.Out(list[TableProgress], io_manager_key="mem_io"))
def commit(context: dg.OpExecutionContext, capture: CaptureTick) -> list[TableProgress]:
    """Phase 2: sink staged changes up to min(resolved, barrier), advance checkpoints, report."""
    started = time.perf_counter()
    lines, progress = capture.commit()
    context.log.info(_took("commit", time.perf_counter() - started, lines))
    return progress


def _follow_seconds(context: dg.OpExecutionContext) -> float:
    """The follow op's ``seconds`` in this run's config (0: the run does not follow)."""
    ops = (context.run_config or {}).get("ops", {})
    return float(((ops.get("follow") or {}).get("config") or {}).get("seconds", 0.0) or 0.0)


def build_report_op(catalog: Catalog) -> dg.OpDefinition:
    """The report op: one asset materialization per replicated table (or schema group)."""

    @dg.op(name="report", out=dg.Out(list, io_manager_key="mem_io"))
    def report(
        context: dg.OpExecutionContext, received: Received, progress: list[TableProgress]
    ) -> list[dg.AssetMaterialization]:
        """Progress into the replicated tables' metadata (the DDL gate reads it). In a run
        that follows, the follow op logs them from its first moment, beside its loop: a
        materialization is one event-log write (~10-40 ms), and a capture holding 100 tables
        kept the stream unticked 1-4 s at each run's start while this op wrote them."""
        events = materializations(catalog, progress, time.time_ns() // 1_000_000)
        if _follow_seconds(context) > 0:
            context.log.info("%d table(s) to report as %d asset event(s), by the follow op",
                             len(progress), len(events))  # fmt: skip
            return events
        for event in events:
            context.log_event(event)
        context.log.info("reported %d table(s) as %d asset event(s)", len(progress), len(events))
        return []

    return report


class FollowConfig(dg.Config):
    """How long the run goes on ticking after its first tick (the sensor sets it)."""

    seconds: float = 0.0  # 0: one tick per run


class _Follow:
    """The follow loop's state: what to tick next, and when each changefeed last ticked on
    its own."""

    def __init__(
        self, context: dg.OpExecutionContext, cdc: CdcResource, received: Received
    ) -> None:
        self.context = context
        self.ms, self.cid, self.rev = cdc.metastore(), received.capture_id, received.owner_rev
        self.serving = set(received.messages)  # changefeeds the owner sent this capture
        self.watch = FrontierWatch(self.ms)
        self.watch.moved(self.serving)  # what the first tick has seen already
        self.last_self_tick: dict[str, float] = {}
        # while a snapshot of a served changefeed is read, a changefeed's tick starts this
        # long after its last one ended
        self.yield_s = cdc.settings().snapshot_yield_s
        self.yielding = False  # (logged when it begins and ends)
        self.ended: dict[str, float] = {}  # when each changefeed's last tick ended
        self.idle: dict[str, bool] = {}  # the changefeed's last tick of its own sank nothing
        self.behind: dict[str, str] = {}  # why each changefeed catches up ("" it does not)
        # The registration this run ticks under: a run frozen (SIGSTOP, a stalled VM) past
        # the lease that wakes once the capture is registered again must not tick beside
        # the new registration's run; it stops (its own ticks re-registering move it on).
        try:
            self.registration = self.ms.captures.attach(self.cid).epoch
        except (CaptureNotRegisteredError, LeaseExpiredError):
            self.registration = ""
        self.tagged = tag_registration(context, self.registration)

    def next_work(self, busy: set[str]) -> tuple[dict[str, Any], str]:
        """The owner's messages if any, else the changefeeds not ``busy`` with new resolved
        data (when a tick of their own is due); and why."""
        work = self.ms.mailbox.take(self.cid, self.rev)
        if work:
            self.serving |= set(work)
            return work, OWNER
        now = time.monotonic()
        due = [
            cf
            for cf in self.serving - busy
            if now - self.last_self_tick.get(cf, 0.0)
            >= (IDLE_TICK_S if self.idle.get(cf) else SELF_TICK_S)
        ]
        moved = self.watch.moved(due)
        for cf in moved:
            self.last_self_tick[cf] = now
        return {cf: [] for cf in moved}, DATA

    def not_before(self) -> dict[str, float]:
        """When each changefeed's next tick may start (``ChangefeedLanes.start``): while a
        snapshot of a changefeed this run serves is read, ``snapshot_yield_s`` after its
        last tick ended, whatever the tick is for (the owner's messages too: they came
        after every tick, each a barrier further); else at once (empty)."""
        if self.yield_s <= 0:
            return {}
        reading = self.watch.reading(self.serving)
        if bool(reading) != self.yielding:
            self.yielding = bool(reading)
            if reading:
                self.context.log.info(
                    "changefeed(s) %s: a snapshot is being read; each changefeed's tick starts "
                    "%.1f s after its last one ended until the reads end "
                    "(CDC_DAGSTER_SNAPSHOT_YIELD_S)",
                    ", ".join(reading), self.yield_s)  # fmt: skip
            else:
                self.context.log.info("the snapshot's reads ended; ticks start at once again")
        if not reading:
            return {}
        return {cf: end + self.yield_s for cf, end in self.ended.items()}

    def ticked(
        self, why: str, cf: str, capture: CaptureTick, progress: list[TableProgress], before: int
    ) -> None:
        self.ended[cf] = time.monotonic()
        self.idle[cf] = idle_after(why, progress, before, self.idle.get(cf, False))
        self.behind[cf] = "" if self.idle[cf] else behind(cf, progress, time.time_ns() // 10**6)
        if cf in capture.removed:  # `changefeed remove`: nothing left to tick for it
            self.serving.discard(cf)
            self.watch.forget(cf)
            self.behind.pop(cf, None)
        for outcome in capture.prepared.values():  # the registration its tick attached to
            self.registration = outcome.registration
        # One run-storage write when the registration changes, not one per tick.
        self.tagged = tag_registration(self.context, self.registration, self.tagged)

    def catching_up(self) -> str:
        """Why this run is catching up (a changefeed's table behind after its last tick, see
        :func:`behind`), "" when it is not."""
        return next((why for why in self.behind.values() if why), "")

    def canceling(self) -> bool:
        """Whether this run was marked canceling (by the owner, or a person in the UI)."""
        run = self.context.instance.get_run_by_id(self.context.run_id)
        return run is not None and run.status == dg.DagsterRunStatus.CANCELING


@dataclass(frozen=True, slots=True)
class _Ticked:
    """One changefeed's follow tick, both halves."""

    capture: CaptureTick
    prepare_lines: list[str]
    commit_lines: list[str]
    progress: list[TableProgress]
    prepare_s: float
    commit_s: float


def _follow_tick(
    cdc: CdcResource,
    spark: SparkResource,
    capture_id: str,
    cf: str,
    messages: list[Any],
    defer_bulk: bool,
) -> _Ticked:
    """One tick of one changefeed, in its lane's thread."""
    t0 = time.perf_counter()
    capture = capture_tick(cdc, spark, capture_id, {cf: messages}, defer_bulk=defer_bulk)
    prepare_lines = capture.prepare()
    t1 = time.perf_counter()
    commit_lines, progress = capture.commit()
    return _Ticked(
        capture, prepare_lines, commit_lines, progress, t1 - t0, time.perf_counter() - t1
    )


def _tick_line(n: int, done: LaneTick[_Ticked], ticked: _Ticked, logged: int, events: int) -> str:
    """The log line of a follow tick: why, what it took, and its halves' lines."""
    why = "owner's messages" if done.why == OWNER else "new resolved data"
    lines = [
        *(f"prepare {x}" for x in ticked.prepare_lines),
        *(f"commit {x}" for x in ticked.commit_lines),
    ]
    return (
        f"tick {n} ({why}): {len(done.messages)} message(s) of {done.changefeed_id}; "
        f"{logged} of {events} asset event(s); {done.seconds:.2f} s (prepare "
        f"{ticked.prepare_s:.2f} s, commit {ticked.commit_s:.2f} s)\n" + "\n".join(lines)
    )


def idle_after(why: str, progress: Sequence[TableProgress], before: int, idle: bool) -> bool:
    """Whether a changefeed's ticks of its own come only every ``IDLE_TICK_S`` after a tick
    of it (``why``; ``before``: its tables' rows applied before it; ``idle``: as before it):
    a tick on new data that sank nothing and left nothing to sink -- no table gathering a
    backlog (checkpoint below what it staged) or on its way in (preparing, prepared) --
    makes it idle; any tick that finds it busy makes it busy. A tick on the owner's
    messages never makes it idle: after `changefeed resume`, a tick on the first resolved
    data came before the owner had added the tables back (nothing to sink), and with only
    data ticks deciding, the backlog's last rows waited up to 3 s for the next one (1.3 s of
    a 5.6-s drain: throughput bench)."""
    busy = (
        sum(p.rows_applied for p in progress) != before
        or any(p.checkpoint_ts < p.resolved_ts for p in progress if p.state == "replicating")
        or any(p.state in ("preparing", "prepared") for p in progress)
    )
    return not busy and (why == DATA or idle)


def behind(cf: str, progress: Sequence[TableProgress], now_ms: int) -> str:
    """Why changefeed ``cf`` is catching up after a tick of it that was not idle ("" when it
    is not): its table furthest behind, of those more than ``BEHIND_S`` behind (from its
    checkpoint's wall time to ``now_ms``) with something left to catch up: rows resolved past
    its checkpoint, or on its way in (preparing, prepared; one waiting for its snapshot has
    no checkpoint yet). A table that has sunk all the change log holds is not behind, however
    old its checkpoint (an upstream's clock, a test's made-up timestamps)."""
    worst, lag = None, BEHIND_S
    for p in progress:
        left = (p.state == "replicating" and p.checkpoint_ts < p.resolved_ts) or p.state in (
            "preparing",
            "prepared",
        )
        if left and p.lag_s(now_ms) > lag:
            worst, lag = p, p.lag_s(now_ms)
    if worst is None:
        return ""
    name = worst.name or f"table {worst.table_id}"
    if worst.checkpoint_ts:
        return f"{name} of {cf} {lag:.0f} s behind"
    return f"{name} of {cf} {worst.state}, not replicating yet"


def _still_ours(f: _Follow, state: dict[str, float]) -> str:
    """Why the loop must stop ("" while its owner is the owner and the capture registered):
    the owner checked every OWNER_CHECK_S, the lease renewed every RENEW_S (a tick renews
    it too)."""
    now = time.monotonic()
    if now - state["owner_checked"] >= OWNER_CHECK_S:
        if f.canceling():
            return "the run was marked canceling"
        owner = f.ms.election.current_owner()
        if owner is None or owner.owner_rev != f.rev:
            return f"owner_rev {f.rev} is no longer the owner"
        try:
            now_registered = f.ms.captures.attach(f.cid).epoch
        except (CaptureNotRegisteredError, LeaseExpiredError):
            return f"capture {f.cid} is no longer registered"
        if f.registration and now_registered != f.registration:
            return (
                f"capture {f.cid} was registered again (epoch {now_registered}) since this "
                f"run ticked under epoch {f.registration}: the new registration's run goes on"
            )
        state["owner_checked"] = now
    if now - state["renewed"] >= RENEW_S:
        try:
            f.ms.captures.attach(f.cid).keep_alive()
        except (CaptureNotRegisteredError, LeaseExpiredError):
            return f"capture {f.cid} is no longer registered"
        state["renewed"] = now
    return ""


TIME_UP = HandOver.TIME_UP


def build_follow_op(catalog: Catalog) -> dg.OpDefinition:
    """The follow op: more ticks, from the mailbox or on new data, until ``seconds`` passed."""

    @dg.op(name="follow", ins={"reported": dg.In(list)})
    def follow(
        context: dg.OpExecutionContext,
        config: FollowConfig,
        received: Received,
        reported: list[dg.AssetMaterialization],
        cdc: CdcResource,
        spark: SparkResource,
    ) -> None:
        """Tick again on the owner's messages and on new resolved data, for ``seconds``;
        ``reported``: the first tick's materializations, logged beside the loop."""
        if config.seconds <= 0:  # (the report op logged the first tick's itself)
            context.log.info("one tick per run (follow seconds = 0)")
            return
        f = _Follow(context, cdc, received)
        started = time.monotonic()
        _warm_bulk_workers(context, cdc, now=True)  # (started already, unless still waiting)
        # When this loop ends: the owner requests the capture's next run shortly before
        end = LoopEnd(started, config.seconds)
        context.instance.add_run_tags(
            context.run_id, {FOLLOW_UNTIL_TAG: f"{end.wall(started):.3f}"}
        )
        state = {"renewed": started, "owner_checked": 0.0}
        # past its time it ticks on until the capture's next run has started (it waits for
        # this one in ``receive``) and it is not catching up, so the capture is never long
        # without a tick and a backlog is not handed over midway
        handed_over = HandOver(context.instance, capture_lane(f.cid), context.run_id, end.until,
                               POLL_S, max_s=HANDOFF_MAX_S, hold=f.catching_up)  # fmt: skip
        held = ""
        ticks, why_stopped = {OWNER: 0, DATA: 0}, TIME_UP
        throttle = MaterializationThrottle()
        rows: dict[tuple[str, int], int] = {}
        # Each changefeed ticks in a lane of its own: a long tick of one (a snapshot's
        # tables released, a Spark job) never holds another's (cdc_dagster/runtime/lanes.py).
        # Winding down for the successor: the changefeeds whose tick was in flight when the
        # loop's time was up (None: not winding down).
        winding: set[str] | None = None
        lanes: ChangefeedLanes[_Ticked] = ChangefeedLanes(
            lambda cf, msgs: _follow_tick(cdc, spark, f.cid, cf, msgs, winding is not None)
        )
        # The ticks' materializations and lines, written beside the loop (a snapshot's 50
        # tables took ~2.5 s to write, which every other changefeed's next tick waited for).
        writer = EventWriter(context.log_event, context.log.info)
        writer.put(reported, f"reported the first tick's {len(reported)} asset event(s)")

        def report(done: LaneTick[_Ticked]) -> None:
            if winding is not None:
                winding.discard(done.changefeed_id)
            if done.error is not None:
                raise done.error  # the capture's own (its etcd, its lease): the run fails
            ticked = done.result
            assert ticked is not None
            ticks[done.why] += 1
            progress = ticked.progress
            before = sum(rows.get((p.changefeed_id, p.table_id), 0) for p in progress)
            rows.update({(p.changefeed_id, p.table_id): p.rows_applied for p in progress})
            f.ticked(done.why, done.changefeed_id, ticked.capture, progress, before)
            events = materializations(catalog, progress, time.time_ns() // 1_000_000)
            logged = throttle.select(events, time.monotonic())
            # written by the writer's thread: the loop starts the next ticks meanwhile
            writer.put(logged, _tick_line(sum(ticks.values()), done, ticked, len(logged),
                                          len(events)))  # fmt: skip
            state["renewed"] = time.monotonic()

        try:
            while True:
                lost = _still_ours(f, state)
                if lost:
                    why_stopped = lost
                    break
                if winding is None and end.put_off(time.monotonic(), f.catching_up()):
                    # catching up: the successor is requested (and launched) later
                    handed_over.until = end.until
                    context.instance.add_run_tags(
                        context.run_id, {FOLLOW_UNTIL_TAG: f"{end.wall():.3f}"}
                    )
                    context.log.info(
                        "catching up (%s): this run's end is put off to %s, %.0f s past its "
                        "time (at most %.0f s)", f.catching_up(),
                        time.strftime("%H:%M:%S", time.localtime(end.wall())),
                        end.until - end.planned, end.max_s)  # fmt: skip
                if winding is None and (up := handed_over()):
                    why_stopped = up
                    # Its time is up: the other changefeeds go on ticking (bulk phases
                    # deferred to the successor) while a long tick in flight finishes, so
                    # none waits for another's at the handover; then the loop ends.
                    winding = set(lanes.busy())
                if winding is not None and not winding:
                    break
                if handed_over.held and not held:
                    held = handed_over.held
                    context.log.info(
                        "the capture's next run %s has started; handing over once caught up "
                        "(%s; at most %.0f s past this run's time)",
                        handed_over.successor, held, HANDOFF_MAX_S)  # fmt: skip
                for done in lanes.finished():
                    report(done)
                work, why = f.next_work(lanes.busy())
                lanes.add(work, why)
                if not lanes.start(f.not_before()):
                    if lanes.busy():
                        for done in lanes.finished(timeout_s=POLL_S):
                            report(done)
                    else:
                        time.sleep(POLL_S)
        finally:
            # Every lane ends with the op; the owner's messages taken from the mailbox are
            # ticked unless this run is no longer the owner's or the capture's.
            try:
                for done in lanes.close(finish_owner_messages=why_stopped.startswith(TIME_UP)):
                    report(done)
            finally:
                writer.close()  # what the ticks logged is written before the op ends
        context.log.info(
            "%d more tick(s) in %.0f s (%d on the owner's messages, %d on new data); stopped: %s",
            sum(ticks.values()),
            time.monotonic() - started,
            ticks[OWNER],
            ticks[DATA],
            why_stopped,
        )

    return follow


def build_capture_job(catalog: Catalog) -> dg.JobDefinition:
    """The capture job over ``catalog``."""
    report = build_report_op(catalog)
    follow = build_follow_op(catalog)

    @dg.job(
        name=CAPTURE_JOB,
        partitions_def=CAPTURES,
        executor_def=dg.in_process_executor,
        tags={"dagster/max_runtime": str(MAX_RUNTIME_S)},
        description=(
            "Ticks of one capture: receive -> prepare -> commit -> report, then follow: more "
            "ticks as the owner sends messages, for CDC_DAGSTER_CAPTURE_LOOP_S seconds."
        ),
    )
    def capture_tick() -> None:
        received = receive()
        follow(received, reported=report(received, commit(prepare(received))))

    return capture_tick

"""A capture tick as two durable halves: ``capture_prepare`` and ``capture_commit``.

Nothing of a capture lives in memory between calls (DESIGN.md, "Mapping onto Dagster"):
each half attaches to the capture's registration (renewing its lease; a new registration,
and so a new epoch, when it expired), rebuilds the Agent from its state key
(``agent/<changefeed>/<capture>``, under the capture's lease, next to the task key) and
the executor from its own manifest, does its half, and persists both (executor first, so
the Agent's state is never ahead of the data plane's). The commit half also writes the
task status key: the report the owner reads.

Epochs: the Agent's epoch under owner ``R`` is ``<registration>.<R>``
(:func:`~cdc_dagster.runtime.spec.capture_epoch`), so the owner derives it from the
registry and the task key, and an old owner's dispatches never match it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from cdc_dagster import failpoints
from cdc_dagster.metastore import CaptureSession, Metastore, TaskStatus
from cdc_dagster.metastore.changefeeds import wall_ms
from cdc_dagster.metastore.client import Put
from cdc_dagster.metastore.errors import (
    CaptureNotRegisteredError,
    ChangefeedNotFoundError,
    LeaseExpiredError,
    MetastoreError,
)
from cdc_dagster.metastore.problems import Problem, reported
from cdc_dagster.metastore.status_codec import decode as decode_status
from cdc_dagster.metastore.status_codec import encode as encode_status
from cdc_dagster.pipeline.staging import registration_area
from cdc_dagster.runtime import wire
from cdc_dagster.runtime.progress import TableProgress
from cdc_dagster.runtime.spec import ExecutorFactory, ExecutorSpec, RuntimeExecutor, capture_epoch
from cdc_dagster.runtime.wire import (
    decode_dispatch,
    decode_message,
    encode_dispatch,
    encode_message,
)
from cdc_dagster.upstream.changelog import ChangeLog, ChangeLogError, snapshot_reading
from cdc_dagster.upstream.uri import UpstreamError, changelog_path
from scheduler_core.agent import Agent, AgentState, AgentStats
from scheduler_core.messages import (
    CaptureMessage,
    DispatchTableResponse,
    HeartbeatResponse,
    OwnerMessage,
    TableStatusBatch,
)
from scheduler_core.model import Checkpoint, TableState, TableStatus

log = logging.getLogger(__name__)

AGENT_STATE_VERSION = 1


@dataclass(slots=True)
class CaptureContext:
    """What one capture's tick halves need; cheap to build in every Dagster op."""

    metastore: Metastore
    capture_id: str
    changefeed_id: str
    staging_root: Path  # staging of every capture: <staging_root>/<changefeed>/<capture>
    executor_factory: ExecutorFactory
    lease_ttl_s: int = 60  # spans a few Dagster runs (~10-20 s apart): failing runs lose it
    address: str = ""

    @property
    def staging_dir(self) -> Path:
        """This capture's staging area for this changefeed."""
        return Path(self.staging_root) / self.changefeed_id / self.capture_id


@dataclass(frozen=True, slots=True)
class PrepareOutcome:
    """What ``capture_prepare`` did."""

    capture_id: str
    changefeed_id: str
    epoch: str  # the Agent's epoch after receiving
    registration: str  # the registration (lease) epoch
    registered_anew: bool  # the lease had expired: a new registration, staging reset
    owner_rev: int
    received: int
    rejected: dict[str, int]  # fencing drops by reason (stale owner, wrong epoch, ...)
    tables: tuple[TableProgress, ...]
    errors: dict[int, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """Human-readable lines for a run log."""
        head = (
            f"capture {self.capture_id} changefeed {self.changefeed_id} epoch {self.epoch} "
            f"owner_rev {self.owner_rev}: received {self.received}, rejected {self.rejected}"
            + (" (registered anew)" if self.registered_anew else "")
        )
        return [head, *(t.line() for t in self.tables)]


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """What ``capture_commit`` did, and the report it wrote."""

    capture_id: str
    changefeed_id: str
    epoch: str
    owner_rev: int
    reported: bool  # a task status key was written (an owner was adopted)
    responses: tuple[CaptureMessage, ...]
    tables: tuple[TableProgress, ...]
    errors: dict[int, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """Human-readable lines for a run log."""
        head = (
            f"capture {self.capture_id} changefeed {self.changefeed_id} epoch {self.epoch} "
            f"owner_rev {self.owner_rev}: {'reported' if self.reported else 'no owner yet'}"
        )
        return [head, *(t.line() for t in self.tables)]


# ------------------------------------------------------------------------------ halves
def capture_prepare(ctx: CaptureContext, messages: Sequence[OwnerMessage]) -> PrepareOutcome:
    """Fence and receive ``messages``, drive tasks, run phase 1 (pull into staging), persist."""
    with _Tick.open(ctx) as tick:
        return _prepare(ctx, tick, messages)


def _prepare(ctx: CaptureContext, tick: _Tick, messages: Sequence[OwnerMessage]) -> PrepareOutcome:
    before = _counts(tick.agent.stats)
    for msg in messages:
        # The epoch the Agent rotates to when it adopts this message's owner.
        tick.adopting_rev = msg.header.owner_rev
        tick.agent.handle([msg])
    rejected = {k: v - before[k] for k, v in _counts(tick.agent.stats).items() if v > before[k]}
    tick.agent.begin_tick()
    tick.executor.pull_phase()
    failpoints.hit(failpoints.CAPTURE_PREPARE)
    # The report too, with the Agent's state in one transaction: what the messages did
    # (a promotion, a table prepared) is what the owner reads even if this run dies before
    # its commit half; an owner rebuilt meanwhile would otherwise start from the last
    # commit's report and take the promoted primary for a secondary. A STOPPED table is
    # left to the commit half, which reports it once and forgets it.
    held = tick.executor.statuses()
    live = held.states != TableState.STOPPED
    if not live.all():
        held = TableStatusBatch(
            held.table_ids[live],
            held.states[live],
            held.checkpoint_ts[live],
            held.resolved_ts[live],
        )
    rows = tick.executor.rows_applied()
    tick.persist(report=_report(tick.agent, held, (), tick.previous_report, rows))
    return PrepareOutcome(
        ctx.capture_id,
        ctx.changefeed_id,
        tick.agent.epoch,
        tick.session.epoch,
        tick.registered_anew,
        tick.agent.owner_rev,
        len(messages),
        rejected,
        tick.progress(),
        dict(tick.executor.errors()),
    )


def capture_commit(ctx: CaptureContext) -> CommitOutcome:
    """Phase 2 (sink), finish the tick, write the task status key (the report), persist."""
    with _Tick.open(ctx) as tick:
        return _commit(ctx, tick)


def _commit(ctx: CaptureContext, tick: _Tick) -> CommitOutcome:
    failpoints.hit(failpoints.SINK_BEFORE_WRITE)
    tick.executor.sink_phase()
    failpoints.hit(failpoints.SINK_AFTER_WRITE)
    responses = tick.agent.end_tick()
    report = _report(
        tick.agent,
        tick.executor.statuses(),
        responses,
        tick.previous_report,
        tick.executor.rows_applied(),
    )
    tick.persist(report=report)
    return CommitOutcome(
        ctx.capture_id,
        ctx.changefeed_id,
        tick.agent.epoch,
        tick.agent.owner_rev,
        report is not None,
        tuple(responses),
        tick.progress(),
        dict(tick.executor.errors()),
    )


# ------------------------------------------------------------------------------ internals
class _Tick:
    """One half's view: the session, the restored Agent and executor."""

    def __init__(self, ctx: CaptureContext, session: CaptureSession, anew: bool) -> None:
        self.ctx = ctx
        self.session = session
        self.registered_anew = anew
        self.adopting_rev = 0
        ms = ctx.metastore
        cf = ms.changefeeds.get(ctx.changefeed_id).info
        area = _registration_area(ctx.staging_dir, session.epoch)
        spec = ExecutorSpec(
            ctx.capture_id,
            ctx.changefeed_id,
            area,
            Path(ctx.staging_root),
            cf.upstream_uri,
            cf.sink_uri,
            cf.start_ts,
            cf.sync_point_interval_s * 1000 or None,
            registration=session.epoch,
        )
        self.executor: RuntimeExecutor = ctx.executor_factory(spec)  # loaded from its manifest
        self.agent = Agent(
            ctx.capture_id,
            self.executor,
            lambda: capture_epoch(session.epoch, self.adopting_rev),
            registration=session.epoch,
        )
        kv = ms.client.get(ms.layout.agent_state(ctx.changefeed_id, ctx.capture_id))
        if kv is not None:
            state = decode_agent_state(kv.value, ctx.capture_id)
            if state is not None:
                self.agent.restore(state)
        owner = ms.election.current_owner()
        self.agent.observe_owner_rev(owner.owner_rev if owner is not None else 0)
        self.problem = ms.problems.get(ctx.changefeed_id, ctx.capture_id)
        kv = ms.client.get(ms.layout.task(ctx.changefeed_id, ctx.capture_id))
        self.previous_report = decode_status(kv.value) if kv is not None else None

    @classmethod
    @contextlib.contextmanager
    def open(cls, ctx: CaptureContext) -> Iterator[_Tick]:
        """The half's view; the lease is kept alive while the half runs (a long Spark job)."""
        session, anew = attach_or_register(ctx)
        session.keeper.start()
        try:
            yield cls(ctx, session, anew)
        finally:
            session.keeper.stop()

    def persist(self, report: TaskStatus | None) -> None:
        self.executor.save()
        ms = self.ctx.metastore
        lease = self.session.lease_id
        ops = [
            Put(
                ms.layout.agent_state(self.ctx.changefeed_id, self.ctx.capture_id),
                encode_agent_state(self.agent.snapshot()),
                lease,
            )
        ]
        if report is not None:
            key = ms.layout.task(self.ctx.changefeed_id, self.ctx.capture_id)
            ops.append(Put(key, encode_status(report), lease))
        problem = self.table_problem()
        if problem is not None or self.problem is not None:
            ops.append(
                ms.problems.put_op(self.ctx.changefeed_id, self.ctx.capture_id, problem, lease)
            )
        self.session.txn(ops)

    def table_problem(self) -> Problem | None:
        """The executor's table errors as this capture's problem with the changefeed (None:
        no table is in error, and a problem of an earlier tick is gone)."""
        errors = dict(self.executor.errors())
        if not errors:
            return None
        first = "; ".join(f"table {t}: {m}" for t, m in sorted(errors.items())[:3])
        more = f" (and {len(errors) - 3} more tables)" if len(errors) > 3 else ""
        message = f"capture {self.ctx.capture_id}: {len(errors)} table(s) in error: {first}{more}"
        return reported(self.problem, message, wall_ms(), tables=errors)

    def progress(self) -> tuple[TableProgress, ...]:
        """Each held table's progress after this half (the barrier is the executor's own)."""
        notes: dict[int, str] = dict(getattr(self.executor, "last_phase", {}) or {})
        for table_id, req in self.agent.tasks.items():
            notes[table_id] = (notes.get(table_id, "") + f" task {type(req).__name__}").strip()
        for table_id, err in self.executor.errors().items():
            notes[table_id] = f"ERROR {err}"
        rows = self.executor.rows_applied()
        barrier = self.executor.barrier
        ctx = self.ctx
        return tuple(
            TableProgress(
                ctx.changefeed_id,
                st.table_id,
                st.state.name.lower(),
                ctx.capture_id,
                st.checkpoint.checkpoint_ts,
                st.checkpoint.resolved_ts,
                barrier.barrier_ts(st.table_id),
                rows.get(st.table_id, 0),
                note=notes.get(st.table_id, ""),
            )
            for st in sorted(self.executor.statuses(), key=lambda st: st.table_id)
        )


# A following run ticks its changefeeds in lanes (threads, cdc_dagster/runtime/lanes.py):
# two lanes finding the registration expired register it once, not twice.
_REGISTERING = threading.Lock()


def attach_or_register(ctx: CaptureContext) -> tuple[CaptureSession, bool]:
    """The capture's registration with its lease renewed; a new one if it expired."""
    with _REGISTERING:
        return _attach_or_register(ctx)


def _attach_or_register(ctx: CaptureContext) -> tuple[CaptureSession, bool]:
    reg = ctx.metastore.captures
    try:
        session = reg.attach(ctx.capture_id)
        session.keep_alive()
        return session, False
    except (CaptureNotRegisteredError, LeaseExpiredError):
        log.info("capture %s: registration gone; registering anew", ctx.capture_id)
    session = reg.register(ctx.capture_id, ctx.lease_ttl_s, address=ctx.address, keepalive=False)
    return session, True


def _registration_area(staging: Path, registration: str) -> Path:
    """The registration's own staging area under the capture's ``staging`` directory; what
    other (expired) registrations left there is removed. Staging of a dead epoch is never
    read again: its tables were taken away and are prepared anew. A run of such a
    registration that still runs writes only into its own area (a late write finds it gone
    or makes it again, and it is removed again at the next tick of the live one)."""
    mine = staging / registration_area(registration)
    if staging.is_dir():
        for entry in staging.iterdir():
            if entry.name != mine.name:
                log.info("staging %s belongs to an expired registration: removed", entry)
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
    mine.mkdir(parents=True, exist_ok=True)
    return mine


def _counts(stats: AgentStats) -> dict[str, int]:
    return {name: getattr(stats, name) for name in AgentStats.__slots__}  # type: ignore[attr-defined]


def _report(
    agent: Agent,
    held_now: TableStatusBatch,
    responses: Sequence[CaptureMessage],
    previous: TaskStatus | None,
    rows: Mapping[int, int],
) -> TaskStatus | None:
    """The task status: the heartbeat response's tables, or every held table, plus the
    statuses of tasks that finished; with each table's ``rows`` applied (the executor's
    counters, in both halves alike: a count that flipped between the prepare half's report
    and the commit half's would look like motion to the owner's health judgement).

    The report is one etcd key the owner reads when it ticks, and a later tick overwrites
    it: a state, not a message. So what the owner must learn survives until its next
    heartbeat has been answered: in a tick without a heartbeat (a capture ticking on its
    own data, or a prepare half) a table the previous report listed and this capture no
    longer holds stays in it, as it was if STOPPED or ABSENT (a fenced table, forgotten
    once reported), else as ABSENT. A heartbeat response is the owner's own list answered
    (ABSENT for each listed table not held), so it starts afresh.
    """
    if agent.owner_id is None:
        return None
    base = held_now
    extra: list[TableStatus] = []
    answered = False
    for m in responses:
        if isinstance(m, HeartbeatResponse):
            base, answered = m.tables, True
        elif isinstance(m, DispatchTableResponse):
            extra.extend(m.statuses)
    listed = set(base.table_ids.tolist())
    extra = [s for s in extra if s.table_id not in listed]
    listed |= {s.table_id for s in extra}
    if not answered and previous is not None:
        extra.extend(_gone_since(previous.tables, listed))
    if extra:
        more = TableStatusBatch.of(extra)
        base = TableStatusBatch(
            *(
                np.concatenate([getattr(base, n), getattr(more, n)])
                for n in ("table_ids", "states", "checkpoint_ts", "resolved_ts")
            )
        )
    applied = np.fromiter((rows.get(t, 0) for t in base.table_ids.tolist()), np.int64, len(base))
    return TaskStatus(agent.owner_rev, agent.changefeed_epoch, agent.liveness, base, applied)


def _gone_since(before: TableStatusBatch, listed: set[int]) -> list[TableStatus]:
    """Tables of an earlier report not listed now: kept as they were when STOPPED or
    ABSENT, else ABSENT (no longer held)."""
    out = []
    for i, table_id in enumerate(before.table_ids.tolist()):
        if table_id in listed:
            continue
        state = TableState(int(before.states[i]))
        if state in (TableState.STOPPED, TableState.ABSENT):
            out.append(
                TableStatus(
                    table_id,
                    state,
                    Checkpoint(int(before.checkpoint_ts[i]), int(before.resolved_ts[i])),
                )
            )
        else:
            out.append(TableStatus(table_id, TableState.ABSENT, Checkpoint(0, 0)))
    return out


# ------------------------------------------------------------------------------ agent state
def encode_agent_state(state: AgentState) -> bytes:
    """JSON of an AgentState (messages through the wire codec)."""
    obj = {
        "v": AGENT_STATE_VERSION,
        "owner_rev": state.owner_rev,
        "owner_id": state.owner_id,
        "epoch": state.epoch,
        "changefeed_epoch": state.changefeed_epoch,
        "stopping": state.stopping,
        "seq": state.seq,
        "tasks": [{**encode_dispatch(d), "commit_sent": sent} for d, sent in state.tasks],
        "heartbeat": encode_message(state.heartbeat) if state.heartbeat else None,
        "half_heartbeat": encode_message(state.half_heartbeat) if state.half_heartbeat else None,
        "half_finished": list(state.half_finished),
        "in_tick": state.in_tick,
    }
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_agent_state(data: bytes, capture_id: str) -> AgentState | None:
    """Inverse of :func:`encode_agent_state`; None (logged) for another version."""
    raw = json.loads(data)
    if raw.get("v") != AGENT_STATE_VERSION:
        log.warning("capture %s: agent state version %r ignored", capture_id, raw.get("v"))
        return None

    def msg(obj: Any) -> Any:
        return decode_message(obj, "agent state") if obj is not None else None

    tasks = tuple(
        (decode_dispatch(t, capture_id, "agent state task"), bool(t["commit_sent"]))
        for t in raw["tasks"]
    )
    return AgentState(
        owner_rev=raw["owner_rev"],
        owner_id=raw["owner_id"],
        epoch=raw["epoch"],
        changefeed_epoch=raw["changefeed_epoch"],
        stopping=raw["stopping"],
        seq=raw["seq"],
        tasks=tasks,
        heartbeat=msg(raw["heartbeat"]),
        half_heartbeat=msg(raw["half_heartbeat"]),
        half_finished=tuple(raw["half_finished"]),
        in_tick=raw["in_tick"],
    )


def held_states(report: TaskStatus) -> dict[int, TableState]:
    """Table id -> state of a report (tests, logs)."""
    return {s.table_id: s.state for s in report.tables}


# ------------------------------------------------------------------------------ a capture run
class CaptureTick:
    """One tick of a capture over every changefeed the owner sent it messages for: what a
    capture run (or one of its follow ticks) does, both halves, per changefeed."""

    def __init__(
        self,
        ms: Metastore,
        capture_id: str,
        work: Mapping[str, list[dict[str, Any]]],
        *,
        staging_root: Path,
        executor_factory: ExecutorFactory,
        lease_ttl_s: int,
    ) -> None:
        self.work = {cf: wire.decode(msgs) for cf, msgs in work.items()}
        self.contexts = {
            cf: CaptureContext(
                ms, capture_id, cf, staging_root, executor_factory, lease_ttl_s=lease_ttl_s
            )
            for cf in self.work
        }

        self.failed: dict[str, str] = {}  # changefeed -> why it was skipped or failed this tick
        self.removed: set[str] = set()  # changefeeds found removed (nothing left to tick)
        self.prepared: dict[str, PrepareOutcome] = {}
        self.committed: dict[str, CommitOutcome] = {}
        for cf in self.contexts:
            waiting = _backing_off(ms.problems.get(cf, capture_id))
            if waiting:
                self.failed[cf] = waiting

    def prepare(self) -> list[str]:
        """Phase 1 per changefeed, the changefeeds side by side; the run-log lines."""
        lines: list[str] = []
        outcomes = self._side_by_side(
            {
                cf: lambda ctx=ctx, cf=cf: capture_prepare(ctx, self.work[cf])
                for cf, ctx in self._running()
            }
        )
        for cf, outcome in outcomes.items():
            if outcome is not None:
                self.prepared[cf] = outcome
                lines += [f"{cf}: {line}" for line in outcome.lines()]
        return lines + self._failed_lines()

    def commit(self) -> tuple[list[str], list[TableProgress]]:
        """Phase 2 per changefeed, the changefeeds side by side; the run-log lines and each
        held table's progress."""
        lines: list[str] = []
        progress: list[TableProgress] = []
        outcomes = self._side_by_side(
            {cf: lambda ctx=ctx: capture_commit(ctx) for cf, ctx in self._running()}
        )
        for cf, outcome in outcomes.items():
            if outcome is not None:
                self.committed[cf] = outcome
                lines += [f"{cf}: {line}" for line in outcome.lines()]
                progress += outcome.tables
        return lines + self._failed_lines(), progress

    def _side_by_side(
        self, halves: Mapping[str, Callable[[], _Outcome]]
    ) -> dict[str, _Outcome | None]:
        """Each changefeed's half (``_isolated``) in a thread of its own, in changefeed order:
        one changefeed's long half (a snapshot's released table) does not hold another's for
        its whole length (a follow loop's ticks go further: runtime/lanes.py). The first
        metastore error (the capture's own) is raised once every half ended."""
        if len(halves) <= 1:
            return {cf: self._isolated(cf, half) for cf, half in halves.items()}
        with ThreadPoolExecutor(len(halves), thread_name_prefix="changefeed-half") as pool:
            futures = {cf: pool.submit(self._isolated, cf, half) for cf, half in halves.items()}
        return {cf: f.result() for cf, f in futures.items()}

    def _running(self) -> list[tuple[str, CaptureContext]]:
        return [(cf, ctx) for cf, ctx in self.contexts.items() if cf not in self.failed]

    def _failed_lines(self) -> list[str]:
        return [f"{cf}: {why}" for cf, why in sorted(self.failed.items())]

    def _isolated(self, cf: str, half: Callable[[], _Outcome]) -> _Outcome | None:
        """Run one changefeed's half; its failure is that changefeed's problem, recorded for
        the owner to show, never the run's, the capture's or another changefeed's.

        A metastore error is the capture's own (its lease, its etcd) and propagates, but for
        the changefeed's removal (``changefeed remove`` while the capture held its tables):
        then there is nothing left to tick for it (``removed``).
        """
        ctx = self.contexts[cf]
        try:
            return half()
        except ChangefeedNotFoundError:
            log.info("changefeed %s was removed: nothing left to tick", cf)
            self.removed.add(cf)
            self.failed[cf] = "removed (changefeed remove): nothing left to tick"
            return None
        except MetastoreError:
            raise
        except Exception as exc:
            message = f"capture {ctx.capture_id}: {type(exc).__name__}: {exc}"
            log.warning("changefeed %s: %s", cf, message)
            problem = _record_failure(ctx, message)
            self.failed[cf] = f"FAILED {message}" + (
                f" (attempt {problem.attempts}; retried from {problem.retry_at_ms})"
                if problem
                else ""
            )
            return None


_Outcome = TypeVar("_Outcome", PrepareOutcome, CommitOutcome)


def _backing_off(problem: Problem | None) -> str:
    """Why a changefeed waits this tick: its last whole-changefeed failure is younger than
    its backoff ("" when it may run)."""
    if problem is None or problem.tables:
        return ""
    wait_ms = problem.retry_at_ms - wall_ms()
    if wait_ms <= 0:
        return ""
    return f"waits {wait_ms / 1000:.1f} s before retrying (attempt {problem.attempts}): {problem.message}"


def _record_failure(ctx: CaptureContext, message: str) -> Problem | None:
    """Write the capture's problem with the changefeed under its lease (None if the capture
    is not registered: the owner then sees the capture gone)."""
    ms = ctx.metastore
    try:
        session = ms.captures.attach(ctx.capture_id)
    except (CaptureNotRegisteredError, LeaseExpiredError):
        return None
    problem = reported(ms.problems.get(ctx.changefeed_id, ctx.capture_id), message, wall_ms())
    session.txn([ms.problems.put_op(ctx.changefeed_id, ctx.capture_id, problem, session.lease_id)])
    return problem


# ------------------------------------------------------------------------------ self ticks
class FrontierWatch:
    """Which of a capture's changefeeds have new resolved data since it last ticked them.

    A capture need not wait for the owner to tick (DESIGN.md "Latency comes from the
    data"): steady replication needs no owner decision, and the barrier it was given is
    open past the DDL stream. So a following capture run ticks on its own whenever a
    changefeed's change log moved: its DDL resolved ts, which every flush of the upstream
    (rows or an idle heartbeat) advances, is one small file read per changefeed.
    """

    def __init__(self, metastore: Metastore) -> None:
        self._metastore = metastore
        self._logs: dict[str, ChangeLog | None] = {}
        self._seen: dict[str, int] = {}

    def _log(self, changefeed_id: str) -> ChangeLog | None:
        """The changefeed's change log (opened once; None: it has none to watch)."""
        if changefeed_id not in self._logs:
            try:
                info = self._metastore.changefeeds.get(changefeed_id).info
                self._logs[changefeed_id] = ChangeLog(changelog_path(info.upstream_uri))
            except (MetastoreError, ChangeLogError, UpstreamError, OSError) as exc:
                log.info("changefeed %s: no change log to watch (%s)", changefeed_id, exc)
                self._logs[changefeed_id] = None
        return self._logs[changefeed_id]

    def _frontier(self, changefeed_id: str) -> int:
        changelog = self._log(changefeed_id)
        if changelog is None:
            return 0
        try:
            return changelog.ddl_resolved_ts()
        except (ChangeLogError, OSError):
            return 0

    def moved(self, changefeed_ids: Iterable[str]) -> list[str]:
        """The changefeeds whose change log resolved past what the last tick saw; noted as
        seen (a tick follows)."""
        out = []
        for cf in sorted(set(changefeed_ids)):
            now = self._frontier(cf)
            if now > self._seen.get(cf, 0):
                self._seen[cf] = now
                out.append(cf)
        return out

    def reading(self, changefeed_ids: Iterable[str]) -> list[str]:
        """The changefeeds whose change log has a snapshot being read (a reader wrote a
        chunk in the last ``changelog.READING_S``: ``snapshot_reading``)."""
        return [
            cf
            for cf in sorted(set(changefeed_ids))
            if (changelog := self._log(cf)) is not None and snapshot_reading(changelog.root)
        ]

    def forget(self, changefeed_id: str) -> None:
        """Read the changefeed's change log again next time (it was removed or recreated)."""
        self._logs.pop(changefeed_id, None)
        self._seen.pop(changefeed_id, None)

"""Agent: the capture side of the scheduling protocol (TiCDC scheduler v3's ``agent.go``).

Use it as ``agent.handle(messages_from_owner)`` then ``agent.tick()`` -> messages to send.
One ``tick`` is one processor tick: drive the tasks in flight, let the executor make one
step of data progress (:meth:`TableExecutor.advance`), drive the tasks again (to see what
finished), then build the responses.

Fencing on receive, in this order (each drop is logged and counted in :attr:`Agent.stats`):

1. ``to`` is not this capture -> drop.
2. ``owner_rev`` lower than the adopted one (or 0) -> drop. Higher -> adopt the sender as
   owner: rotate the capture epoch, adopt the message's changefeed epoch, and drop the old
   owner's tasks in flight and its pending heartbeat. Equal but another sender (two owners
   with one revision: a broken election) -> drop.
3. ``changefeed_epoch`` lower than the adopted one -> drop; higher -> adopt (the changefeed
   was recreated; the owner will remove what it no longer wants).
4. Dispatches only: ``header.seq`` below that of a dispatch already taken from this owner
   -> drop (a request delayed on the wire past later ones: a stale commit would otherwise
   make this capture sink a table that has moved on; simulator seed 67, quick restarts).
5. Dispatches only: ``capture_epoch`` must equal :attr:`Agent.epoch`. So the first dispatch
   of a new owner is always dropped: it learns the new epoch from our heartbeat response
   (and the coordinator schedules only after every capture reported since it took over).

Why the epoch rotates on a new owner (TiCDC's classic agent keeps it): a dispatch the old
owner addressed to us can then never be carried out on behalf of the new one; and the old
owner's tasks are dropped for the same reason -- a commit the new owner did not order
could make a second primary. The executor keeps whatever it already started (a stopping
table still stops), and the new owner rebuilds its view from our heartbeat response.

Tasks: one per table in flight. The same request again is a no-op; another request for
that table is ignored until the first finishes (the owner re-sends on the next report).
An add for a table this capture does not hold is refused once the capture is stopping.

Responses: a :class:`HeartbeatResponse` per tick in which a heartbeat arrived (every held
table, plus ABSENT for listed tables not held), and a :class:`DispatchTableResponse` with
the status of the tasks that *finished* this tick (as TiCDC: an add when the table is
Prepared / Replicating, a remove when it is Stopped or Absent; in-flight progress travels
in heartbeat responses). A STOPPED table is reported once, then forgotten, so the next
report says ABSENT. Responses carry strictly increasing ``header.seq`` in list order.

Invariants (checked after every ``handle`` and ``tick``): an ``owner_id`` implies
``owner_rev > 0`` (a rev without an owner is the registry's floor, see
:meth:`Agent.observe_owner_rev`); no task is in flight without an owner; every task in
flight is keyed by its own table id; the epoch is a
non-empty string.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from scheduler_core.errors import ConfigError, ProtocolError, SchedulerError
from scheduler_core.executor import TableExecutor
from scheduler_core.messages import (
    AddTableRequest,
    CaptureMessage,
    Dispatch,
    DispatchTableRequest,
    DispatchTableResponse,
    Header,
    Heartbeat,
    HeartbeatResponse,
    Liveness,
    OwnerMessage,
    RemoveTableRequest,
    TableStatusBatch,
)
from scheduler_core.model import TableState

log = logging.getLogger(__name__)

T = TableState


class AgentInvariantError(SchedulerError):
    """The agent reached a state its invariants forbid (a bug, never input)."""


@dataclass(slots=True)
class AgentStats:
    """Counters of what the agent dropped or ignored, by reason."""

    rejected_wrong_capture: int = 0  # addressed to another capture
    rejected_stale_owner: int = 0  # owner_rev below the adopted one (or 0)
    rejected_owner_conflict: int = 0  # same owner_rev, another owner id
    rejected_changefeed_epoch: int = 0  # changefeed epoch below the adopted one
    rejected_capture_epoch: int = 0  # dispatch addressed to another epoch of this capture
    rejected_stale_seq: int = 0  # dispatch older than one already taken from this owner
    rejected_while_stopping: int = 0  # add of a new table while the capture drains
    duplicate_tasks: int = 0  # the task in flight, sent again
    ignored_conflicting_tasks: int = 0  # another task for a table with one in flight


class _Task:
    """A dispatch in flight, and whether its commit was already handed to the executor."""

    __slots__ = ("commit_sent", "request")

    def __init__(self, request: Dispatch) -> None:
        self.request = request
        self.commit_sent = False


class Agent:
    """The capture side: fences owner messages, drives a TableExecutor, reports table states."""

    def __init__(
        self,
        capture_id: str,
        executor: TableExecutor,
        new_epoch: Callable[[], str],
        registration: str = "",
    ) -> None:
        if not isinstance(capture_id, str) or not capture_id:
            raise ConfigError(f"capture_id must be a non-empty str, got {capture_id!r}")
        self._capture_id = capture_id
        # The registry token of this process's registration (its lease): lets the owner
        # tell this incarnation's reports from a late one of a previous incarnation.
        self.registration = registration
        self._executor = executor
        self._new_epoch = new_epoch
        self._epoch = ""
        self._rotate_epoch()
        self._owner_rev = 0
        self._owner_id: str | None = None
        self._changefeed_epoch = 0
        self._stopping = False
        self._seq = 0
        self._tasks: dict[int, _Task] = {}
        self._heartbeat: Heartbeat | None = None
        self._dispatch_seq = 0  # highest seq of a dispatch taken from the current owner
        self.stats = AgentStats()

    # ----------------------------------------------------------------- read-only view
    @property
    def capture_id(self) -> str:
        """This capture's id."""
        return self._capture_id

    @property
    def epoch(self) -> str:
        """This capture's current epoch (rotates on start and on each new owner)."""
        return self._epoch

    @property
    def owner_rev(self) -> int:
        """The adopted owner's election revision; 0 until an owner is known."""
        return self._owner_rev

    @property
    def owner_id(self) -> str | None:
        """The adopted owner's id; None until an owner is known."""
        return self._owner_id

    @property
    def changefeed_epoch(self) -> int:
        """The changefeed epoch adopted with the owner."""
        return self._changefeed_epoch

    @property
    def liveness(self) -> Liveness:
        """STOPPING once draining (``stop()`` or the owner said so), else ALIVE."""
        return Liveness.STOPPING if self._stopping else Liveness.ALIVE

    @property
    def tasks(self) -> Mapping[int, Dispatch]:
        """The dispatches in flight, by table id (read-only copy)."""
        return MappingProxyType({t: task.request for t, task in self._tasks.items()})

    # ----------------------------------------------------------------- inputs
    def stop(self) -> None:
        """Start draining: report STOPPING and accept no new tables."""
        if not self._stopping:
            log.info("capture %s: stopping", self._capture_id)
        self._stopping = True

    def handle(self, msgs: Iterable[OwnerMessage]) -> None:
        """Receive owner messages: fence them, record heartbeats, queue dispatch tasks."""
        batch = list(msgs)
        for msg in batch:  # check all first: a bad batch changes nothing
            if not isinstance(msg, Heartbeat | DispatchTableRequest):
                raise ProtocolError(
                    f"capture {self._capture_id} got {type(msg).__name__}, not an owner message"
                )
        for msg in batch:
            if not self._accept(msg):
                continue
            if isinstance(msg, Heartbeat):
                self._on_heartbeat(msg)
            else:
                self._on_dispatch(msg)
        self._check_invariant()

    def _accept(self, msg: OwnerMessage) -> bool:
        h = msg.header
        if msg.to != self._capture_id:
            return self._reject("rejected_wrong_capture", msg, f"addressed to {msg.to!r}")
        if h.owner_rev <= 0 or h.owner_rev < self._owner_rev:
            return self._reject("rejected_stale_owner", msg, f"adopted rev {self._owner_rev}")
        if h.owner_rev > self._owner_rev or (
            self._owner_id is None and h.owner_rev == self._owner_rev
        ):
            self._adopt_owner(msg)
        elif msg.sender != self._owner_id:
            log.error("two owners with rev %s: %s and %s", h.owner_rev, self._owner_id, msg.sender)
            return self._reject("rejected_owner_conflict", msg, f"owner is {self._owner_id!r}")
        if h.changefeed_epoch < self._changefeed_epoch:
            return self._reject(
                "rejected_changefeed_epoch", msg, f"adopted {self._changefeed_epoch}"
            )
        if h.changefeed_epoch > self._changefeed_epoch:
            log.info(
                "capture %s: changefeed epoch %s -> %s (changefeed recreated)",
                self._capture_id,
                self._changefeed_epoch,
                h.changefeed_epoch,
            )
            self._changefeed_epoch = h.changefeed_epoch
            self._dispatch_seq = 0
        if isinstance(msg, DispatchTableRequest):
            if h.seq < self._dispatch_seq:
                return self._reject(
                    "rejected_stale_seq", msg, f"seq {h.seq} < {self._dispatch_seq}"
                )
            self._dispatch_seq = h.seq
        return True

    def observe_owner_rev(self, owner_rev: int) -> None:
        """The registry (etcd) says the elected owner has ``owner_rev``: lower ones are zombies.

        A capture must not learn the current owner only from owner messages: a process that
        (re)starts after an election would otherwise adopt a zombie owner it hears first,
        take tables from it, and sink them next to the real owner's choice (simulator seed
        6496). Raising the floor drops the stale owner and its tasks in flight.
        """
        if owner_rev <= self._owner_rev:
            return
        log.info(
            "capture %s: registry owner_rev %s > adopted %s (%s): dropping the stale owner",
            self._capture_id,
            owner_rev,
            self._owner_rev,
            self._owner_id,
        )
        self._owner_rev = owner_rev
        self._owner_id = None
        self._tasks.clear()
        self._heartbeat = None

    def _reject(self, counter: str, msg: OwnerMessage, why: str) -> bool:
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        log.info(
            "capture %s drops %s from %s (%s): %s",
            self._capture_id,
            type(msg).__name__,
            msg.sender,
            msg.header,
            why,
        )
        return False

    def _adopt_owner(self, msg: OwnerMessage) -> None:
        self._rotate_epoch()
        log.info(
            "capture %s: new owner %s (rev %s, was %s rev %s), epoch now %s; %d old tasks dropped",
            self._capture_id,
            msg.sender,
            msg.header.owner_rev,
            self._owner_id,
            self._owner_rev,
            self._epoch,
            len(self._tasks),
        )
        self._owner_rev = msg.header.owner_rev
        self._owner_id = msg.sender
        self._changefeed_epoch = msg.header.changefeed_epoch
        self._tasks.clear()
        self._heartbeat = None
        self._dispatch_seq = 0

    def _rotate_epoch(self) -> None:
        epoch = self._new_epoch()
        if not isinstance(epoch, str) or not epoch or epoch == self._epoch:
            raise ConfigError(
                f"new_epoch() returned {epoch!r} (current {self._epoch!r}): "
                "it must return a fresh non-empty str each call"
            )
        self._epoch = epoch

    def _on_heartbeat(self, msg: Heartbeat) -> None:
        self._heartbeat = msg  # answer the latest one only
        if msg.is_stopping and not self._stopping:
            log.info("capture %s: owner %s asks it to stop", self._capture_id, msg.sender)
            self._stopping = True

    def _on_dispatch(self, msg: DispatchTableRequest) -> None:
        if msg.header.capture_epoch != self._epoch:
            self._reject("rejected_capture_epoch", msg, f"our epoch is {self._epoch!r}")
            return
        for req in msg.all_requests():
            self._inject(req)

    def _inject(self, req: Dispatch) -> None:
        task = self._tasks.get(req.table_id)
        if task is not None:
            if task.request == req:
                self.stats.duplicate_tasks += 1
            else:
                self.stats.ignored_conflicting_tasks += 1
                log.info(
                    "capture %s: table %s has %s in flight; ignore %s",
                    self._capture_id,
                    req.table_id,
                    task.request,
                    req,
                )
            return
        if (
            isinstance(req, AddTableRequest)
            and self._stopping
            and self._executor.status(req.table_id).state == T.ABSENT
        ):
            self.stats.rejected_while_stopping += 1
            log.info("capture %s is stopping: refuse new table %s", self._capture_id, req.table_id)
            return
        self._tasks[req.table_id] = _Task(req)

    # ----------------------------------------------------------------- the tick
    def tick(self) -> list[CaptureMessage]:
        """One processor tick: drive tasks, advance the executor, return the responses."""
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            self._executor.set_barrier(heartbeat.barrier)
        finished = self._drive_tasks()
        self._executor.advance()
        finished += self._drive_tasks()
        out: list[CaptureMessage] = []
        if self._owner_id is None:
            return out
        stopped: list[int] = []
        if heartbeat is not None:
            response, stopped = self._heartbeat_response(heartbeat)
            out.append(response)
            # The heartbeat response already carries these tables' states: saying it
            # twice made the owner poll each table twice and re-send every commit.
            reported = np.isin(finished, response.tables.table_ids)
            finished = [t for t, dup in zip(finished, reported.tolist(), strict=True) if not dup]
        if finished:
            statuses = tuple(self._executor.status(t) for t in sorted(finished))
            stopped += [s.table_id for s in statuses if s.state == T.STOPPED]
            header = self._header()
            out.append(DispatchTableResponse(header, self._capture_id, self._owner_id, statuses))
        for table_id in sorted(set(stopped)):
            # Reported once with its final checkpoint: from now on it reads ABSENT.
            self._executor.forget(table_id)
        self._check_invariant()
        return out

    def _drive_tasks(self) -> list[int]:
        finished = []
        for table_id, task in list(self._tasks.items()):
            if isinstance(task.request, RemoveTableRequest):
                done = self._drive_remove(table_id)
            else:
                done = self._drive_add(task)
            if done:
                del self._tasks[table_id]
                finished.append(table_id)
        return finished

    def _drive_add(self, task: _Task) -> bool:
        req = task.request
        assert isinstance(req, AddTableRequest)
        ex = self._executor
        state = ex.status(req.table_id).state
        if state == T.ABSENT:
            # A direct add (is_secondary=False) prepares first too, as TiCDC's agent does.
            ex.prepare(req.table_id, req.checkpoint)
            state = ex.status(req.table_id).state
        if state == T.PREPARED and not req.is_secondary and not task.commit_sent:
            task.commit_sent = True
            ex.commit(req.table_id, req.checkpoint)
            state = ex.status(req.table_id).state
        if state == T.PREPARING:
            return False
        if state == T.PREPARED:
            return req.is_secondary  # a commit still waits for the executor
        if state in (T.STOPPING, T.STOPPED):
            log.warning(
                "capture %s: add of table %s while it is %s: the add is dropped",
                self._capture_id,
                req.table_id,
                state.name,
            )
        return True

    def _drive_remove(self, table_id: int) -> bool:
        ex = self._executor
        state = ex.status(table_id).state
        if state in (T.PREPARING, T.PREPARED, T.REPLICATING):
            ex.remove(table_id)
            state = ex.status(table_id).state
        return state != T.STOPPING  # STOPPED (final checkpoint) or ABSENT: done

    def _heartbeat_response(self, hb: Heartbeat) -> tuple[HeartbeatResponse, list[int]]:
        held = self._executor.statuses()
        # Columnar on purpose: a capture may hold 10k tables; no Python loop over them.
        missing = np.setdiff1d(hb.table_ids, held.table_ids)
        zeros = np.zeros(len(missing), np.int64)
        ids = np.concatenate([held.table_ids, missing])
        order = np.argsort(ids, kind="stable")
        tables = TableStatusBatch(
            ids[order],
            np.concatenate([held.states, zeros + int(T.ABSENT)])[order],
            np.concatenate([held.checkpoint_ts, zeros])[order],
            np.concatenate([held.resolved_ts, zeros])[order],
        )
        stopped = held.table_ids[held.states == int(T.STOPPED)].tolist()
        assert self._owner_id is not None
        response = HeartbeatResponse(
            self._header(),
            self._capture_id,
            self._owner_id,
            tables,
            self.liveness,
            self.registration,
        )
        return response, stopped

    def _header(self) -> Header:
        self._seq += 1
        return Header(self._owner_rev, self._epoch, self._changefeed_epoch, seq=self._seq)

    def _check_invariant(self) -> None:
        ok = (
            # An owner implies a rev; a rev without an owner is a floor from the registry.
            (self._owner_id is None or self._owner_rev > 0)
            and (self._owner_id is not None or not self._tasks)
            and bool(self._epoch)
            and all(t == task.request.table_id for t, task in self._tasks.items())
        )
        if not ok:
            raise AgentInvariantError(
                f"capture {self._capture_id}: owner {self._owner_id!r} rev {self._owner_rev}, "
                f"epoch {self._epoch!r}, tasks {list(self._tasks)}"
            )

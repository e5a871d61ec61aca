"""Scheduler benchmark: how long the *owner* (``Coordinator``) takes, 1k..1M tables.

Grid: tables in {1k, 10k, 100k, 1M} x captures in {8, 100}. Targets (this 2-core
machine, 1M tables x 100 captures): steady tick p50 <= 250 ms, rebuild <= 5 s,
initial assignment <= 10 s. Rebalancing has no target; it is reported.

Usage::

    python bench/scheduler_bench.py                          # the whole grid, one subprocess per size
    python bench/scheduler_bench.py --tables 1000000 --captures 100
    python bench/scheduler_bench.py --validate               # fake captures vs Agent+FakeExecutor
    python bench/scheduler_bench.py --tables 100000 --captures 100 --profile initial,steady

A one-size run ends with one machine-readable line::

    steady_tick_p50_ms=... rebuild_s=... initial_assign_s=... rebalance_10pct_s=...

Definitions
-----------
* Timed region: only ``Coordinator.tick`` calls (``time.perf_counter``; GC left on).
  Capture-side work runs on other machines in reality, so the captures' responses are
  built outside the timed region.
* owner tick (``owner_ms``, ``owner_tick_p50_ms=``): the steady tick as the Dagster owner
  sensor runs it: decode every capture's task status as read from etcd
  (``status_codec.decode``; the captures encode them on their own machines, untimed),
  the coordinator tick, and encoding what the owner writes back (the changefeed status
  record and the GC safepoint). The etcd round trips themselves are not included (see
  ``bench/metastore_bench.py``).
* paced initial assignment: a fresh owner with the default ``CoordinatorConfig`` (50 adds
  per tick); up to 40 owner ticks are run, and beyond that the tick count is extrapolated
  from the rate of tables replicating per tick (``paced_ticks``), the owner CPU time from
  the mean tick time (``paced_s``, marked ``~`` when estimated), and the wall time at the
  Dagster sensor's ~5 s floor (``paced_h@5s``).
* Captures: :class:`FastCapture`, a fake that keeps its tables in numpy columns and
  answers like ``Agent`` + ``FakeExecutor(prepare_ticks=0, stop_ticks=0)`` would: an
  add of a secondary -> PREPARED, an add of a primary -> REPLICATING, a remove -> STOPPED
  (reported once, then forgotten), all within the tick; replicating tables sink up to
  the upstream's resolved ts every tick. It fences like the Agent (owner_rev, owner id,
  changefeed epoch, capture epoch on dispatches; a new epoch per new owner) and answers
  each heartbeat with a ``HeartbeatResponse`` (a ``TableStatusBatch`` of every table it
  holds, ABSENT for listed ones it lacks) and the finished dispatches with a
  ``DispatchTableResponse``; headers carry a per-capture increasing ``seq``.
  ``--validate`` runs every phase at 1k x 8 with these fakes and with the real
  ``Agent`` + ``FakeExecutor`` and requires the same per-tick owner outputs (dispatch
  counts, checkpoints) and the same table placement.
* Coordinator: ``random.Random(0)``, table ids 1..N, changefeed epoch 1,
  ``CoordinatorConfig(add_table_batch_size=N)``, other settings default
  (max_task_concurrency=10). The default batch of 50 adds per tick is TiCDC's pacing
  for live clusters; here the whole set is added at once to time the owner's work.
* initial assignment: sum of the owner tick times from a fresh Coordinator (the M
  captures alive, reporting empty) until every table is REPLICATING. Includes the tick
  in which the captures first report (the owner schedules in that same tick).
* steady tick: every table REPLICATING; each tick every capture reports all its tables
  with advanced checkpoints; p50 and p95 of 20 owner ticks (after 2 warm-up ticks).
  Checked: no dispatch, and the changefeed checkpoint reaches the captures' new
  checkpoint every tick (so every report was applied).
* rebuild (owner switch): a new Coordinator (owner_rev + 1) ticks once with no reports
  (it heartbeats the captures, untimed), then receives every capture's HeartbeatResponse
  (all tables REPLICATING) and ticks once: the time of that tick, which rebuilds the
  replication sets from the reports.
* rebalance 10%: with the M captures evenly loaded, ceil(M/9) empty captures join (so
  an even spread moves ~10% of the tables); once they reported (untimed ticks),
  ``request_rebalance()``, then the sum of owner tick times until every table is
  REPLICATING again with no replication set in flux and no running task. Reported with
  the number of tables moved.
* peak RSS: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of the process of that size.
* ratio to target: figure / target (targets are for 1M x 100). Scaling: per-table cost
  at 1M divided by per-table cost at 1k, same capture count (1.0 = linear).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import io
import itertools
import json
import math
import os
import pstats
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from cdc_dagster.metastore.changefeeds import ChangefeedState, ChangefeedStatus, encode_record
from cdc_dagster.metastore.status_codec import TaskStatus, decode, encode
from scheduler_core.agent import Agent
from scheduler_core.captures import CaptureState
from scheduler_core.coordinator import Coordinator, CoordinatorConfig, TickResult
from scheduler_core.messages import (
    AddTableRequest,
    CaptureMessage,
    Dispatch,
    DispatchTableResponse,
    Header,
    Heartbeat,
    HeartbeatResponse,
    OwnerMessage,
    TableStatusBatch,
)
from scheduler_core.model import Checkpoint, TableState, TableStatus
from scheduler_core.sim.fake_executor import FakeDownstream, FakeExecutor, FakeUpstream
from scheduler_core.ts import compose

TABLE_SIZES = (1_000, 10_000, 100_000, 1_000_000)
CAPTURE_SIZES = (8, 100)
TARGET_STEADY_P50_MS = 250.0
TARGET_REBUILD_S = 5.0
TARGET_INITIAL_S = 10.0

START_MS = 1_700_000_000_000
TICK_MS = 50
CHANGEFEED_EPOCH = 1
STEADY_WARMUP = 2
STEADY_TICKS = 20
MAX_PHASE_TICKS = 100
PACED_SAMPLE_TICKS = 40
SENSOR_FLOOR_S = 5.0

HEADER = """\
Scheduler benchmark: owner (Coordinator.tick) time, and the owner tick with decoding the
captures' etcd reports and encoding its writes (owner_ms); capture responses are built
outside the timed region by numpy-column fake captures that answer like Agent +
FakeExecutor(prepare_ticks=0, stop_ticks=0) (cross-checked with --validate at 1k x 8).
Coordinator: Random(0), tables 1..N, CoordinatorConfig(add_table_batch_size=N), the rest
default. (The default 50 adds/tick is TiCDC's pacing for live clusters.)
  init_s    : sum of owner ticks, fresh owner + M captures -> every table REPLICATING
  p50/p95_ms: steady tick, every capture reports all tables with advanced checkpoints (20 ticks)
  rebuild_s : new owner (owner_rev+1), one tick receiving every capture's report (all REPLICATING)
  rebal_s   : ceil(M/9) empty captures join, request_rebalance(), owner ticks until all moves done
  moved     : tables moved by the rebalance; rss_MB: peak RSS of that size's process
  owner_ms  : steady owner tick p50 as the sensor runs it: decode reports + tick + encode writes
  paced_*   : initial assignment at the default 50 adds/tick: owner ticks, owner seconds,
              hours at the sensor's 5 s floor (~: extrapolated from 40 ticks)
Targets at 1M x 100: steady p50 <= 250 ms, rebuild <= 5 s, initial assignment <= 10 s."""

T = TableState
_ABSENT, _PREPARED, _REPLICATING, _STOPPED = (
    int(T.ABSENT),
    int(T.PREPARED),
    int(T.REPLICATING),
    int(T.STOPPED),
)
_STATES = list(TableState)
_ZERO = Checkpoint(0, 0)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- captures
class Capture(Protocol):
    """What the driver needs of a capture."""

    capture_id: str
    registration: str

    def handle(self, msgs: Iterable[OwnerMessage]) -> None: ...

    def tick(self, now_ts: int) -> list[CaptureMessage]: ...


class FastCapture:
    """A capture answering the owner from numpy columns, instantly (see the module docstring)."""

    def __init__(self, capture_id: str, registration: str) -> None:
        self.capture_id = capture_id
        self.registration = registration
        self._epochs = itertools.count(1)
        self.epoch = self._new_epoch()
        self.owner_rev = 0
        self.owner_id: str | None = None
        self.changefeed_epoch = 0
        self._seq = 0
        self._heartbeat: Heartbeat | None = None
        self._barrier_ts = 0  # like FakeExecutor: sink nothing until the owner says how far
        self._pending: list[Dispatch] = []
        self.ids = np.empty(0, np.int64)  # sorted table ids
        self.states = np.empty(0, np.int64)
        self.ckpt = np.empty(0, np.int64)
        self.resolved = np.empty(0, np.int64)

    def _new_epoch(self) -> str:
        return f"{self.capture_id}-e{next(self._epochs)}"

    # -------------------------------------------------------------- receive (Agent fencing)
    def handle(self, msgs: Iterable[OwnerMessage]) -> None:
        """Fence like the Agent; keep the latest heartbeat and queue the dispatches."""
        for m in msgs:
            h = m.header
            if m.to != self.capture_id or h.owner_rev <= 0 or h.owner_rev < self.owner_rev:
                continue
            if h.owner_rev > self.owner_rev:  # a new owner: new epoch, drop the old one's work
                self.epoch = self._new_epoch()
                self.owner_rev, self.owner_id = h.owner_rev, m.sender
                self.changefeed_epoch = h.changefeed_epoch
                self._pending.clear()
                self._heartbeat = None
            elif m.sender != self.owner_id:
                continue
            if h.changefeed_epoch < self.changefeed_epoch:
                continue
            self.changefeed_epoch = h.changefeed_epoch
            if isinstance(m, Heartbeat):
                self._heartbeat = m
            elif h.capture_epoch == self.epoch:
                self._pending.extend(m.all_requests())

    # -------------------------------------------------------------- one processor tick
    def tick(self, now_ts: int) -> list[CaptureMessage]:
        """Carry out the dispatches, advance, and build the responses."""
        hb, self._heartbeat = self._heartbeat, None
        if hb is not None:
            self._barrier_ts = hb.barrier.global_barrier_ts
        finished = self._apply_dispatches(now_ts)
        self._advance(now_ts)
        out: list[CaptureMessage] = []
        if self.owner_id is None:
            return out
        if hb is not None:
            response = self._heartbeat_response(hb)
            out.append(response)
            # As the Agent: a state already in the heartbeat response is not sent twice.
            finished = finished[~np.isin(finished, response.tables.table_ids)]
        if len(finished):
            statuses = self._statuses(finished)
            out.append(
                DispatchTableResponse(self._header(), self.capture_id, self.owner_id, statuses)
            )
        stopped = self.states == _STOPPED
        if stopped.any():  # reported once with the final checkpoint, then forgotten
            self._take(~stopped)
        return out

    def _header(self) -> Header:
        self._seq += 1
        return Header(self.owner_rev, self.epoch, self.changefeed_epoch, self._seq)

    def _find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.searchsorted(self.ids, ids)
        if not len(self.ids):
            return pos, np.zeros(len(ids), bool)
        return pos, self.ids[np.minimum(pos, len(self.ids) - 1)] == ids

    def _apply_dispatches(self, now_ts: int) -> np.ndarray:
        reqs, self._pending = self._pending, []
        if not reqs:
            return np.empty(0, np.int64)
        seen: set[int] = set()  # the Agent ignores a second task for a table in flight
        add_ids: list[int] = []
        add_sec: list[bool] = []
        add_ck: list[int] = []
        rem_ids: list[int] = []
        for r in reqs:
            t = r.table_id
            if t in seen:
                continue
            seen.add(t)
            if isinstance(r, AddTableRequest):
                add_ids.append(t)
                add_sec.append(r.is_secondary)
                add_ck.append(r.checkpoint.checkpoint_ts)
            else:
                rem_ids.append(t)
        if add_ids:
            self._add(
                np.asarray(add_ids, np.int64),
                np.asarray(add_sec, bool),
                np.asarray(add_ck, np.int64),
                now_ts,
            )
        if rem_ids:
            self._remove(np.asarray(rem_ids, np.int64))
        return np.sort(np.fromiter(seen, np.int64, len(seen)))

    def _add(self, ids: np.ndarray, sec: np.ndarray, ck: np.ndarray, now_ts: int) -> None:
        pos, present = self._find(ids)
        # Held: a PREPARED table with a primary add is committed at the request's checkpoint;
        # anything else (replicating, a repeated secondary add, stopped) just finishes.
        rows = pos[present]
        commit = (self.states[rows] == _PREPARED) & ~sec[present]
        rows = rows[commit]
        self.states[rows] = _REPLICATING
        self.ckpt[rows] = ck[present][commit]
        self.resolved[rows] = np.maximum(self.resolved[rows], self.ckpt[rows])
        # Absent: prepare (PREPARED at once), and commit too for a primary add.
        new = ~present
        if new.any():
            n_ck = ck[new]
            states = np.where(sec[new], _PREPARED, _REPLICATING).astype(np.int64)
            self._insert(ids[new], states, n_ck, np.maximum(n_ck, now_ts))

    def _remove(self, ids: np.ndarray) -> None:
        pos, present = self._find(ids)
        rows = pos[present]
        live = (self.states[rows] >= int(T.PREPARING)) & (self.states[rows] <= _REPLICATING)
        self.states[rows[live]] = _STOPPED

    def _advance(self, now_ts: int) -> None:
        live = self.states != _STOPPED
        self.resolved[live] = np.maximum(self.resolved[live], now_ts)
        rep = self.states == _REPLICATING
        target = np.minimum(self.resolved[rep], self._barrier_ts)
        self.ckpt[rep] = np.maximum(self.ckpt[rep], target)

    def _heartbeat_response(self, hb: Heartbeat) -> HeartbeatResponse:
        missing = np.setdiff1d(hb.table_ids, self.ids)
        ids, states, ckpt, resolved = self.ids, self.states, self.ckpt, self.resolved
        if len(missing):
            zeros = np.zeros(len(missing), np.int64)
            ids = np.concatenate([ids, missing])
            order = np.argsort(ids, kind="stable")
            ids = ids[order]
            states = np.concatenate([states, zeros + _ABSENT])[order]
            ckpt = np.concatenate([ckpt, zeros])[order]
            resolved = np.concatenate([resolved, zeros])[order]
        batch = TableStatusBatch(ids, states, ckpt, resolved)  # copies: writeable inputs
        assert self.owner_id is not None
        return HeartbeatResponse(
            self._header(), self.capture_id, self.owner_id, batch, registration=self.registration
        )

    def _statuses(self, finished: np.ndarray) -> tuple[TableStatus, ...]:
        pos, present = self._find(finished)
        p = np.minimum(pos, max(len(self.ids) - 1, 0))
        if len(self.ids):
            st, ck, rs = self.states[p].tolist(), self.ckpt[p].tolist(), self.resolved[p].tolist()
        else:
            st = ck = rs = [0] * len(finished)
        return tuple(
            TableStatus(t, _STATES[s], Checkpoint(c, r)) if ok else TableStatus(t, T.ABSENT, _ZERO)
            for t, ok, s, c, r in zip(finished.tolist(), present.tolist(), st, ck, rs, strict=True)
        )

    def _insert(self, ids: np.ndarray, states: np.ndarray, ck: np.ndarray, rs: np.ndarray) -> None:
        all_ids = np.concatenate([self.ids, ids])
        order = np.argsort(all_ids, kind="stable")
        self.ids = all_ids[order]
        self.states = np.concatenate([self.states, states])[order]
        self.ckpt = np.concatenate([self.ckpt, ck])[order]
        self.resolved = np.concatenate([self.resolved, rs])[order]

    def _take(self, keep: np.ndarray) -> None:
        self.ids = self.ids[keep]
        self.states = self.states[keep]
        self.ckpt = self.ckpt[keep]
        self.resolved = self.resolved[keep]


class AgentCapture:
    """The real thing, for the cross-check: Agent + FakeExecutor(prepare_ticks=0, stop_ticks=0)."""

    def __init__(
        self, capture_id: str, registration: str, up: FakeUpstream, down: FakeDownstream
    ) -> None:
        self.capture_id = capture_id
        self.registration = registration
        self.executor = FakeExecutor(capture_id, down, up, prepare_ticks=0, stop_ticks=0)
        epochs = itertools.count(1)
        self.agent = Agent(
            capture_id, self.executor, lambda: f"{capture_id}-e{next(epochs)}", registration
        )

    def handle(self, msgs: Iterable[OwnerMessage]) -> None:
        self.agent.handle(msgs)

    def tick(self, now_ts: int) -> list[CaptureMessage]:
        return self.agent.tick()  # the driver already moved the shared upstream to now_ts


# ---------------------------------------------------------------------------- the driver
class Cluster:
    """One owner and its captures, stepped like the simulator: captures, then the owner."""

    def __init__(
        self,
        n_tables: int,
        n_captures: int,
        *,
        real_agents: bool = False,
        record: bool = False,
        paced: bool = False,
    ) -> None:
        self.n_tables = n_tables
        self.record = record  # keep a digest of every message the owner receives (validation)
        self.inbox_digest: list[tuple] = []
        self.tables = np.arange(1, n_tables + 1, dtype=np.int64)
        self.real_agents = real_agents
        self.now_ms = START_MS
        self.upstream = FakeUpstream(compose(START_MS))
        self.downstream = FakeDownstream(compose(START_MS))
        self.config = (
            CoordinatorConfig() if paced else CoordinatorConfig(add_table_batch_size=n_tables)
        )
        self.last_codec_s = 0.0  # decode + encode time of the last step(via_etcd=True)
        self.last_cpu_s = 0.0  # CPU time of decode + tick + encode (less noisy when loaded)
        self.captures: dict[str, Capture] = {}
        self.alive: dict[str, str] = {}
        self.owner: Coordinator | None = None
        self.owner_rev = 0
        self.outbox: list[OwnerMessage] = []
        self.profiler: cProfile.Profile | None = None
        self.trace: list[
            tuple[int, int, str | None]
        ] = []  # per tick: dispatches, checkpoint, scheduler
        for _ in range(n_captures):
            self.add_capture()

    def add_capture(self) -> str:
        i = len(self.captures)
        cid, reg = f"capture-{i:03d}", f"reg-{i}"
        if self.real_agents:
            self.captures[cid] = AgentCapture(cid, reg, self.upstream, self.downstream)
        else:
            self.captures[cid] = FastCapture(cid, reg)
        self.alive[cid] = reg
        return cid

    def elect(self, checkpoint: Checkpoint) -> Coordinator:
        self.owner = None
        self.outbox = []
        gc.collect()
        self.owner_rev += 1
        self.owner = Coordinator(
            owner_id=f"owner-{self.owner_rev}",
            owner_rev=self.owner_rev,
            changefeed_epoch=CHANGEFEED_EPOCH,
            checkpoint=checkpoint,
            tables=self.tables.tolist(),
            rng=random.Random(0),
            config=self.config,
        )
        return self.owner

    def now_ts(self) -> int:
        return compose(self.now_ms)

    def step(self, via_etcd: bool = False) -> tuple[float, TickResult]:
        """Captures answer the last owner messages (untimed), then one timed owner tick.

        ``via_etcd``: the heartbeat responses travel as etcd task-status values; their
        decoding and the encoding of the owner's writes are timed into ``last_codec_s``.
        """
        assert self.owner is not None
        self.now_ms += TICK_MS
        now = self.now_ts()
        self.upstream.advance(now)
        by_capture: dict[str, list[OwnerMessage]] = {}
        for m in self.outbox:
            by_capture.setdefault(m.to, []).append(m)
        inbox: list[CaptureMessage] = []
        for cid, cap in self.captures.items():
            cap.handle(by_capture.get(cid, ()))
            inbox.extend(cap.tick(now))
        if self.record:
            self.inbox_digest.append(tuple(_digest(m) for m in inbox))
        stored = [_as_stored(m) for m in inbox] if via_etcd else None  # capture side: untimed
        prof = self.profiler
        t_decode, cpu0 = time.perf_counter(), time.thread_time()
        if stored is not None:
            inbox = [_from_stored(m, value) for m, value in stored]
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        res = self.owner.tick(self.alive, inbox)
        if prof is not None:
            prof.disable()
        dt = time.perf_counter() - t0
        if stored is not None:
            t_encode = time.perf_counter()
            _owner_writes(res)
            self.last_codec_s = (t0 - t_decode) + (time.perf_counter() - t_encode)
            self.last_cpu_s = time.thread_time() - cpu0
        self.outbox = res.messages
        self.trace.append((res.dispatches, res.checkpoint.checkpoint_ts, res.scheduler))
        return dt, res

    def assignment(self) -> np.ndarray:
        """Capture index (in sorted capture order) of every table's holder; -1 if none."""
        assert self.owner is not None
        out = np.full(self.n_tables + 1, -1, np.int32)
        for i, cid in enumerate(sorted(self.captures)):
            out[self.owner.replications.owned_tables(cid)] = i
        return out[1:]


def _as_stored(m: CaptureMessage) -> tuple[CaptureMessage, bytes | None]:
    """What a capture writes to etcd for a heartbeat response: its encoded task status."""
    if not isinstance(m, HeartbeatResponse):
        return m, None
    status = TaskStatus(m.header.owner_rev, CHANGEFEED_EPOCH, m.liveness, m.tables)
    return m, encode(status)


def _from_stored(m: CaptureMessage, value: bytes | None) -> CaptureMessage:
    """The owner's side: the message rebuilt from the decoded etcd value."""
    if value is None:
        return m
    assert isinstance(m, HeartbeatResponse)
    return dataclasses.replace(m, tables=decode(value).tables)


def _owner_writes(res: TickResult) -> list[bytes]:
    """What the owner writes back after a tick: the changefeed status and the GC safepoint."""
    ck = res.checkpoint
    status = ChangefeedStatus(
        ck.checkpoint_ts, ck.resolved_ts, ChangefeedState.NORMAL, epoch=CHANGEFEED_EPOCH
    )
    return [encode_record(status, "bench"), str(ck.checkpoint_ts).encode()]


def _digest(m: CaptureMessage) -> tuple:
    h = m.header
    if isinstance(m, HeartbeatResponse):
        b = m.tables
        rows = (len(b), int(b.table_ids.sum()), int(b.states.sum()), int(b.checkpoint_ts.sum()))
    else:
        rows = (
            len(m.statuses),
            sum(s.table_id for s in m.statuses),
            sum(int(s.state) for s in m.statuses),
            sum(s.checkpoint.checkpoint_ts for s in m.statuses),
        )
    return (type(m).__name__, m.sender, h.owner_rev, h.capture_epoch, h.seq, *rows)


# ---------------------------------------------------------------------------- phases
@dataclass(slots=True)
class Result:
    tables: int
    captures: int
    initial_assign_s: float = math.nan
    initial_ticks: int = 0
    steady_p50_ms: float = math.nan
    steady_p95_ms: float = math.nan
    owner_tick_p50_ms: float = math.nan  # decode reports + tick + encode writes
    owner_tick_p95_ms: float = math.nan
    owner_tick_cpu_p50_ms: float = math.nan  # the same in this thread's CPU time
    paced_ticks: int = 0
    paced_s: float = math.nan
    paced_estimated: bool = False
    rebuild_s: float = math.nan
    rebalance_s: float = math.nan
    rebalance_ticks: int = 0
    moved: int = 0
    added_captures: int = 0
    peak_rss_mb: float = math.nan
    wall_s: float = math.nan
    load_1m: float = math.nan  # load average at the end; the bench itself is ~1 of 2 cores
    assignments: dict[str, np.ndarray] = field(default_factory=dict)

    def detail(self) -> dict[str, float | int]:
        return {
            k: getattr(self, k)
            for k in self.__slots__  # type: ignore[attr-defined]
            if k != "assignments"
        }

    def machine_line(self) -> str:
        return (
            f"steady_tick_p50_ms={self.steady_p50_ms:.3f} "
            f"owner_tick_p50_ms={self.owner_tick_p50_ms:.3f} "
            f"owner_tick_cpu_p50_ms={self.owner_tick_cpu_p50_ms:.3f} rebuild_s={self.rebuild_s:.4f} "
            f"initial_assign_s={self.initial_assign_s:.4f} rebalance_10pct_s={self.rebalance_s:.4f} "
            f"paced_initial_ticks={self.paced_ticks} paced_initial_s={self.paced_s:.3f}"
        )


class Phases:
    """Runs the four measurements in order on one cluster."""

    def __init__(self, cl: Cluster, profile: set[str] | None = None) -> None:
        self.cl = cl
        self.profile = profile or set()
        self.profiles: dict[str, cProfile.Profile] = {}

    def _profiling(self, phase: str) -> None:
        if phase in self.profile:
            self.cl.profiler = self.profiles[phase] = cProfile.Profile()
        else:
            self.cl.profiler = None

    def run(self, r: Result) -> Result:
        t0 = time.perf_counter()
        self.initial(r)
        self.steady(r)
        self.rebuild(r)
        self.rebalance(r)
        self.cl.profiler = None
        paced_initial(r)
        r.wall_s = time.perf_counter() - t0
        r.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        r.load_1m = os.getloadavg()[0]
        return r

    def _owner(self) -> Coordinator:
        assert self.cl.owner is not None
        return self.cl.owner

    def initial(self, r: Result) -> None:
        cl = self.cl
        _log(f"{r.tables}x{r.captures}: initial assignment")
        cl.elect(Checkpoint.at(cl.now_ts()))
        self._profiling("initial")
        total, ticks = 0.0, 0
        rm = self._owner().replications
        while not (len(rm) == cl.n_tables and rm.all_replicating()):
            if ticks >= MAX_PHASE_TICKS:
                raise RuntimeError(f"initial assignment not done after {ticks} ticks")
            dt, _ = cl.step()
            total += dt
            ticks += 1
            rm = self._owner().replications
        r.initial_assign_s, r.initial_ticks = total, ticks
        r.assignments["initial"] = cl.assignment()
        if (r.assignments["initial"] < 0).any():
            raise RuntimeError("a table has no holder after the initial assignment")
        _log(f"  {total:.3f} s in {ticks} ticks")

    def steady(self, r: Result) -> None:
        cl = self.cl
        _log(f"{r.tables}x{r.captures}: steady ticks")
        self._profiling("none")
        for _ in range(STEADY_WARMUP):
            cl.step()
        self._profiling("steady")
        times, owner_times, cpu_times = [], [], []
        start = self._owner().checkpoint.checkpoint_ts
        for _ in range(STEADY_TICKS):
            dt, res = cl.step(via_etcd=True)
            times.append(dt)
            owner_times.append(dt + cl.last_codec_s)
            cpu_times.append(cl.last_cpu_s)
            if res.dispatches or res.checkpoint.checkpoint_ts != cl.now_ts():
                raise RuntimeError(
                    f"steady tick not steady: {res.dispatches} dispatches, checkpoint "
                    f"{res.checkpoint.checkpoint_ts} != captures' {cl.now_ts()}"
                )
        if self._owner().checkpoint.checkpoint_ts <= start:
            raise RuntimeError("the checkpoint did not advance in the steady ticks")
        r.steady_p50_ms = statistics.median(times) * 1e3
        r.steady_p95_ms = float(np.percentile(times, 95)) * 1e3
        r.owner_tick_p50_ms = statistics.median(owner_times) * 1e3
        r.owner_tick_p95_ms = float(np.percentile(owner_times, 95)) * 1e3
        r.owner_tick_cpu_p50_ms = statistics.median(cpu_times) * 1e3
        _log(
            f"  p50 {r.steady_p50_ms:.2f} ms, p95 {r.steady_p95_ms:.2f} ms; with decode/encode "
            f"p50 {r.owner_tick_p50_ms:.2f} ms, p95 {r.owner_tick_p95_ms:.2f} ms "
            f"(CPU p50 {r.owner_tick_cpu_p50_ms:.2f} ms)"
        )

    def rebuild(self, r: Result) -> None:
        cl = self.cl
        _log(f"{r.tables}x{r.captures}: rebuild (owner switch)")
        owner = cl.elect(self._owner().checkpoint)
        self._profiling("none")
        cl.step()  # the new owner's first heartbeats; the captures have not heard of it yet
        self._profiling("rebuild")
        dt, res = cl.step()
        rm = owner.replications
        if not (
            owner.stats.rebuilds == 1
            and len(rm) == cl.n_tables
            and rm.all_replicating()
            and not rm.active()
            and res.dispatches == 0
        ):
            raise RuntimeError(f"rebuild incomplete: {owner.stats}, {len(rm)} tables")
        if not np.array_equal(cl.assignment(), r.assignments["initial"]):
            raise RuntimeError("the rebuilt owner sees another placement than the old one")
        r.rebuild_s = dt
        _log(f"  {dt:.3f} s")

    def rebalance(self, r: Result) -> None:
        cl = self.cl
        owner = self._owner()
        _log(f"{r.tables}x{r.captures}: rebalance")
        self._profiling("none")
        r.added_captures = math.ceil(r.captures / 9)
        for _ in range(r.added_captures):
            cl.add_capture()
        joins = 0
        while (
            any(st.state == CaptureState.UNINITIALIZED for st in owner.captures.captures.values())
            or joins < 1
        ):
            cl.step()
            joins += 1
            if joins > 10:
                raise RuntimeError("new captures did not initialize")
        before = cl.assignment()
        owner.request_rebalance()
        self._profiling("rebalance")
        rm = owner.replications
        total, ticks = 0.0, 0
        while (
            owner.rebalance.requested or not rm.all_replicating() or rm.active() or rm.running_tasks
        ):
            if ticks >= MAX_PHASE_TICKS:
                raise RuntimeError(f"rebalance not done after {ticks} ticks")
            dt, _ = cl.step()
            total += dt
            ticks += 1
        after = cl.assignment()
        counts = np.bincount(after, minlength=len(cl.captures))
        if (after < 0).any() or counts.max() - counts.min() > 1:
            raise RuntimeError(f"rebalance left an uneven load: {counts.min()}..{counts.max()}")
        r.rebalance_s, r.rebalance_ticks = total, ticks
        r.moved = int((before != after).sum())
        r.assignments["rebalanced"] = after
        _log(f"  {total:.3f} s in {ticks} ticks, {r.moved} tables moved")


def paced_initial(r: Result) -> None:
    """Initial assignment under the default add pacing (see the module docstring)."""
    _log(f"{r.tables}x{r.captures}: initial assignment, default pacing")
    cl = Cluster(r.tables, r.captures, paced=True)
    owner = cl.elect(Checkpoint.at(cl.now_ts()))
    total, ticks, done = 0.0, 0, False
    while ticks < PACED_SAMPLE_TICKS:
        dt, _ = cl.step()
        total += dt
        ticks += 1
        rm = owner.replications
        if len(rm) == cl.n_tables and rm.all_replicating():
            done = True
            break
    if done:
        r.paced_ticks, r.paced_s = ticks, total
    else:
        replicating = int((cl.assignment() >= 0).sum())
        rate = max(replicating / ticks, 1e-9)
        r.paced_ticks = math.ceil(cl.n_tables / rate)
        r.paced_s = total / ticks * r.paced_ticks
        r.paced_estimated = True
    mark = "~" if r.paced_estimated else ""
    _log(f"  {mark}{r.paced_ticks} ticks, {mark}{r.paced_s:.1f} s of owner time")


def run_size(
    n_tables: int,
    n_captures: int,
    *,
    real_agents: bool = False,
    profile: set[str] | None = None,
    record: bool = False,
) -> tuple[Result, Phases]:
    cl = Cluster(n_tables, n_captures, real_agents=real_agents, record=record)
    phases = Phases(cl, profile)
    res = phases.run(Result(n_tables, n_captures))
    return res, phases


# ---------------------------------------------------------------------------- validation
def validate(n_tables: int = 1_000, n_captures: int = 8) -> str:
    """Fake captures vs Agent+FakeExecutor: the owner must see the same thing, tick by tick."""
    fake, fp = run_size(n_tables, n_captures, record=True)
    real, rp = run_size(n_tables, n_captures, real_agents=True, record=True)
    problems = []
    for what, a, b in (
        ("owner outputs (dispatches, checkpoint, scheduler)", fp.cl.trace, rp.cl.trace),
        ("messages the owner received", fp.cl.inbox_digest, rp.cl.inbox_digest),
    ):
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            problems.append(f"{what} differ at tick {at} ({len(a)} vs {len(b)} ticks)")
    for k in ("initial", "rebalanced"):
        if not np.array_equal(fake.assignments[k], real.assignments[k]):
            problems.append(f"{k} placement differs")
    if problems:
        raise SystemExit("validation FAILED: " + "; ".join(problems))
    cps = [c for _, c, _ in rp.cl.trace]
    msgs = sum(len(t) for t in rp.cl.inbox_digest)
    return (
        f"validation {_size(n_tables)} x {n_captures}: fake captures == Agent+FakeExecutor over "
        f"{len(cps)} owner ticks ({msgs} capture messages: type, epoch, seq, rows, states, "
        f"checkpoints; owner dispatch counts, checkpoints, placement). Every table REPLICATING, "
        f"checkpoint +{(cps[-1] - cps[0]) >> 18} ms; initial {fake.initial_ticks} ticks; "
        f"rebalance moved {fake.moved} in {fake.rebalance_ticks} ticks."
    )


# ---------------------------------------------------------------------------- output
def _size(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1_000}k"


def _ratio(x: float, target: float) -> str:
    return "   n/a" if math.isnan(x) else f"{x / target:6.2f}"


COLUMNS = (
    f"{'tables':>7} {'capt':>4} | {'init_s':>8} {'p50_ms':>8} {'p95_ms':>8} {'rebuild_s':>9} "
    f"{'rebal_s':>8} {'moved':>7} | {'owner_ms':>8} {'own/T':>6} | "
    f"{'paced_ticks':>11} {'paced_s':>9} {'h@5s':>6} | {'init/T':>6} {'p50/T':>6} {'rbld/T':>6} | "
    f"{'rss_MB':>7} {'wall_s':>7} {'load':>5}"
)


def row(d: dict) -> str:
    return (
        f"{_size(d['tables']):>7} {d['captures']:>4} | {d['initial_assign_s']:8.3f} "
        f"{d['steady_p50_ms']:8.2f} {d['steady_p95_ms']:8.2f} {d['rebuild_s']:9.3f} "
        f"{d['rebalance_s']:8.3f} {d['moved']:>7} | "
        f"{d.get('owner_tick_p50_ms', math.nan):8.2f} "
        f"{_ratio(d.get('owner_tick_p50_ms', math.nan), TARGET_STEADY_P50_MS)} | "
        f"{_paced(d)} | "
        f"{_ratio(d['initial_assign_s'], TARGET_INITIAL_S)} "
        f"{_ratio(d['steady_p50_ms'], TARGET_STEADY_P50_MS)} "
        f"{_ratio(d['rebuild_s'], TARGET_REBUILD_S)} | "
        f"{d['peak_rss_mb']:7.0f} {d['wall_s']:7.1f} {d.get('load_1m', math.nan):5.2f}"
    )


def _paced(d: dict) -> str:
    mark = "~" if d.get("paced_estimated") else " "
    ticks = d.get("paced_ticks", 0)
    hours = ticks * SENSOR_FLOOR_S / 3600
    return f"{mark}{ticks:>10} {mark}{d.get('paced_s', math.nan):8.1f} {hours:6.2f}"


def print_table(rows: list[dict]) -> None:
    print(COLUMNS)
    print("-" * len(COLUMNS))
    for d in rows:
        print(row(d))
    print(
        "(ratio columns: figure / target; the targets are for 1M x 100, smaller sizes are for "
        "orientation. load: 1-min load average at the end of the size; the bench is ~1.0 of "
        f"{os.cpu_count()} CPUs, more means other processes competed)"
    )


def print_scaling(rows: list[dict]) -> None:
    by = {(d["tables"], d["captures"]): d for d in rows}
    lo, hi = TABLE_SIZES[0], TABLE_SIZES[-1]
    if any((lo, m) in by and (hi, m) in by for m in CAPTURE_SIZES):
        print(
            f"\nScaling: per-table cost at {_size(hi)} / per-table cost at {_size(lo)} "
            "(1.0 = linear; rebalance per moved table)"
        )
    for m in CAPTURE_SIZES:
        a, b = by.get((lo, m)), by.get((hi, m))
        if a is None or b is None:
            continue
        parts = []
        for key, label, per in (
            ("initial_assign_s", "init", "tables"),
            ("steady_p50_ms", "steady p50", "tables"),
            ("rebuild_s", "rebuild", "tables"),
            ("rebalance_s", "rebalance", "moved"),
        ):
            na, nb = max(a[per], 1), max(b[per], 1)
            ratio = (b[key] / nb) / (a[key] / na) if a[key] else math.nan
            parts.append(f"{label} {ratio:.2f}")
        print(f"  {m:>3} captures: " + ", ".join(parts))
    t = by.get((hi, 100))
    if t is not None:
        print(f"\n{_size(hi)} x 100 vs targets (ratio <= 1.00 meets it):")
        for label, x, target, unit in (
            ("steady tick p50", t["steady_p50_ms"], TARGET_STEADY_P50_MS, "ms"),
            ("owner tick p50", t["owner_tick_p50_ms"], TARGET_STEADY_P50_MS, "ms"),
            ("rebuild", t["rebuild_s"], TARGET_REBUILD_S, "s"),
            ("initial assignment", t["initial_assign_s"], TARGET_INITIAL_S, "s"),
        ):
            verdict = "ok" if x <= target else "OVER"
            print(
                f"  {label:<19} {x:10.3f} {unit:<2} target {target:g} {unit:<2} ratio {x / target:5.2f}  {verdict}"
            )


def print_profiles(phases: Phases, top: int) -> None:
    for name, prof in phases.profiles.items():
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("cumulative").print_stats(top)
        print(f"\n--- cProfile of owner ticks, phase {name!r}, top {top} by cumulative time ---")
        print(buf.getvalue().strip())


def run_grid(args: argparse.Namespace) -> None:
    print(HEADER)
    print()
    for m in CAPTURE_SIZES:
        print(validate(TABLE_SIZES[0], m))
    print()
    rows: list[dict] = []
    lines: list[str] = []
    for n, m in itertools.product(args.grid_tables, CAPTURE_SIZES):
        _log(f"grid: {_size(n)} x {m} (subprocess)")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--tables",
            str(n),
            "--captures",
            str(m),
            "--detail",
        ]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
        detail = next(
            (
                json.loads(line[len("DETAIL ") :])
                for line in proc.stdout.splitlines()
                if line.startswith("DETAIL ")
            ),
            None,
        )
        if proc.returncode or detail is None:
            print(f"{_size(n)} x {m}: FAILED (exit {proc.returncode})\n{proc.stdout[-2000:]}")
            continue
        rows.append(detail)
        lines.append(f"{_size(n)} x {m}: {proc.stdout.strip().splitlines()[-1]}")
        _log("  " + row(detail))
    print_table(rows)
    print_scaling(rows)
    print("\nMachine-readable line of each size:")
    for line in lines:
        print("  " + line)


def run_one(args: argparse.Namespace) -> None:
    profile = {p for p in args.profile.split(",") if p} if args.profile else None
    if not args.detail:
        print(HEADER)
        print()
    res, phases = run_size(args.tables, args.captures, profile=profile)
    d = res.detail()
    if not args.detail:
        print_table([d])
        print(
            f"initial assignment {res.initial_ticks} owner ticks; rebalance: {res.added_captures} "
            f"captures joined, {res.moved} tables moved ({100 * res.moved / res.tables:.1f}%) "
            f"in {res.rebalance_ticks} owner ticks"
        )
    if profile:
        print_profiles(phases, args.top)
        print("(timings above are inflated by cProfile)")
    print("DETAIL " + json.dumps(d))
    print(res.machine_line())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", type=int, help="run one size: number of tables")
    p.add_argument("--captures", type=int, help="run one size: number of captures")
    p.add_argument("--validate", action="store_true", help="only the 1k x 8 cross-check")
    p.add_argument(
        "--profile", default="", help="phases to cProfile: initial,steady,rebuild,rebalance"
    )
    p.add_argument("--top", type=int, default=10, help="profile lines per phase")
    p.add_argument("--detail", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--grid-tables",
        type=lambda s: [int(x) for x in s.split(",")],
        default=list(TABLE_SIZES),
        help="table counts of the grid (default: 1000,10000,100000,1000000)",
    )
    args = p.parse_args(argv)
    if args.validate:
        for m in CAPTURE_SIZES:
            print(validate(TABLE_SIZES[0], m))
        return
    if (args.tables is None) != (args.captures is None):
        p.error("--tables and --captures go together")
    if args.tables is None:
        run_grid(args)
    else:
        run_one(args)


if __name__ == "__main__":
    main()

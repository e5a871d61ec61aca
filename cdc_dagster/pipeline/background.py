"""Bulk tick phases at background priority, in a worker process beside the capture's.

A capture's in-process tick phases (``pipeline.job``: small by bytes, no Spark job) run in
the capture run's process at its priority. Most are a second of a stream's changes; some
move hundreds of thousands of rows at once -- a snapshot's table released by the puller,
its slices -- and those took the CPU the capture's other changefeeds' ticks needed (a
stream's Delta MERGE each second): on 2 cores, while a 100-table snapshot was read and
sunk, the stream beside it lagged by 15-20 s instead of 4.

So a phase moving at least ``bulk_rows`` row changes runs in a worker process of this
module at niceness ``BULK_NICE``: the stream's ticks come first, the bulk work takes what is
left. The worker is the capture run's child in a session of its own whose autogroup has that
niceness (Linux's autogroup scheduling weighs sessions against each other and a niceness
only within one: ``own_autogroup``), so it also yields to the other sessions -- a
snapshot's Spark readers, MariaDB.
The workers are started as a capture run that follows begins, while it waits for its
capture's earlier run, once a CPU is idle (``warm_when_idle``; as its loop begins at the
latest), or on first use
(spawned: nothing of the capture's threads, gRPC channels or Dagster state is forked), and
kept for the run's next bulk phases. The phase
functions are the Spark tasks' own (``spark_tasks.pull_table`` / ``sink_table``): pure
functions of a JSON spec, fenced at the sink like any task, one table each. A phase's tables
run side by side on ``CDC_DAGSTER_BULK_WORKERS`` workers (default 2): one worker wrote a
backlog's tables one after another, so the capture that finished its last pull later used
one core for its last MERGEs while the other stood idle. A worker that dies (killed, out of
memory) fails that phase -- the changefeed's failure, retried by the next tick -- and the
next bulk phase starts new workers.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

log = logging.getLogger(__name__)

BULK_NICE = 10  # niceness of bulk phases (the snapshot readers' default too)
WORKER_NAME = "cdc bulk"  # a worker's process name (what ``top`` and ``ps -o comm`` show)
# Worker processes per capture run, by default: the machine's cores shared by the captures
# registered (their runs share this machine), at least 1 -- a phase's tables side by side.
MAX_BULK_WORKERS = 64
IDLE_LOOK_S = 1.0  # warm_when_idle looks at the idle CPUs this often
# ... and waits until they were idle this long in a row: a second of idle CPUs was the gap
# between a workload's end and a backlog's drain, and imports started in it took the drain's
# CPU (throughput bench: the launcher's refills, which look once, did so)
IDLE_STEADY_S = 3.0

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_pool_size = 0
_captures = 1  # captures whose runs share this machine's cores (``share``)
_warmed: ProcessPoolExecutor | None = None  # the pool ``warm`` started its workers in
AUTOGROUP_NICE = False  # in the worker: whether its autogroup got the bulk niceness


def bulk_workers(environ: Mapping[str, str] | None = None, captures: int = 1) -> int:
    """``CDC_DAGSTER_BULK_WORKERS``: how many worker processes a capture run's bulk phases
    spread their tables over (1 to ``MAX_BULK_WORKERS``); a bad value is named. Unset: the
    machine's cores over the ``captures`` whose runs share them, at least 1 -- two
    captures on 2 cores had four workers MERGE a backlog's four tables at once, and a
    table's MERGE took ~0.7 CPU-s instead of ~0.5 (their threads over 2 cores: 1.5-1.8 s
    for the four against 1.2-1.4 s with two workers of two tables each, replayed from a
    kept drain of bench/throughput_bench.py)."""
    env = os.environ if environ is None else environ
    raw = env.get("CDC_DAGSTER_BULK_WORKERS", "").strip()
    if not raw:
        return max(1, min(MAX_BULK_WORKERS, cores() // max(1, captures)))
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_BULK_WORKERS:
        raise ValueError(
            f"CDC_DAGSTER_BULK_WORKERS={raw!r}: expected an integer 1-{MAX_BULK_WORKERS} "
            "(worker processes for a capture's bulk tick phases; default: the cores over "
            "the captures)"
        )
    return n


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def share(captures: int) -> None:
    """How many captures' runs share this machine (a capture run says so as it begins):
    the default number of bulk workers of the pool started after it (``bulk_workers``)."""
    global _captures
    _captures = max(1, captures)


def _start_worker(nice: int) -> None:
    """Worker initializer: run at niceness ``nice`` (``_lower_priority``) with the phases'
    modules loaded (``_load_phases``): a worker is ready when its first phase comes."""
    _lower_priority(nice)
    # named, so that ``top`` tells it from its capture run (Linux)
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as f:
        f.write(WORKER_NAME)
    try:
        _load_phases()
    except ImportError as exc:  # named by the phase that needs the module
        log.warning("the background worker did not load the phases' modules: %s", exc)


def _lower_priority(nice: int) -> None:
    """Run at niceness ``nice`` (no change where not allowed), in a session of its own whose
    autogroup has that niceness (``own_autogroup``)."""
    try:
        now = os.getpriority(os.PRIO_PROCESS, 0)
        if now < nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        pass
    global AUTOGROUP_NICE
    session, AUTOGROUP_NICE = own_autogroup(nice)
    if session:
        _exit_with_parent()


def _exit_with_parent(poll_s: float = 1.0) -> None:
    """End this process within ``poll_s`` of its parent's end (a thread watching it): a pool
    worker holds its queue's pipe itself, so it outlives a parent that was killed, and in a
    session of its own no stop of the daemon's process group reaches it."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def own_autogroup(nice: int) -> tuple[bool, bool]:
    """Make this process a session of its own and give its autogroup niceness ``nice``;
    whether each was done. Under Linux's autogroup scheduling a process's niceness counts
    only against its own session's: the worker at 10 in the daemon's session still took a
    session's share of the CPU from every other one -- on 2 cores, 0.19 of a core beside a
    100-table snapshot's reads (Spark's session) and MariaDB's, which got that much less
    (throughput bench). In a session of its own at autogroup niceness 10 it gets about a
    tenth of what a busy session gets, and an idle CPU whole. Out of the daemon's process
    group, which a stop signals, the worker ends with its parent (``_exit_with_parent``).
    Where autogroups are off or the write is not allowed, the session is new and its
    niceness unchanged."""
    try:
        os.setsid()
    except OSError:  # already a session (or group) leader
        return False, False
    return True, set_autogroup_nice("self", nice)


def set_autogroup_nice(pid: int | str, nice: int) -> bool:
    """Give the autogroup (session) of process ``pid`` ("self": this one) niceness ``nice``,
    every process of it and those it starts later alike; whether it was done (not where
    autogroups are off, the process is another user's, or ``nice`` < 0 is not allowed)."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        return False
    return True


def _get_pool() -> ProcessPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None:
            _pool_size = bulk_workers(captures=_captures)
            _pool = ProcessPoolExecutor(
                max_workers=_pool_size,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(BULK_NICE,),
            )
        return _pool


def _load_phases() -> None:
    """In a worker: import what the phases run (Delta, the sinks, the mounting), and
    pandas: pyarrow imports it on a first conversion to numpy (the mounting's), which had
    cost a drain's first bulk phase 0.5-0.8 s of a loaded core (py-spy, throughput bench);
    then one scratch MERGE (``sinks.delta.warm_up``): a process's first MERGE costs
    ~0.3 CPU-s more than the next, and a drain's bulk phase was each worker's first."""
    import pandas  # noqa: F401

    import cdc_dagster.pipeline.spark_tasks  # noqa: F401
    from cdc_dagster.sinks import delta

    delta.warm_up()  # a first MERGE's set-up (~0.3 CPU-s), here rather than in a phase


def _ready() -> None:
    """A task that only makes the pool start a worker (each loads the phases as it starts)."""


def _warmed(done: Future[None]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning("the background worker did not start: %s (the first bulk phase "
                    "starts one)", done.exception())  # fmt: skip


def warm(workers: bool = True) -> None:
    """Start the workers (each loading the phases' modules as it starts) now, without
    waiting: a run's first bulk phase -- a backlog's rows after `changefeed resume`, a
    snapshot's released table -- otherwise paid the workers' start and imports (the imports
    alone ~0.45 s of an idle core here) before any of its work. A capture run that follows
    calls it as it begins, before it waits for its capture's earlier run. The pool starts a
    worker per task submitted while none is idle, so one task per worker starts them all.
    This process's own first MERGE set-up is paid too, in a thread (``warm_here``);
    ``workers`` false: only that."""
    global _warmed
    warm_here()
    if not workers:
        return
    try:
        pool = _get_pool()
        with _lock:
            if _warmed is pool:
                return  # (a run's loop asks again; its receive op may have asked already)
            _warmed = pool
        for _ in range(_pool_size):
            pool.submit(_ready).add_done_callback(_warmed)
    except (RuntimeError, ValueError) as exc:  # shutting down, or a bad worker count
        log.warning("the background workers were not started: %s", exc)


def warm_here() -> None:
    """``sinks.delta.warm_up`` in a thread of this process (once per process; returns at
    once): the in-process phases -- a capture run's small and mid-sized ones, a drain's
    below ``bulk_rows`` -- MERGE here, and a run's first MERGE was a drain's as often as not
    (a run ends every ``CDC_DAGSTER_CAPTURE_LOOP_S``). Never in the run workers' zygote
    (delta-rs refuses a runtime that crossed a fork): only capture runs call it."""
    from cdc_dagster.sinks import delta

    threading.Thread(target=delta.warm_up, name="delta-warm-up", daemon=True).start()


class IdleCores:
    """How many of the machine's CPUs were idle since the last look (``/proc/stat``'s
    ``cpu`` line: idle and iowait time over all time)."""

    MIN_LOOK_S = 0.5  # a look shorter than this says nothing yet

    def __init__(self, stat: str = "/proc/stat") -> None:
        self.stat = stat
        self.last = self._read()
        self.looked = time.monotonic()

    def _read(self) -> tuple[int, int] | None:
        """(idle + iowait, total) jiffies of all CPUs, or None where unknown."""
        try:
            with open(self.stat) as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        if len(fields) < 5:
            return None
        return fields[3] + fields[4], sum(fields[:8])

    def since_last(self) -> float | None:
        """Idle CPUs (0 to the CPU count) since the last look; None where unknown."""
        now, last = self._read(), self.last
        self.last, self.looked = now, time.monotonic()
        if now is None or last is None or now[1] <= last[1]:
            return None
        return (now[0] - last[0]) / (now[1] - last[1]) * (os.cpu_count() or 1)

    def fewer_than(self, cores: float) -> bool:
        """Whether fewer than ``cores`` CPUs were idle since the last look (never where
        ``cores`` <= 0 or it is not known); a look less than ``MIN_LOOK_S`` long: yes (not
        known yet: look again later)."""
        if cores <= 0:
            return False
        if time.monotonic() - self.looked < self.MIN_LOOK_S:
            return True
        idle = self.since_last()
        return idle is not None and idle < cores


def wait_for_idle_cpus(
    cores: float,
    max_wait_s: float,
    busy: Callable[[], bool] = lambda: False,
    look_s: float | None = None,
    steady_s: float | None = None,
) -> None:
    """Return once ``busy()`` is false and ``cores`` CPUs were idle at every look (``IdleCores``;
    every ``look_s``, default ``IDLE_LOOK_S``) over the last ``steady_s`` (default
    ``IDLE_STEADY_S``; at least one look), or ``max_wait_s`` from now. ``cores`` <= 0: once
    ``busy()`` is false, without looking."""
    deadline = time.monotonic() + max_wait_s
    look = IDLE_LOOK_S if look_s is None else look_s
    steady = IDLE_STEADY_S if steady_s is None else steady_s
    idle = IdleCores()
    in_a_row = 0  # looks in a row that found the CPUs idle
    while time.monotonic() < deadline:
        if busy():
            in_a_row = 0
        elif cores <= 0:
            return
        elif idle.fewer_than(cores):
            in_a_row = 0
        else:
            in_a_row += 1
            if in_a_row * look >= steady - 1e-9:
                return
        time.sleep(look)


def warm_when_idle(max_wait_s: float, idle_cores: float = 1.0, workers: bool = True) -> None:
    """``warm(workers)`` from a thread once ``idle_cores`` CPUs were idle for
    ``IDLE_STEADY_S``, at most ``max_wait_s`` from now; returns at once. A capture's next run
    starts its workers while it waits for the earlier run: at once, four workers' imports
    (two captures) took a backlog drain's CPU when it arrived with them (throughput bench)."""

    def wait_then_warm() -> None:
        wait_for_idle_cpus(idle_cores, max_wait_s)
        warm(workers)

    threading.Thread(target=wait_then_warm, name="warm-when-idle", daemon=True).start()


def _discard(pool: ProcessPoolExecutor) -> None:
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None
    pool.shutdown(wait=False, cancel_futures=True)


def run_in_background(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(item) for item in items]`` in the background workers (side by side, results in
    order). ``fn`` must be a module-level function and items and results picklable. A
    worker that died raises ``RuntimeError`` here (the next call starts new ones)."""
    if not items:
        return []
    pool = _get_pool()
    try:
        return list(pool.map(fn, items))
    except BrokenProcessPool as exc:
        _discard(pool)
        raise RuntimeError(
            f"the background worker running bulk tick phases died ({exc}); the phase is "
            "retried next tick in a new worker"
        ) from exc


def shutdown() -> None:
    """Stop the worker (tests; a run's process exit stops it too)."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)

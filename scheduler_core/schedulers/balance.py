"""Balance scheduler: even out the load across captures, soon after it became uneven."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

import numpy as np

from scheduler_core.captures import CaptureState
from scheduler_core.errors import ConfigError
from scheduler_core.schedule_tasks import MoveTableTask, Task
from scheduler_core.schedulers.base import ScheduleContext

TableCost = Callable[[np.ndarray], np.ndarray]
"""Vectorised cost of tables by id (the seam for load-aware balancing)."""


def unit_cost(table_ids: np.ndarray) -> np.ndarray:
    """Every table costs 1: balance by table count."""
    return np.ones(len(table_ids), dtype=np.float64)


def plan_moves(
    ctx: ScheduleContext, limit: int, rng: random.Random, cost: TableCost = unit_cost
) -> list[MoveTableTask]:
    """Moves from the most to the least loaded capture until the gap is at most one table.

    Loads count every table where it will be once the tasks in flight are done
    (``ReplicationManager.landing_loads``); only steady REPLICATING tables move. Which
    tables move is random (from ``rng``), so repeated balancing does not always pick the
    same ones. A capture's movable tables are listed only when it is a source; heaps keep
    the rest O(moves x log captures).
    """
    return _plan(ctx, limit, rng, cost)[0]


def _plan(
    ctx: ScheduleContext, limit: int, rng: random.Random, cost: TableCost
) -> tuple[list[MoveTableTask], bool]:
    # (moves, even): ``even`` is False when the load would still be uneven after the moves
    # (the limit was hit, or the loaded captures' tables are all in flight for now).
    targets = ctx.schedulable()
    if len(targets) < 2:
        return [], True
    shuffle = np.random.default_rng(rng.getrandbits(64))
    load = ctx.replications.landing_loads(targets, cost)
    pools: dict[str, list[tuple[int, float]]] = {}
    hi_heap = [(-load[c], c) for c in targets]
    lo_heap = [(load[c], c) for c in targets]
    heapq.heapify(hi_heap)
    heapq.heapify(lo_heap)
    moves: list[MoveTableTask] = []
    blocked = False  # a capture above the rest had nothing movable (all in flight)
    while len(moves) < limit:
        hi = _top(hi_heap, load, sign=-1.0)
        lo = _top(lo_heap, load, sign=1.0)
        if hi is None or lo is None or hi == lo:
            return moves, not blocked
        if hi not in pools:
            pools[hi] = _movable(ctx, hi, cost, shuffle)
        if not pools[hi]:
            blocked = blocked or load[hi] - load[lo] > 1
            heapq.heappop(hi_heap)  # nothing it holds can move now: the next source
            continue
        tid, c = pools[hi].pop()
        if load[hi] - load[lo] <= c:
            return moves, True  # moving it would not narrow the gap
        load[hi] -= c
        load[lo] += c
        heapq.heappush(hi_heap, (-load[hi], hi))
        heapq.heappush(lo_heap, (load[lo], lo))
        moves.append(MoveTableTask(tid, lo))
    return moves, False


def _movable(
    ctx: ScheduleContext, capture_id: str, cost: TableCost, shuffle: np.random.Generator
) -> list[tuple[int, float]]:
    # (id, cost) of the capture's steady tables, in random order (popped from the end).
    ids = ctx.replications.replicating_on(capture_id)
    perm = shuffle.permutation(len(ids))
    return list(zip(ids[perm].tolist(), cost(ids)[perm].tolist(), strict=True))


def _top(heap: list[tuple[float, str]], load: dict[str, float], sign: float) -> str | None:
    # Lazy deletion: skip entries whose load has changed since they were pushed.
    while heap and sign * heap[0][0] != load[heap[0][1]]:
        heapq.heappop(heap)
    return heap[0][1] if heap else None


class BalanceScheduler:
    """Evens the load across captures, without waiting for the whole changefeed to settle.

    A round is due ``interval_ms`` after the last one (by the owner's clock, ``ctx.now_ms``;
    a caller without a clock gets no periodic round), at once when the set of captures that
    take tables changed (scale-out must not wait out the interval), and on the tick after a
    round that moved tables (TiCDC's forceBalance: go on until the load is even). A due
    round waits, and stays due, while a capture drains or is stopping (as TiCDC's does) or
    while ``max_moves`` tasks run; it moves only steady REPLICATING tables, up to the free
    task slots, planned against where every table in flight will land. So tables being
    added, moved or stopped elsewhere (a DDL creating tables, a move under way) neither
    hold it back nor make it move a table twice for the same gap.
    """

    name = "balance"

    def __init__(
        self,
        *,
        rng: random.Random,
        interval_ms: int = 60_000,
        max_moves: int = 10,
        cost: TableCost = unit_cost,
    ) -> None:
        if interval_ms < 0 or max_moves < 1:
            raise ConfigError(
                f"balance needs interval_ms >= 0 and max_moves >= 1, got {interval_ms}, {max_moves}"
            )
        self.rng = rng
        self.interval_ms = interval_ms
        self.max_moves = max_moves
        self.cost = cost
        self._last_ms: int | None = None  # the clock at the last round
        self._members: tuple[str, ...] | None = None  # the captures of the last round
        self._again = False  # the last round moved tables: look again next tick

    def due(self, ctx: ScheduleContext) -> bool:
        """Whether a round is due (interval passed, captures changed, or the last one moved)."""
        if self._again or tuple(ctx.schedulable()) != self._members:
            return True
        now = ctx.now_ms
        return now is not None and (
            self._last_ms is None or now - self._last_ms >= self.interval_ms
        )

    def schedule(self, ctx: ScheduleContext) -> list[Task]:
        """Moves, or [] when no round is due or it must wait."""
        if not self.due(ctx):
            return []
        if ctx.draining is not None or any(
            st.state == CaptureState.STOPPING for st in ctx.captures.values()
        ):
            return []  # a drain first: its capture's tables are on their way elsewhere
        free = self.max_moves - len(ctx.replications.running_tasks)
        if free <= 0:
            return []
        self._members = tuple(ctx.schedulable())
        if ctx.now_ms is not None:
            self._last_ms = ctx.now_ms
        moves, even = _plan(ctx, free, self.rng, self.cost)
        # Not even yet (tables still on their way, or the free slots ran out): look again
        # next tick, not an interval later.
        self._again = bool(moves) or not even
        # Plain tasks, not a burst: the replication manager keeps them under its cap.
        return list(moves)

"""Balance scheduler: periodically even out the load across captures."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

import numpy as np

from scheduler_core.schedule_tasks import BurstTask, MoveTableTask, Task
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

    Which tables move is random (from ``rng``), so repeated balancing does not always
    pick the same ones. Heaps keep it O(moves x log captures).
    """
    targets = ctx.schedulable()
    if len(targets) < 2:
        return []
    shuffle = np.random.default_rng(rng.getrandbits(64))
    pools: dict[str, list[tuple[int, float]]] = {}
    load: dict[str, float] = {}
    for c in targets:
        ids = ctx.replications.replicating_on(c)
        costs = cost(ids)
        perm = shuffle.permutation(len(ids))
        pools[c] = list(zip(ids[perm].tolist(), costs[perm].tolist(), strict=True))
        load[c] = float(costs.sum())
    hi_heap = [(-load[c], c) for c in targets]
    lo_heap = [(load[c], c) for c in targets]
    heapq.heapify(hi_heap)
    heapq.heapify(lo_heap)
    moves: list[MoveTableTask] = []
    while len(moves) < limit:
        hi = _top(hi_heap, load, sign=-1.0)
        lo = _top(lo_heap, load, sign=1.0)
        if hi == lo or not pools[hi]:
            break
        tid, c = pools[hi].pop()
        if load[hi] - load[lo] <= c:
            break  # moving it would not narrow the gap
        load[hi] -= c
        load[lo] += c
        heapq.heappush(hi_heap, (-load[hi], hi))
        heapq.heappush(lo_heap, (load[lo], lo))
        moves.append(MoveTableTask(tid, lo))
    return moves


def _top(heap: list[tuple[float, str]], load: dict[str, float], sign: float) -> str:
    # Lazy deletion: skip entries whose load has changed since they were pushed.
    while sign * heap[0][0] != load[heap[0][1]]:
        heapq.heappop(heap)
    return heap[0][1]


class BalanceScheduler:
    """Every ``interval_ticks`` ticks, when all tables replicate and nothing runs, rebalance."""

    name = "balance"

    def __init__(
        self,
        *,
        rng: random.Random,
        interval_ticks: int = 60,
        max_moves: int = 10,
        cost: TableCost = unit_cost,
    ) -> None:
        self.rng = rng
        self.interval_ticks = interval_ticks
        self.max_moves = max_moves
        self.cost = cost
        self._ticks = 0

    def schedule(self, ctx: ScheduleContext) -> list[Task]:
        """Moves, or [] when it is not yet time or the cluster is busy."""
        self._ticks += 1
        if self._ticks < self.interval_ticks:
            return []
        rm = ctx.replications
        if rm.running_tasks or not rm.all_replicating():
            return []
        self._ticks = 0
        moves = plan_moves(ctx, self.max_moves, self.rng, self.cost)
        # A burst, like TiCDC's balance: its size is already bounded by max_moves.
        return [BurstTask(tuple(moves))] if moves else []

"""Rebalance scheduler: a manual, one-shot rebalance requested by an admin."""

from __future__ import annotations

import random

from scheduler_core.schedule_tasks import BurstTask, Task
from scheduler_core.schedulers.balance import TableCost, plan_moves, unit_cost
from scheduler_core.schedulers.base import ScheduleContext


class RebalanceScheduler:
    """When requested, and only once every table replicates, plan a full rebalance."""

    name = "rebalance"

    def __init__(self, *, rng: random.Random, cost: TableCost = unit_cost) -> None:
        self.rng = rng
        self.cost = cost
        self.requested = False

    def request(self) -> None:
        """Ask for a rebalance at the next tick where every table replicates."""
        self.requested = True

    def schedule(self, ctx: ScheduleContext) -> list[Task]:
        """All moves needed to even the load, or [] while tables are still moving."""
        if not self.requested or not ctx.replications.all_replicating():
            return []
        self.requested = False
        moves = plan_moves(ctx, len(ctx.replications), self.rng, self.cost)
        # A burst, like TiCDC's rebalance: an admin asked for all of it at once.
        return [BurstTask(tuple(moves))] if moves else []

"""Scheduling policies, highest priority first: basic > drain > move > rebalance > balance."""

from scheduler_core.schedulers.balance import BalanceScheduler, TableCost, unit_cost
from scheduler_core.schedulers.base import ScheduleContext, Scheduler
from scheduler_core.schedulers.basic import BasicScheduler
from scheduler_core.schedulers.drain import DrainCaptureScheduler
from scheduler_core.schedulers.move import MoveTableScheduler
from scheduler_core.schedulers.rebalance import RebalanceScheduler

__all__ = [
    "BalanceScheduler",
    "BasicScheduler",
    "DrainCaptureScheduler",
    "MoveTableScheduler",
    "RebalanceScheduler",
    "ScheduleContext",
    "Scheduler",
    "TableCost",
    "unit_cost",
]

"""Move-table scheduler: manual moves requested by an admin."""

from __future__ import annotations

import logging
from collections import deque

from scheduler_core.errors import ConfigError
from scheduler_core.model import ReplicationSetState
from scheduler_core.schedule_tasks import MoveTableTask, Task
from scheduler_core.schedulers.base import ScheduleContext

log = logging.getLogger(__name__)


class MoveTableScheduler:
    """Queues manual moves; each is validated when requested and again when applied."""

    name = "move-table"

    def __init__(self) -> None:
        self._pending: deque[MoveTableTask] = deque()

    def request(self, table_id: int, dest_capture_id: str) -> None:
        """Queue a move of ``table_id`` to ``dest_capture_id``."""
        self._pending.append(MoveTableTask(table_id, dest_capture_id))

    @property
    def pending(self) -> tuple[MoveTableTask, ...]:
        """Moves not yet handed to the replication manager."""
        return tuple(self._pending)

    def schedule(self, ctx: ScheduleContext) -> list[Task]:
        """Hand over the queued moves that are still valid."""
        tasks: list[Task] = []
        while self._pending:
            task = self._pending.popleft()
            try:
                self._validate(task, ctx)
            except ConfigError as err:
                log.warning("move dropped: %s", err)
                continue
            tasks.append(task)
        return tasks

    @staticmethod
    def _validate(task: MoveTableTask, ctx: ScheduleContext) -> None:
        st = ctx.captures.get(task.dest_capture_id)
        if st is None or not st.schedulable:
            raise ConfigError(
                f"destination {task.dest_capture_id!r} of table {task.table_id} "
                "is not an alive capture that accepts tables"
            )
        if task.table_id not in ctx.replications:
            raise ConfigError(f"table {task.table_id} is not in the changefeed")
        view = ctx.replications.view(task.table_id)
        if view.state != ReplicationSetState.REPLICATING:
            raise ConfigError(f"table {task.table_id} is {view.state.name}, not REPLICATING")

"""The scheduler's error hierarchy: each message says what, which value, and what to do."""

from __future__ import annotations


class SchedulerError(Exception):
    """Base of every error raised by scheduler_core."""


class InvalidMessageError(SchedulerError, ValueError):
    """A message or record was built with a value outside its domain."""


class MultiplePrimaryError(SchedulerError):
    """Two captures report the same table as Replicating: the downstream may be double-written."""

    def __init__(self, table_id: int, captures: list[str]) -> None:
        self.table_id = table_id
        self.captures = sorted(captures)
        super().__init__(
            f"table {table_id} is replicating on several captures {self.captures}; "
            "stop all but one of them by hand (the sink fencing token refuses the stale one)"
        )


class ProtocolError(SchedulerError):
    """A peer sent something the protocol does not allow in the current state."""


class ExecutorContractError(SchedulerError, AssertionError):
    """The data plane broke the TableExecutor contract (e.g. sinking before data is readable)."""


class TableFailedError(SchedulerError):
    """One table's replication set failed; the changefeed is in error until an operator acts.

    Carries the table and the original error's message; the other tables keep their state.
    """

    def __init__(self, table_id: int, cause: SchedulerError) -> None:
        self.table_id = table_id
        self.cause = cause
        super().__init__(
            f"table {table_id}: {type(cause).__name__}: {cause}; the changefeed stops "
            "scheduling and its checkpoint stays below this table until it is resumed"
        )


class ConfigError(SchedulerError, ValueError):
    """Bad scheduler configuration or an admin request that cannot be carried out."""

"""The scheduling protocol of cdc-dagster, sans-I/O: events in, messages out."""

from scheduler_core.agent import Agent
from scheduler_core.coordinator import Coordinator, CoordinatorConfig, TickResult
from scheduler_core.ddl import DDLEvent, DDLKind, DDLManager, TableSetChange
from scheduler_core.errors import (
    ConfigError,
    ExecutorContractError,
    InvalidMessageError,
    MultiplePrimaryError,
    ProtocolError,
    SchedulerError,
    TableFailedError,
)
from scheduler_core.executor import TableExecutor
from scheduler_core.messages import AddTableRequest, RemoveTableRequest
from scheduler_core.model import Checkpoint, ReplicationSetState, Role, TableState, TableStatus
from scheduler_core.replication import ReplicationSet

__all__ = [
    "AddTableRequest",
    "Agent",
    "Checkpoint",
    "ConfigError",
    "Coordinator",
    "CoordinatorConfig",
    "DDLEvent",
    "DDLKind",
    "DDLManager",
    "ExecutorContractError",
    "InvalidMessageError",
    "MultiplePrimaryError",
    "ProtocolError",
    "RemoveTableRequest",
    "ReplicationSet",
    "ReplicationSetState",
    "Role",
    "SchedulerError",
    "TableExecutor",
    "TableFailedError",
    "TableSetChange",
    "TableState",
    "TableStatus",
    "TickResult",
]

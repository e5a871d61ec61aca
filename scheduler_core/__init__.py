"""The scheduling protocol of cdc-dagster, sans-I/O: events in, messages out."""

from scheduler_core.errors import (
    ConfigError,
    ExecutorContractError,
    InvalidMessageError,
    MultiplePrimaryError,
    ProtocolError,
    SchedulerError,
)
from scheduler_core.messages import AddTableRequest, RemoveTableRequest
from scheduler_core.model import Checkpoint, ReplicationSetState, Role, TableState, TableStatus
from scheduler_core.replication import ReplicationSet

__all__ = [
    "AddTableRequest",
    "Checkpoint",
    "ConfigError",
    "ExecutorContractError",
    "InvalidMessageError",
    "MultiplePrimaryError",
    "ProtocolError",
    "RemoveTableRequest",
    "ReplicationSet",
    "ReplicationSetState",
    "Role",
    "SchedulerError",
    "TableState",
    "TableStatus",
]

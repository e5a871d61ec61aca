"""What the runtime hands an executor factory, what it expects back, and small file helpers."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from scheduler_core.executor import TableExecutor
from scheduler_core.messages import Barrier


@dataclass(frozen=True, slots=True)
class ExecutorSpec:
    """Everything an executor of one (changefeed, capture) needs to build itself."""

    capture_id: str
    changefeed_id: str
    # <staging_root>/<changefeed>/<capture>/reg-<registration>: the registration's own area,
    # where the manifest lives (a late run of an expired registration has another)
    staging_dir: Path
    staging_root: Path  # the staging of every capture (SparkTableExecutor takes this one)
    upstream_uri: str  # changelog:///abs/path
    sink_uri: str
    start_ts: int  # the changefeed's start ts (a fake downstream's initial committed ts)
    sync_point_interval_ms: int | None = None  # sinks split their batches at syncpoint TSs
    registration: str = ""  # the capture registration (lease epoch) the executor works under


@runtime_checkable
class RuntimeExecutor(TableExecutor, Protocol):
    """A TableExecutor whose tick is two phases and whose state is its own manifest.

    The factory returns it loaded from its manifest (empty if none) and reconciled with
    the sink (a crash between a sink write and the save).
    """

    barrier: Barrier  # what the owner last said the sinks may not pass

    def pull_phase(self) -> object:
        """Phase 1: pull, sort and mount into staging up to each table's resolved ts."""
        ...

    def sink_phase(self) -> object:
        """Phase 2: sink staged changes up to min(resolved, barrier); stop removed tables."""
        ...

    def save(self) -> None:
        """Persist the manifest (after the staged files it names)."""
        ...

    def errors(self) -> Mapping[int, str]:
        """Tables in an error state, with their messages."""
        ...

    def rows_applied(self) -> Mapping[int, int]:
        """Per held table, the rows the sink wrote for it since this capture took it."""
        ...


ExecutorFactory = Callable[[ExecutorSpec], RuntimeExecutor]


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write JSON under a temporary name, fsync, rename into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    with open(tmp, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def capture_epoch(registration: str, owner_rev: int) -> str:
    """A capture's epoch under an owner: its registration (lease) and the adopted owner_rev.

    The Agent rotates its epoch on every new owner; deriving it from what the owner can
    read (the registry and the capture's task key) lets the owner address dispatches
    without a second channel, while an old owner's dispatches still never match.
    """
    return f"{registration}.{owner_rev}"

"""A puller run as the parts it drives see it: its config, its stats, and the protocol the
snapshot and join modules use (so they need not import the puller, which imports them)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from cdc_dagster.mysql.catalog import TableFilter
from cdc_dagster.mysql.state import PullerState, TsAllocator
from cdc_dagster.mysql.upstream import ServerInfo, UpstreamConfig
from cdc_dagster.upstream.changelog import ChangeLogWriter


@dataclass(frozen=True, slots=True)
class PullerConfig:
    """What one puller reads and where it writes."""

    upstream_uri: str
    changelog_root: str
    filters: tuple[str, ...] = ()
    snapshot: bool = True
    flush_rows: int = 50_000
    flush_interval_s: float = 1.0
    heartbeat_s: float = 1.0
    snapshot_chunk_rows: int = 10_000
    progress: Callable[[str, int, int], None] | None = None  # (table, rows done, rows total)


@dataclass(slots=True)
class PullerStats:
    """What a puller run did (a Dagster run reports it)."""

    rows: int = 0
    transactions: int = 0
    ddls: int = 0
    snapshot_rows: int = 0
    flushes: int = 0
    resolved_ts: int = 0
    position: str = ""
    start_ts: int = 0  # after an initial snapshot: the changefeed's start ts (below its rows)
    started: float = field(default_factory=time.monotonic)

    @property
    def rows_per_s(self) -> float:
        """Rows pulled per second of this run (for the run's metadata)."""
        return self.rows / max(time.monotonic() - self.started, 1e-9)


class PullerContext(Protocol):
    """What the initial snapshot and a join read and change of the puller running them."""

    config: PullerConfig
    upstream: UpstreamConfig
    filter: TableFilter
    root: str
    writer: ChangeLogWriter
    stats: PullerStats
    state: PullerState
    alloc: TsAllocator
    info: ServerInfo

    def forget_table_plans(self, table_id: int) -> None:
        """Drop what was cached about a table's row layout (its schema changed)."""


__all__ = ["PullerConfig", "PullerContext", "PullerStats"]

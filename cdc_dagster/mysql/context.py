"""A puller run as the parts it drives see it: its config, its stats, and the protocol the
snapshot and join modules use (so they need not import the puller, which imports them)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from cdc_dagster.mysql.catalog import TableFilter
from cdc_dagster.mysql.state import PullerState, TsAllocator
from cdc_dagster.mysql.upstream import ServerInfo
from cdc_dagster.upstream.changelog import ChangeLogWriter
from cdc_dagster.upstream.uri import UpstreamConfig


@dataclass(frozen=True, slots=True)
class ResnapshotOutcome:
    """What the puller did with a re-snapshot request (``cdc-dagster table resnapshot``)."""

    name: str  # ``database.table`` as requested
    started: bool  # False: refused (``note`` says why)
    note: str  # one line for the run's log
    table_id: int | None = None
    generation: int = 0  # the snapshot's generation (its truncate record's commit ts)


class ResnapshotRequests(Protocol):
    """Where a puller run finds re-snapshot requests (the Dagster run: etcd)."""

    def pending(self) -> list[str]:
        """``database.table`` of each request not taken yet."""

    def taken(self, outcome: ResnapshotOutcome) -> None:
        """The puller took the request (its state is saved): forget it, report the outcome."""


@dataclass(frozen=True, slots=True)
class PullerConfig:
    """What one puller reads and where it writes."""

    upstream_uri: str
    changelog_root: str
    filters: tuple[str, ...] = ()
    snapshot: bool = True
    flush_bytes: int = 32 << 20  # row events buffered before a flush (also every interval)
    flush_interval_s: float = 1.0
    heartbeat_s: float = 1.0
    snapshot_chunk_rows: int = 10_000
    # a new change log on MariaDB: tables snapshotted in chunks by readers elsewhere
    # (``mysql.snapshots``) instead of all their rows at once by the puller's first start
    chunked_snapshot: bool = False
    progress: Callable[[str, int, int], None] | None = None  # (table, rows done, rows total)
    # re-snapshot requests, looked at once a second between transactions (None: none)
    requests: ResnapshotRequests | None = None
    requests_every_s: float = 1.0


@dataclass(slots=True)
class PullerStats:
    """What a puller run did (a Dagster run reports it)."""

    row_events: int = 0  # binlog row events written (each holds one or more row changes)
    transactions: int = 0
    ddls: int = 0
    snapshot_rows: int = 0
    flushes: int = 0
    resolved_ts: int = 0
    position: str = ""
    start_ts: int = 0  # after an initial snapshot: the changefeed's start ts (below its rows)
    started: float = field(default_factory=time.monotonic)

    @property
    def row_events_per_s(self) -> float:
        """Row events pulled per second of this run (for the run's metadata)."""
        return self.row_events / max(time.monotonic() - self.started, 1e-9)


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

    def need_join(self, name: tuple[str, str]) -> None:
        """A table came into the filter under ``name`` (a RENAME): it joins at a snapshot."""

    def skip_table(self, name: tuple[str, str]) -> None:
        """A table the filter selects has no key: not replicated, listed as skipped."""


__all__ = [
    "PullerConfig",
    "PullerContext",
    "PullerStats",
    "ResnapshotOutcome",
    "ResnapshotRequests",
]

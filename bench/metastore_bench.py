"""Metastore benchmark: etcd round trips and bytes per owner tick, 100k tables.

Grid: captures in {8, 100} x table checkpoints in {shared marks, all distinct}, 100k
tables in one changefeed spread evenly over the captures. Target: under 1 MB read per
owner tick at 100k tables.

Usage::

    python bench/metastore_bench.py                      # a private etcd in a temp dir
    python bench/metastore_bench.py --etcd 127.0.0.1:2379 --ticks 20

Definitions
-----------
* Owner tick: :meth:`Metastore.read_owner_snapshot` (one transaction of range reads:
  captures, changefeeds, every capture's task status, DDL states, GC safepoint) then
  :meth:`Metastore.commit_owner_tick` (one owner-guarded transaction writing the
  changefeed status and the GC safepoint). Measured on the owner's own client; its lease
  keep-alive (one round trip per TTL/3, not per tick) is excluded by a 60 s TTL.
* Bytes: protobuf request and response sizes of every RPC (the payload on the wire,
  without gRPC/HTTP2 framing).
* Capture write: one capture's task status put (capture-guarded), per capture per tick.
* Checkpoints: "shared marks" draws each table's checkpoint and resolved ts from 100
  recent resolved-ts values (tables advance to the marks the upstream resolves; many
  share one); "all distinct" gives every table its own random TS within 5 s (worst case).
* ms/tick: wall time of the owner's read + decode + write, median over the ticks.
* naive: the same statuses as one JSON key per table (~100 bytes each with its key).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from cdc_dagster.metastore import ChangefeedProgress, Metastore, TaskStatus, connect
from cdc_dagster.testing.etcd import EmbeddedEtcd
from scheduler_core.messages import Liveness, TableStatusBatch
from scheduler_core.model import TableState
from scheduler_core.ts import compose

TABLES = 100_000
NAIVE_BYTES_PER_TABLE = 100


@dataclass(frozen=True, slots=True)
class Row:
    """One grid cell's result."""

    captures: int
    marks: str
    round_trips: float
    bytes_read: float
    bytes_written: float
    capture_write_bytes: float
    ms_per_tick: float


def _statuses(captures: int, distinct: bool, now_ts: int, seed: int) -> list[TableStatusBatch]:
    rng = np.random.default_rng(seed)
    if distinct:
        ckpt = now_ts + rng.integers(0, 5_000 << 18, TABLES)
        res = ckpt + rng.integers(0, 2_000 << 18, TABLES)
    else:
        marks = (
            now_ts
            + np.sort(rng.integers(0, 5_000, 100)) * (1 << 18)
            + rng.integers(0, 1 << 18, 100)
        )
        ckpt = rng.choice(marks, TABLES)
        res = np.maximum(ckpt, rng.choice(marks, TABLES))
    table_ids = np.arange(TABLES, dtype=np.int64)
    owner_of = table_ids % captures
    state = np.full(TABLES, int(TableState.REPLICATING))
    return [
        TableStatusBatch(table_ids[m], state[m], ckpt[m], res[m])
        for m in (owner_of == c for c in range(captures))
    ]


def run_cell(endpoints: list[str], captures: int, distinct: bool, ticks: int) -> Row:
    """Set up one cluster, run ``ticks`` owner ticks, return the per-tick averages."""
    cluster = f"bench{captures}{'d' if distinct else 's'}{time.time_ns() % 10**9}"
    with (
        connect(endpoints, cluster_id=cluster) as owner_ms,
        connect(endpoints, cluster_id=cluster) as cap_ms,
    ):
        start = compose(int(time.time() * 1000) - 60_000)
        owner_ms.changefeeds.create("bench", "delta:///tmp/metastore-bench-unused", start_ts=start)
        sessions = [
            cap_ms.captures.register(f"cap-{c}", 60, keepalive=False) for c in range(captures)
        ]
        owner = owner_ms.election.try_campaign("owner", 60)
        assert owner is not None, "a fresh cluster has no owner"
        try:
            write_bytes = _write_task_statuses(cap_ms, sessions, captures, distinct, start)
            return _owner_ticks(owner_ms, owner, captures, distinct, ticks, start, write_bytes)
        finally:
            owner.resign()
            for s in sessions:
                s.deregister()
            owner_ms.client.delete(owner_ms.layout.prefix, prefix=True)


def _write_task_statuses(
    ms: Metastore, sessions, captures: int, distinct: bool, start: int
) -> float:
    before = ms.client.stats
    for session, batch in zip(
        sessions, _statuses(captures, distinct, start, seed=captures), strict=True
    ):
        ms.task_statuses.put(session, "bench", TaskStatus(1, 1, Liveness.ALIVE, batch))
    used = ms.client.stats - before
    return used.bytes_sent / captures


def _owner_ticks(
    ms: Metastore, owner, captures: int, distinct: bool, ticks: int, start: int, write_bytes: float
) -> Row:
    spent = []
    times = []
    for tick in range(ticks):
        before, t0 = ms.client.stats, time.perf_counter()
        snapshot = ms.read_owner_snapshot()
        progress = {"bench": ChangefeedProgress(start + tick + 1, start + tick + 1)}
        ms.commit_owner_tick(owner, snapshot, progress)
        times.append((time.perf_counter() - t0) * 1000)
        spent.append(ms.client.stats - before)
        assert sum(len(t.tables) for t in snapshot.tasks["bench"].values()) == TABLES
    return Row(
        captures,
        "all distinct" if distinct else "shared marks",
        statistics.mean(s.round_trips for s in spent),
        statistics.mean(s.bytes_received for s in spent),
        statistics.mean(s.bytes_sent for s in spent),
        write_bytes,
        statistics.median(times),
    )


def _print(rows: list[Row]) -> None:
    print(f"owner tick at {TABLES:,} tables (one changefeed); bytes = protobuf payload")
    print()
    print(
        "| captures | checkpoints  | round trips/tick | read/tick | written/tick | capture write | ms/tick | naive/ours |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = TABLES * NAIVE_BYTES_PER_TABLE / r.bytes_read
        print(
            f"| {r.captures} | {r.marks} | {r.round_trips:.0f} | {r.bytes_read / 1024:,.0f} KiB "
            f"| {r.bytes_written / 1024:,.1f} KiB | {r.capture_write_bytes / 1024:,.1f} KiB "
            f"| {r.ms_per_tick:.0f} | {ratio:.0f}x |"
        )
    worst = max(r.bytes_read for r in rows)
    print()
    print(f"max_read_per_tick_bytes={worst:.0f} target_bytes={1 << 20} ok={worst < (1 << 20)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--etcd", help="host:port,... of an etcd to use (default: a private one)")
    parser.add_argument("--ticks", type=int, default=10)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = None if args.etcd else EmbeddedEtcd(tmp).start()
        endpoints = args.etcd.split(",") if args.etcd else server.endpoints
        try:
            rows = [
                run_cell(endpoints, captures, distinct, args.ticks)
                for captures in (8, 100)
                for distinct in (False, True)
            ]
        finally:
            if server is not None:
                server.stop()
    _print(rows)
    return 0 if max(r.bytes_read for r in rows) < (1 << 20) else 1


if __name__ == "__main__":
    sys.exit(main())

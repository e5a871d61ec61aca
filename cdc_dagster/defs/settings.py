"""Where the control plane's parts are, read from ``CDC_DAGSTER_*`` variables when asked.

Nothing reads the environment at import time: resources call :meth:`Settings.from_env` at
run time, the sensor at tick time, the definitions loader when the code location loads.
"""

from __future__ import annotations

import functools
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cdc_dagster.pipeline import background

ENV_PREFIX = "CDC_DAGSTER_"
DEFAULT_MAX_TABLE_ASSETS = 2000
DEFAULT_LAG_BOUND_S = 120.0
# Tables the owner starts adding per tick. TiCDC's 50 is for an owner ticking many times a
# second; the sensor ticks every 5 s at best, where 50 took 2,000 ticks (2.8 h) to start
# 100k tables. 1,000 a tick is ~50 KB of run config spread over the captures, and a few
# hundred tasks in a capture's agent-state key (etcd takes 1.5 MiB) even if one capture
# takes a whole burst and a few bursts wait for its run (bench/sensor_tick_bench.py).
DEFAULT_ADD_TABLE_BATCH = 1000
DEFAULT_CAPTURE_LOOP_S = 300.0
# A capture tick's phase that reads less change-log (or staged) data than this runs in the
# run's process, not as a Spark job (~1 s each over Spark Connect): at OLTP rates most
# ticks carry a second or two of changes, a few hundred KB (bench/oltp_bench.py).
DEFAULT_LOCAL_TICK_BYTES = 16 << 20
# ... and that moves at most this many row changes (0: any number). Snapshot rows compress to
# ~12 bytes, so a slice of a million of them is "small" by bytes and runs as one task in
# the capture's process. Off by default: on 2 cores a limit of 250,000 sent a snapshot's
# released tables to Spark while its reads held both task slots, and a 100 x 100k snapshot
# was placed 14 s later and readable 43 s later (bench/throughput_bench.py, one run each).
# With cores to spare for Spark, a limit runs large phases as parallel tasks.
DEFAULT_LOCAL_TICK_ROWS = 0
# An in-process tick phase moving at least this many row changes (a snapshot's table
# released, its slices; a stream's second is a few thousand) runs in a worker process at
# niceness 10, like the snapshot's reads: the stream's ticks beside it come first
# (cdc_dagster/pipeline/background.py). 0: every phase at the capture's own priority.
DEFAULT_BULK_TICK_ROWS = 50_000
# While a changefeed's snapshot is being read (a chunk written in the last 3 s), the bulk
# pulls of its change log (a released table's rows, bulk_tick_rows or more) wait, for at most
# this many seconds from the first wait: the reads come first (pipeline/executor.py
# ``_reads_first``). On 2 cores a 100 x 100k snapshot read in 17.5-17.7 s instead of 21-23 s
# and was readable about as soon (68-72 s against 68 s; a run each): what its released tables'
# sinking took is then the reads'. A long snapshot's early tables are sunk as they come after
# it. 0: never.
DEFAULT_SNAPSHOT_FIRST_S = 120.0
# While a snapshot of a changefeed a capture run serves is being read (a chunk written in the
# last 3 s), each tick of each changefeed of the run (on new data or on the owner's messages)
# starts this long after that changefeed's last tick ended: a Delta MERGE rewrites every file its keys touch (0.4 CPU-s for a 250k-row
# sysbench table here, 100 rows or 1), so a stream of a few changes a second keeps a capture
# rewriting its tables back to back; resting between ticks leaves the snapshot's reads the
# CPU that took, and the stream's lag rises by about this much while the reads last
# (defs/capture/job.py ``_Follow.not_before``): with 2 s the captures of a 50 txn/s stream
# took 0.7 core instead of 1.45, and a 100 x 100k snapshot read in 27-30 s instead of 32-36
# (bench/throughput_bench.py, two runs against four). 0: no rest.
DEFAULT_SNAPSHOT_YIELD_S = 2.0
# While a table's changes are a backlog older than this, it commits at most this often: a
# Delta MERGE costs about the same for 1k rows as for 100k (it rewrites the files the keys
# touch), so a drain commits few large batches (bench/throughput_bench.py). 0: every tick.
DEFAULT_BATCH_BEHIND_S = 10.0
# Row changes a changefeed's capture tick moves per phase (pull, sink): a capture ticks its
# changefeeds one after another, so a table with millions of rows resolved at once (a
# snapshot) would hold every other table and changefeed of the capture for its whole MERGE;
# it moves in slices of this many instead (~2-4 s of a Spark core each here; a table with a
# large batch counts as at least 200k: pipeline.executor.TABLE_COST_ROWS). 0: no limit.
DEFAULT_TICK_ROWS = 1_000_000
# The share of a changefeed's time on a capture its sink writes may take: after a sink
# phase whose writes took d s, its tables wait d (1 - duty) / duty s (at most 5 s), unless a
# DDL or syncpoint waits for one (pipeline/executor.py, PACE_ROWS). A Delta MERGE rewrites
# every file its keys touch (0.6-1.7 s for a 250k-row sysbench table here, 50 rows or 500),
# so a steady trickle keeps each capture rewriting its tables back to back (~0.5 core of
# delta-rs threads per capture at 50 transactions/s). 0.5 halves that, but costs ~1 s of
# lag when quiet and more under CPU contention (d grows with it): measured worse for the
# stream's lag beside a snapshot (docs/latency.md), so off by default. 0 or 1: no pacing.
DEFAULT_SINK_DUTY = 0.0


def process_owner_id() -> str:
    """This process's owner identity: host, pid and a random part, so two Dagster instances
    (or a restarted code server) never campaign as the same owner; stable for the process."""
    return _owner_id_of(os.getpid())


@functools.cache
def _owner_id_of(pid: int) -> str:
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())
    return f"dagster-{host[:80] or 'host'}-{pid}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class Settings:
    """One deployment's settings (the CLI's ``server start`` / ``demo`` export them)."""

    state_dir: Path = Path(".state")
    etcd: tuple[str, ...] = ()  # empty: the private etcd of state_dir
    cluster_id: str = "default"
    changelog: Path | None = None  # the embedded upstream's change log
    spark_remote: str = ""  # sc://host:port; empty: an in-process local session
    owner_id: str = field(default_factory=process_owner_id)
    max_table_assets: int = DEFAULT_MAX_TABLE_ASSETS
    lag_bound_s: float = DEFAULT_LAG_BOUND_S
    capture_ttl_s: int = 60  # spans several sensor ticks plus a run's launch (~5 s each)
    # A capture run goes on ticking from its mailbox this long after its first tick
    # (cdc_dagster/defs/capture/job.py); 0: one tick per run.
    capture_loop_s: float = DEFAULT_CAPTURE_LOOP_S
    # The owner's lease: ticks renew it (every 5-8 s); a dead owner's lapses this long after
    # its last tick, and only then can a new one (a restarted code server) take over.
    owner_ttl_s: int = 30
    add_table_batch: int = DEFAULT_ADD_TABLE_BATCH  # tables the owner starts adding per tick
    local_tick_bytes: int = DEFAULT_LOCAL_TICK_BYTES  # smaller tick phases skip Spark
    local_tick_rows: int = DEFAULT_LOCAL_TICK_ROWS  # ... when they move fewer rows too
    bulk_tick_rows: int = DEFAULT_BULK_TICK_ROWS  # in-process phases this large run niced
    snapshot_first_s: float = DEFAULT_SNAPSHOT_FIRST_S  # bulk pulls wait for snapshot reads
    snapshot_yield_s: float = DEFAULT_SNAPSHOT_YIELD_S  # ticks rest this long meanwhile
    batch_behind_s: float = DEFAULT_BATCH_BEHIND_S  # a backlog commits at most this often
    tick_rows: int = DEFAULT_TICK_ROWS  # row changes per changefeed and tick phase
    sink_duty: float = DEFAULT_SINK_DUTY  # the share of a changefeed's time its writes take
    # How long one owner sensor evaluation goes on ticking the owner on changes in etcd
    # (cdc_dagster/defs/owner/wait.py). 0 here, so tests that evaluate the sensor directly
    # are not slowed; ``server start`` / ``demo`` set OWNER_WAIT_S (services/stack.py).
    owner_wait_s: float = 0.0

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``CDC_DAGSTER_*`` variables (defaults for the rest)."""
        env = os.environ if environ is None else environ

        def get(name: str, default: str = "") -> str:
            return env.get(ENV_PREFIX + name, default).strip()

        changelog = get("CHANGELOG")
        base = Settings()
        # read by the capture runs' bulk workers themselves: a bad value is named here first
        background.bulk_workers(env)
        return Settings(
            state_dir=Path(get("STATE_DIR", ".state")).resolve(),
            etcd=tuple(e for e in get("ETCD").split(",") if e),
            cluster_id=get("CLUSTER_ID", "default"),
            changelog=Path(changelog) if changelog else None,
            spark_remote=get("SPARK_REMOTE"),
            owner_id=get("OWNER_ID") or base.owner_id,
            max_table_assets=int(get("MAX_TABLE_ASSETS", str(DEFAULT_MAX_TABLE_ASSETS))),
            lag_bound_s=float(get("LAG_BOUND_S", str(DEFAULT_LAG_BOUND_S))),
            capture_ttl_s=int(get("CAPTURE_TTL_S", "60")),
            capture_loop_s=float(get("CAPTURE_LOOP_S", str(DEFAULT_CAPTURE_LOOP_S))),
            owner_ttl_s=int(get("OWNER_TTL_S", "30")),
            add_table_batch=int(get("ADD_TABLE_BATCH", str(DEFAULT_ADD_TABLE_BATCH))),
            local_tick_bytes=int(get("LOCAL_TICK_BYTES", str(DEFAULT_LOCAL_TICK_BYTES))),
            local_tick_rows=int(get("LOCAL_TICK_ROWS", str(DEFAULT_LOCAL_TICK_ROWS))),
            bulk_tick_rows=int(get("BULK_TICK_ROWS", str(DEFAULT_BULK_TICK_ROWS))),
            snapshot_first_s=float(get("SNAPSHOT_FIRST_S", str(DEFAULT_SNAPSHOT_FIRST_S))),
            snapshot_yield_s=float(get("SNAPSHOT_YIELD_S", str(DEFAULT_SNAPSHOT_YIELD_S))),
            batch_behind_s=float(get("BATCH_BEHIND_S", str(DEFAULT_BATCH_BEHIND_S))),
            tick_rows=int(get("TICK_ROWS", str(DEFAULT_TICK_ROWS))),
            sink_duty=float(get("SINK_DUTY", str(DEFAULT_SINK_DUTY))),
            owner_wait_s=float(get("OWNER_WAIT_S", "0")),
        )

    def staging_dir(self) -> Path:
        """Where captures stage changes between prepare and commit."""
        return self.state_dir / "staging"

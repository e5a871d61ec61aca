"""``DAGSTER_HOME`` under the state dir: the ``dagster.yaml`` the control plane needs.

- queued run coordinator, at most two in-progress runs per capture: a tag concurrency
  limit of 2 per unique ``dagster/partition`` value (capture runs are partitioned by
  capture id): the one ticking and the next, started shortly before it ends, which waits
  in its first op for it (``defs/capture/handoff.py``: one ticks at a time, no gap);
- SQLite storage under the state dir by default, PostgreSQL when a URL is given (its
  password may be a ``${ENV}`` reference: Dagster reads it from the environment);
- at most one dbt build run at a time (tag ``cdc/dbt_build``);
- the run queue checked every second (Dagster's default is 5 s): a capture's next run
  waits in the queue for the previous one, and every second of that is replication lag;
  a run no concurrency limit applies to is launched at once, not queued, when no run
  waits in the queue (``services.run_coordinator``: a new changefeed's snapshot run);
- run monitoring on: a run stuck in STARTING is failed after 3 minutes, one past its
  ``dagster/max_runtime`` tag (capture runs carry one) is failed, so a hung capture run
  does not hold its capture's slot in the queue for ever;
- sensors evaluated in threads, so the owner sensor is not queued behind others, and a
  tick's run requests submitted side by side (a new changefeed's puller and snapshot runs
  reach the run queue together);
- runs launched by :class:`cdc_dagster.services.run_launcher.WarmRunLauncher`: into run
  workers that imported the code location before the run was asked for (a run's first op
  ~1 s after its launch instead of ~6 s on an idle machine, 10-35 s on a busy one), killed
  if a termination request does not stop them within 30 s; the workers replacing those a
  snapshot's launch took are started once its ``mysql_snapshot`` run ends (at most 120 s
  later): their imports took the CPU of its first reads.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
WORKSPACE_YAML = PACKAGE_ROOT / "workspace.yaml"
LOCATION_NAME = "cdc_dagster"  # the code location (workspace.yaml names it too)

_COMMON = """\
# Written by cdc-dagster; edit the template in cdc_dagster/services/dagster_home.py.
# The run coordinator (run_coordinator below) is a queued one; `concurrency.runs` configures it.
concurrency:
  runs:
    # Two runs per capture at a time (capture runs carry dagster/partition = capture id):
    # the one ticking and the next, which waits in its first op until the first has ended
    # (cdc_dagster/defs/capture/handoff.py); a third waits here.
    tag_concurrency_limits:
      - key: dagster/partition
        value:
          applyLimitPerUniqueValue: true
        limit: 2
      # One dbt build at a time: builds share the DuckDB file / the pinned views
      # (cdc_dagster.dbt); a second one queues instead of waiting on the build lock.
      - key: cdc/dbt_build
        limit: 1
      # Two binlog puller runs per upstream (host:port/server-id) at a time: the one
      # pulling and the next, which waits in its op until the first has ended
      # (cdc_dagster/defs/handoff.py); a third waits here.
      - key: cdc/upstream
        value:
          applyLimitPerUniqueValue: true
        limit: 2
# Queued runs dequeued every second (Dagster's default is 5 s); a run no limit holds back,
# submitted with no run queued, is launched at once (cdc_dagster/services/run_coordinator.py)
run_coordinator:
  module: cdc_dagster.services.run_coordinator
  class: PromptRunCoordinator
  config:
    dequeue_interval_seconds: 1
    dequeue_use_threads: true
    dequeue_num_workers: 4
run_monitoring:
  enabled: true
  start_timeout_seconds: 180
  cancel_timeout_seconds: 180
  poll_interval_seconds: 30
sensors:
  use_threads: true
  num_workers: 4
  # a tick's run requests created side by side: each asks the code server for its
  # execution plan (0.2-0.5 s under load), and a new changefeed's snapshot run, created
  # after its puller's, missed the queue's next dequeue (1.5 s later to start)
  num_submit_workers: 4
# Runs start in run workers that imported the code location ahead of need
# (cdc_dagster/services/run_launcher.py); one run per worker process, as Dagster's own.
run_launcher:
  module: cdc_dagster.services.run_launcher
  class: WarmRunLauncher
  config:
    # three (~370 MB each, idle): two captures' next runs (they take the newest) and a new
    # changefeed's puller and snapshot runs, all within a replacement's imports (15-20 s
    # under load), find workers done importing
    warm_workers: 3
    kill_after_s: 30
    # imported ahead too: Spark Connect's client, the owner's graph library, a snapshot
    # read's clients (connectorx imports pandas at its first read, ~0.3 s)
    preload_modules:
      - pyspark.sql.connect.session
      - networkx
      - cdc_dagster.mysql.chunk_reader
      - pandas
    # forked from a zygote that imported once (~0.2 CPU-s a worker, refilled at once)
    fork_workers: true
    # without the zygote (fork_workers: false), the replacements of workers taken wait for
    # a snapshot's reads, and for a CPU to spare, at most quiet_max_s
    quiet_jobs:
      - mysql_snapshot
    quiet_max_s: 120
    quiet_idle_cores: 1.0
telemetry:
  enabled: false
"""

_SQLITE = """\
storage:
  sqlite:
    base_dir: {base_dir}
"""

_POSTGRES = """\
storage:
  postgres:
    postgres_url:
      env: CDC_DAGSTER_DAGSTER_PG_URL
"""


def render_dagster_yaml(base_dir: Path, postgres: bool = False) -> str:
    """The ``dagster.yaml`` text (PostgreSQL reads its URL from CDC_DAGSTER_DAGSTER_PG_URL)."""
    return _COMMON + (_POSTGRES if postgres else _SQLITE.format(base_dir=base_dir))


def dagster_home(state_dir: Path, postgres: bool = False) -> Path:
    """Create ``<state dir>/dagster`` with its ``dagster.yaml`` (rewritten each start)."""
    home = state_dir / "dagster"
    home.mkdir(parents=True, exist_ok=True)
    text = render_dagster_yaml(home / "storage", postgres)
    target = home / "dagster.yaml"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    return home


def grpc_workspace(state_dir: Path, port: int) -> Path:
    """``<state dir>/dagster/workspace.yaml``: the code location served on ``port``.

    ``server start`` / ``demo`` run the code server themselves (``dagster api grpc`` on a
    port kept across restarts) and point the daemon and the webserver at it, so a code
    server restarted by the supervisor is found where it was, without a reload.
    """
    target = dagster_home(state_dir) / "workspace.yaml"
    target.write_text(
        "# Written by cdc-dagster (server start / demo): the code server it supervises.\n"
        "load_from:\n"
        "  - grpc_server:\n"
        "      host: 127.0.0.1\n"
        f"      port: {port}\n"
        f"      location_name: {LOCATION_NAME}\n"
    )
    return target

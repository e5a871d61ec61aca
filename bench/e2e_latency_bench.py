"""End-to-end latency under Dagster: upstream commit -> its rows readable downstream.

Starts the demo stack in a temporary state dir (private etcd, Spark Connect, the Dagster processes
with the owner sensor, the embedded generator at a fixed rate, a changefeed into Delta),
lets it reach steady state, then for each generator step (one second of transactions)
records two moments:

- readable: every table's checkpoint, as the captures report it after their Delta commit,
  has passed the step's last commit ts: every row of the step can be read in Delta;
- checkpointed: the changefeed's global checkpoint (advanced by the owner's next tick after
  those reports) has passed it.

    python bench/e2e_latency_bench.py --tables 10 [--duration 120] [--warmup 60]
        [--follow-s 300] [--baseline] [--syncpoint-s 60]

``--baseline`` first measures capture runs of one tick each (no follow ticks) on a stack
of its own, then the setting measured, and prints baseline / measured latency ratios.

It also prints where a capture run's time goes (the run queue, the run worker's start,
the ops) from the Dagster instance's event log. Ends with: latency_p50_s=...
latency_p99_s=... checkpoint_p50_s=... sensor_tick_p50_s=... run_launch_p50_s=...
rows_per_s=... (latency_* is the readable latency).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdc_dagster.defs.settings import Settings
from cdc_dagster.services import stack, workload
from scheduler_core.ts import physical_ms


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sensor_tick_durations(dagster_home: Path) -> list[float]:
    """Durations of the owner sensor's ticks recorded by the instance."""
    import os

    os.environ["DAGSTER_HOME"] = str(dagster_home)
    from dagster import DagsterInstance

    with DagsterInstance.get() as instance:
        out = []
        for state in instance.all_instigator_state():
            if state.name != "cdc_owner":
                continue
            for tick in instance.get_ticks(
                state.instigator_origin_id, state.selector_id, limit=1000
            ):
                end = getattr(tick, "end_timestamp", None)
                if end:
                    out.append(end - tick.timestamp)
        return out


def capture_run_phases(dagster_home: Path, since: float) -> dict[str, list[float]]:
    """Per phase of the capture runs created after ``since``: queued (enqueued -> starting:
    the wait for the capture's previous run, then the queue daemon), launch (starting ->
    started: the run worker's process and code load), run (started -> success)."""
    import os

    os.environ["DAGSTER_HOME"] = str(dagster_home)
    from dagster import DagsterInstance

    names = {
        "PIPELINE_ENQUEUED": "enqueued",
        "PIPELINE_STARTING": "starting",
        "PIPELINE_START": "started",
        "PIPELINE_SUCCESS": "success",
    }
    out: dict[str, list[float]] = {"queued": [], "launch": [], "run": []}
    with DagsterInstance.get() as instance:
        for rec in instance.get_run_records(limit=5000):
            if rec.dagster_run.job_name != "capture_tick":
                continue
            if rec.create_timestamp.timestamp() < since:
                continue
            at: dict[str, float] = {}
            for entry in instance.all_logs(rec.dagster_run.run_id):
                ev = entry.dagster_event
                if ev is not None and ev.event_type_value in names:
                    at.setdefault(names[ev.event_type_value], entry.timestamp)
            for phase, (a, b) in {
                "queued": ("enqueued", "starting"),
                "launch": ("starting", "started"),
                "run": ("started", "success"),
            }.items():
                if a in at and b in at:
                    out[phase].append(at[b] - at[a])
    return out


def readable_ts(ms: Any, changefeed_id: str, tables: int) -> int:
    """The ts up to which every row of every table is in Delta (the minimum over tables of
    the checkpoints their captures reported after committing), 0 while a table is not
    reported as replicating (moving, or not started)."""
    from cdc_dagster.runtime import reported_checkpoints

    per_table = reported_checkpoints(ms.task_statuses.read(changefeed_id))
    return min(per_table.values()) if len(per_table) >= tables else 0


def last_create(changelog: Path) -> int:
    """The commit ts of the change log's last CREATE TABLE so far (the bootstrap's)."""
    from cdc_dagster.upstream.changelog import ChangeLog

    return max(r.commit_ts for r in ChangeLog(changelog).ddl_records() if r.creates)


def measure(args: argparse.Namespace, follow_s: float) -> dict[str, float] | None:
    """One stack, one changefeed, capture runs following their mailbox for ``follow_s``
    (0: one tick per run); the figures, or None when the checkpoint never moved."""
    os.environ["CDC_DAGSTER_CAPTURE_LOOP_S"] = str(follow_s)  # the Dagster processes inherit it
    stack.say(f"--- capture runs following their mailbox for {follow_s:.0f} s")
    state = Path(tempfile.mkdtemp(prefix="e2e-bench-"))  # under $TMPDIR
    changelog, lake = state / "changelog", state / "lake"
    steps: list[tuple[int, float, int]] = []  # (last commit ts, wall time, rows)

    def generator() -> workload.GeneratorThread:
        # Rows only: every DDL is a barrier plus a Dagster run, which would dominate.
        return workload.GeneratorThread(
            changelog, args.tables, interval_s=1.0, txns_per_step=args.txns_per_s, ddl_every=0
        )

    with stack.Stack(state, kind="demo", changelog=changelog, generator=generator) as st:
        etcd, gen = st.etcd_endpoints, st.generator
        # From the last bootstrap CREATE: every table is in the initial set. From the
        # first one each later table is added as its CREATE passes, one after another,
        # each a few owner-tick/run round trips: minutes of start-up that are not latency.
        stack.say(
            workload.ensure_demo_changefeed(
                etcd,
                state,
                "bench",
                lake,
                stack.DEMO_CAPTURES,
                changelog,
                last_create(changelog),
                sync_point_interval_s=args.syncpoint_s,
            )
        )
        from cdc_dagster.metastore import connect

        ms = connect(etcd.split(","), state)
        stop = threading.Event()

        def record() -> None:  # note each step's last commit ts when it is written
            w = gen.workload
            last = 0
            while not stop.wait(0.2):
                ts = w.last_commit_ts  # type: ignore[attr-defined]
                if ts != last:
                    steps.append((ts, time.time(), 0))
                    last = ts

        threading.Thread(target=record, daemon=True).start()
        t0 = time.time()
        first_move = None
        start_ckpt = ms.changefeeds.get("bench").status.checkpoint_ts
        from cdc_dagster.upstream.changelog import ChangeLog

        n_tables = len(ChangeLog(changelog).tables_at(1 << 62))  # no DDL: fixed
        seen: dict[int, float] = {}  # step ts -> checkpointed after
        readable: dict[int, float] = {}  # step ts -> readable after
        deadline = None
        while True:
            ckpt = ms.changefeeds.get("bench").status.checkpoint_ts
            in_delta = readable_ts(ms, "bench", n_tables)
            now = time.time()
            if first_move is None and ckpt > start_ckpt:
                first_move = now
                deadline = now + args.warmup + args.duration
                stack.say(
                    f"checkpoint moving after {now - t0:.0f} s; warming up {args.warmup:.0f} s"
                )
            for ts, wall, _ in steps:
                if ts <= ckpt and ts not in seen:
                    seen[ts] = now - wall
                if ts <= max(ckpt, in_delta) and ts not in readable:
                    readable[ts] = now - wall
            if deadline and now > deadline:
                break
            if first_move is None and now - t0 > 600:
                stack.say("the checkpoint never moved in 10 minutes")
                return None
            time.sleep(0.5)
        stop.set()
        window_start = first_move + args.warmup  # type: ignore[operator]
        lat = [seen[ts] for ts, wall, _ in steps if ts in seen and wall >= window_start]
        if not lat:  # not keeping up: report every step checkpointed since the start
            stack.say("no step of the window was checkpointed: the replica is falling behind")
            lat = list(seen.values())
        rlat = [readable[t] for t, wall, _ in steps if t in readable and wall >= window_start]
        rlat = rlat or list(readable.values())
        measured_rows = gen.workload.rows_written  # type: ignore[attr-defined]
        elapsed = time.time() - (first_move or t0)
        ticks = sensor_tick_durations(state / "dagster")
        phases = capture_run_phases(state / "dagster", window_start)
        for phase, values in phases.items():
            if values:
                stack.say(
                    f"capture runs in the window, {phase}: p50 {statistics.median(values):.2f} s "
                    f"p90 {percentile(values, 0.9):.2f} s ({len(values)} runs)"
                )
        caught = [ts for ts, wall, _ in steps if wall >= window_start]
        behind = (
            physical_ms(max(caught)) - physical_ms(ms.changefeeds.get("bench").status.checkpoint_ts)
            if caught
            else 0
        )
        stack.say(
            f"{len(lat)} of {len(caught)} steps checkpointed in the window; final lag {behind / 1000:.1f} s"
        )
        ms.close()
        launch = phases["launch"]
        return {
            "latency_p50_s": percentile(rlat, 0.5),
            "latency_p99_s": percentile(rlat, 0.99),
            "checkpoint_p50_s": percentile(lat, 0.5),
            "checkpoint_p99_s": percentile(lat, 0.99),
            "sensor_tick_p50_s": statistics.median(ticks) if ticks else float("nan"),
            "run_launch_p50_s": statistics.median(launch) if launch else float("nan"),
            "rows_per_s": measured_rows / max(elapsed, 1e-9),
        }


def line(figures: dict[str, float]) -> str:
    """``name=value ...`` with two decimals (rows/s with one)."""
    return " ".join(
        f"{k}={v:.1f}" if k == "rows_per_s" else f"{k}={v:.2f}" for k, v in figures.items()
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--duration", type=float, default=120.0, help="measured seconds")
    p.add_argument(
        "--warmup", type=float, default=60.0, help="seconds after the first checkpoint move"
    )
    p.add_argument("--txns-per-s", type=int, default=20)
    p.add_argument(
        "--syncpoint-s",
        type=int,
        default=60,
        help="the changefeed's syncpoint interval (the demo's: 60; each syncpoint is a barrier)",
    )
    p.add_argument(
        "--follow-s",
        type=float,
        default=Settings().capture_loop_s,
        help="how long a capture run follows its mailbox (CDC_DAGSTER_CAPTURE_LOOP_S)",
    )
    p.add_argument(
        "--baseline",
        action="store_true",
        help="first measure one tick per run (follow 0 s) on a stack of its own, then the "
        "measured setting, and print their ratios",
    )
    args = p.parse_args()
    base = measure(args, 0.0) if args.baseline else None
    if args.baseline and base is None:
        return 1
    figures = measure(args, args.follow_s)
    if figures is None:
        return 1
    if base is not None:
        stack.say(f"baseline (one tick per run): {line(base)}")
        ratios = {k: base[k] / v for k, v in figures.items() if k.startswith(("latency", "check"))}
        stack.say(
            "baseline / this, latency: "
            + " ".join(f"{k.removesuffix('_s')}={r:.2f}x" for k, r in ratios.items())
        )
    print(line(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

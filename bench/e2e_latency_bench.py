"""End-to-end latency under Dagster: upstream commit -> changefeed checkpoint past it.

Starts the demo stack in a temporary state dir (private etcd, Spark Connect, `dagster dev`
with the owner sensor, the embedded generator at a fixed rate, a changefeed into Delta),
lets it reach steady state, then for each generator step records when the changefeed
checkpoint (every change with commit ts <= it is in Delta) passes the step's last commit.

    python bench/e2e_latency_bench.py --tables 10 [--duration 120] [--warmup 90]

Ends with: latency_p50_s=... latency_p99_s=... sensor_tick_p50_s=... rows_per_s=...
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def last_create(changelog: Path) -> int:
    """The commit ts of the change log's last CREATE TABLE so far (the bootstrap's)."""
    from cdc_dagster.upstream.changelog import ChangeLog

    return max(r.commit_ts for r in ChangeLog(changelog).ddl_records() if r.creates)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--duration", type=float, default=120.0, help="measured seconds")
    p.add_argument(
        "--warmup", type=float, default=60.0, help="seconds after the first checkpoint move"
    )
    p.add_argument("--txns-per-s", type=int, default=20)
    args = p.parse_args()
    state = Path(tempfile.mkdtemp(prefix="e2e-bench-"))  # under $TMPDIR
    changelog, lake = state / "changelog", state / "lake"
    started: list = []
    # Rows only: every DDL is a barrier plus a Dagster run, which would dominate.
    gen = workload.GeneratorThread(
        changelog, args.tables, interval_s=1.0, txns_per_step=args.txns_per_s, ddl_every=0
    )
    steps: list[tuple[int, float, int]] = []  # (last commit ts, wall time, rows)
    try:
        with stack._running(state) as started:
            etcd = stack._start_etcd(state, None)
            gen.start()
            _, _children = stack._bring_up(state, started, etcd, 0, True, changelog)
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
            seen: dict[int, float] = {}
            deadline = None
            while True:
                ckpt = ms.changefeeds.get("bench").status.checkpoint_ts
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
                if deadline and now > deadline:
                    break
                if first_move is None and now - t0 > 600:
                    stack.say("the checkpoint never moved in 10 minutes")
                    return 1
                time.sleep(0.5)
            stop.set()
            window_start = first_move + args.warmup  # type: ignore[operator]
            lat = [seen[ts] for ts, wall, _ in steps if ts in seen and wall >= window_start]
            if not lat:  # not keeping up: report every step checkpointed since the start
                stack.say("no step of the window was checkpointed: the replica is falling behind")
                lat = list(seen.values())
            measured_rows = gen.workload.rows_written  # type: ignore[attr-defined]
            elapsed = time.time() - (first_move or t0)
            ticks = sensor_tick_durations(state / "dagster")
            caught = [ts for ts, wall, _ in steps if wall >= window_start]
            behind = (
                physical_ms(max(caught))
                - physical_ms(ms.changefeeds.get("bench").status.checkpoint_ts)
                if caught
                else 0
            )
            stack.say(
                f"{len(lat)} of {len(caught)} steps checkpointed in the window; final lag {behind / 1000:.1f} s"
            )
            ms.close()
            print(
                f"latency_p50_s={percentile(lat, 0.5):.2f} latency_p99_s={percentile(lat, 0.99):.2f} "
                f"sensor_tick_p50_s={statistics.median(ticks) if ticks else float('nan'):.2f} "
                f"rows_per_s={measured_rows / max(elapsed, 1e-9):.1f}"
            )
    finally:
        gen.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

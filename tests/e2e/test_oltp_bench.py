"""bench/oltp_bench.py --quick: the OLTP bench runs end to end and its figures agree.

The bench starts its own private MariaDB (sysbench), PostgreSQL and the whole stack
(``cdc-dagster server start``: etcd, Spark Connect, ``dagster dev`` with the daemon). This
checks that every marker written under load became readable in both sinks, that the
replicas equal the upstream, and that the figures are consistent with each other and with
the machine-readable line — never how fast anything was.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "oltp_bench.py"
LINE_KEYS = [
    "readable_p50_s",
    "readable_p99_s",
    "checkpoint_p50_s",
    "checkpoint_p99_s",
    "idle_lag_max_s",
    "upstream_rows_per_s",
    "replicated_rows_per_s",
]


def _missing() -> str:
    from cdc_dagster.testing.servers import EmbeddedServerError, find_mariadbd, find_pg_bin

    if shutil.which("sysbench") is None:
        return "sysbench (apt-get install sysbench)"
    try:
        find_mariadbd()
        find_pg_bin()
    except EmbeddedServerError as exc:
        return str(exc)
    return ""


def _worst(figures: list[dict], key: str) -> float:
    values = [f[key] for f in figures]
    return min(values) if key.endswith("rows_per_s") else max(values)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_quick_bench_replicates_every_marker_and_its_figures_agree(tmp_path: Path) -> None:
    missing = _missing()
    if missing:
        pytest.skip(f"needs {missing}")
    # The stack takes its knobs from CDC_DAGSTER_* variables: run it with the defaults.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_DAGSTER_")}
    env["TMPDIR"] = str(tmp_path)
    out = tmp_path / "figures.json"
    res = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=2300, check=False,
    )  # fmt: skip
    # The whole output (the table, where the time goes) beside the figures, for a look later.
    (tmp_path / "bench.out").write_text(res.stdout + res.stderr)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]

    line = dict(kv.split("=", 1) for kv in res.stdout.strip().splitlines()[-1].split())
    assert list(line)[: len(LINE_KEYS)] == LINE_KEYS
    assert line["sinks"] == "delta,postgres"
    doc = json.loads(out.read_text())
    sinks, base = doc["sinks"], doc["baselines"]
    assert [f["sink"] for f in sinks] == ["delta", "postgres"]
    for key in LINE_KEYS:  # the line is the worst sink's figure, as printed
        assert float(line[key]) == pytest.approx(_worst(sinks, key), abs=0.051), key

    for f in sinks:
        name = f["sink"]
        assert "error" not in f, f["error"]
        assert f["replica_equal"], name
        assert f["markers_written"] >= 30, name  # one a second over the measured minute
        assert f["markers_readable"] == f["markers_written"], name
        for stem in ("readable", "checkpoint"):
            trio = [f[f"{stem}_{q}_s"] for q in ("p50", "p99", "max")]
            assert all(math.isfinite(v) for v in trio), (name, stem, trio)
            assert trio == sorted(trio), (name, stem, trio)
        # Each marker's readable latency includes its way into the change log.
        assert f["puller_stage_p50_s"] <= f["readable_p50_s"], name
        assert 0 <= f["capture_stage_p50_s"] <= f["readable_max_s"], name
        assert 0 < f["idle_lag_p50_s"] <= f["idle_lag_max_s"], name
        assert f["upstream_rows_per_s"] > 0 and f["replicated_rows_per_s"] > 0, name
        assert f["backlog_rows"] > 0 and f["drain_s"] > 0, name
        assert f["drain_rows_per_s"] == pytest.approx(f["backlog_rows"] / f["drain_s"]), name
        assert f["sensor_interval_p50_s"] > 0 and f["capture_ticks_per_min"] > 0, name
        assert f["tail_s"] > 0 and f["startup_s"] > 0, name
        samples = f["samples"]
        assert len(samples) > 60 and all(s[1] > -2 for s in samples), name

    # The bare puller pulled exactly the rows the workload changed meanwhile.
    assert base["bare_rows"] == base["bare_upstream_rows"] > 0
    for key in (
        "bare_puller_rows_per_s",
        "bare_sink_delta_rows_per_s",
        "bare_sink_postgres_rows_per_s",
    ):
        assert base[key] > 0, key

"""bench/cpu_roles.py: the CPU a machine spent, by the stack's roles, over windows of time."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux's /proc")


@pytest.fixture(scope="module")
def roles(load_bench: Any) -> Any:
    return load_bench("cpu_roles")


def test_roles_by_job_name_then_command_line(roles: Any) -> None:
    role = roles.role_of
    run_worker = "python -m cdc_dagster.services.run_worker cdc_dagster.defs pyspark"
    assert role(10, "capture_tick", run_worker, 1) == "capture_tick"  # a run, by its job
    assert role(10, "mysql_puller", run_worker, 1) == "mysql_puller"
    assert role(10, "python", run_worker, 1) == "idle run workers"  # not given a run yet
    assert role(10, "cdc bulk", "python -c from multiprocessing.spawn", 1) == "bulk workers"
    assert role(10, "mariadbd", "/usr/sbin/mariadbd --no-defaults", 1) == "mariadb"
    assert role(10, "python", "python -m pyspark.daemon pyspark.worker", 1) == "spark python"
    assert role(10, "java", "java -cp x org.apache.spark.deploy.SparkSubmit", 1) == "spark jvm"
    assert role(10, "python", "python /x/bin/dagster-daemon run -w w.yaml", 1) == ("dagster daemon")
    assert role(1, "python", "python bench/throughput_bench.py", 1) == "bench"
    assert role(10, "sshd", "sshd: root", 1) == "other"
    # a program's own name is not taken for a job's, even in a run worker's command line
    assert role(10, "python3", run_worker, 1) == "idle run workers"


def test_a_busy_named_process_is_counted_under_its_name_in_its_window(roles: Any) -> None:
    """A child named ``capture_tick`` spinning for ~1.5 s: counted under that role in the
    window it ran (at most a core; less on a machine busy with other tests), nothing of it
    in a window after it."""
    spin = (
        "import time, os\n"
        "open('/proc/self/comm', 'w').write('capture_tick')\n"
        "end = time.time() + 1.5\n"
        "while time.time() < end: pass\n"
    )
    sampler = roles.CpuRoles(interval_s=0.1).start()
    try:
        t0 = time.time()
        # the child's command line names the run worker module, as the stack's runs do
        subprocess.run([sys.executable, "-c", spin, "cdc_dagster.services.run_worker"], check=True)
        t1 = time.time()
        time.sleep(0.5)
        t2 = time.time()
    finally:
        sampler.stop()
    during = sampler.cores(t0, t1)
    assert 0.2 <= during.get("capture_tick", 0.0) <= 1.3, during
    assert "capture_tick" not in sampler.cores(t1 + 0.2, t2)
    assert "capture_tick" in sampler.line(t0, t1).split(" cores: ")[1]
    assert sampler.cores(t2 + 10, t2 + 20) == {}
    assert sampler.line(t2 + 10, t2 + 20) == "not sampled"

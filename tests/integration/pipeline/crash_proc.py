"""A capture tick in its own process that SIGKILLs itself between the sink write and the save.

Usage: python crash_proc.py <tmp_path>. Used by test_crash.py.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

from changelog_v1 import changelog_reader

from cdc_dagster.pipeline.engine import spark_session
from cdc_dagster.pipeline.executor import SparkTableExecutor


def main() -> None:
    tmp = Path(sys.argv[1])
    # The parent's mode: a local session, or its Spark Connect server (CDC_SPARK_MASTER).
    master = os.environ.get("CDC_SPARK_MASTER", "local[1]")
    spark = spark_session(master, conf={"spark.sql.shuffle.partitions": "1"})
    ex = SparkTableExecutor.load(
        "c1",
        "cf",
        changelog_reader(tmp / "log"),
        f"delta://{tmp / 'delta'}",
        tmp / "staging",
        spark,
    )

    def die() -> None:  # the sink has committed; the manifest still says the old checkpoint
        os.kill(os.getpid(), signal.SIGKILL)

    ex._prune = die  # type: ignore[method-assign]
    ex.pull_phase()
    ex.sink_phase()


if __name__ == "__main__":
    main()

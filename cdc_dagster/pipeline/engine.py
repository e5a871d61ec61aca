"""The Spark session the data plane runs on: local, a master URL, or Spark Connect.

Nothing happens at import time; a session is made only when :func:`spark_session` is
called. The pipeline uses the DataFrame API only, so every session kind runs the same code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Small by default: a capture tick is many small tables, not one big shuffle.
DEFAULT_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
}


def connect_server_conf(port: int) -> dict[str, str]:
    """The settings of a Spark Connect server the data plane's sessions run on (the same
    defaults as an in-process session, on a loopback port)."""
    return {
        **DEFAULT_CONF,
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.binding.address": "127.0.0.1",
    }


def spark_session(
    master: str | None = None,
    app_name: str = "cdc-dagster",
    conf: Mapping[str, str] | None = None,
    *,
    fresh: bool = False,
) -> SparkSession:
    """A session on ``master``: ``local[*]`` by default, ``sc://host:port`` for Spark Connect;
    ``fresh``: a new Spark Connect session, not the cached one (its server restarted)."""
    from pyspark.sql import SparkSession

    master = master or "local[*]"
    settings = {**DEFAULT_CONF, **(conf or {})}
    if master.startswith("sc://"):
        builder = SparkSession.builder.remote(master)
        # Static settings belong to the server; only session-level SQL settings apply.
        settings = {k: v for k, v in settings.items() if k.startswith("spark.sql.")}
    else:
        builder = SparkSession.builder.master(master).appName(app_name)
        # Workers run this interpreter (its packages), not whatever python3 is on PATH;
        # PySpark reads only the environment variable for this.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in settings.items():
        builder = builder.config(key, value)
    if fresh and master.startswith("sc://"):
        return builder.create()
    return builder.getOrCreate()


def session_alive(spark: SparkSession) -> bool:
    """Whether the session still answers (one round trip for Spark Connect)."""
    try:
        spark.conf.get("spark.sql.session.timeZone")
    except Exception:
        return False
    return True


def is_connect(spark: object) -> bool:
    """True for a Spark Connect session (no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")

"""The Spark session the data plane runs on: local, a master URL, or Spark Connect.

Nothing happens at import time; a session is made only when :func:`spark_session` is
called. The pipeline uses the DataFrame API only, so every session kind runs the same code.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
GATEWAY_RETRY_S = 2.0  # before the one more try at a local JVM that exited as it started

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
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    master = master or "local[*]"
    if master.startswith("sc://"):
        builder = _connect_builder(master, conf)
    else:
        builder = SparkSession.builder.master(master).appName(app_name)
        # Workers run this interpreter (its packages), not whatever python3 is on PATH;
        # PySpark reads only the environment variable for this.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
            builder = builder.config(key, value)
    if fresh and master.startswith("sc://"):
        return builder.create()
    try:
        return builder.getOrCreate()
    except PySparkRuntimeError as e:
        if master.startswith("sc://") or "JAVA_GATEWAY_EXITED" not in str(e):
            raise
        # A local JVM that exited before it said its port (seen once in CI among a hundred
        # starts, two test workers busy): one more try before the caller's run fails on it.
        log.warning("the local Spark JVM exited as it started (%s); trying once more", e)
        time.sleep(GATEWAY_RETRY_S)
        return builder.getOrCreate()


# Shared sessions (``shared_session``): the ids are derived from a name, so every process
# asking for the same name attaches to one server-side session -- and to its Python workers,
# which have imported what its jobs import. A new Spark Connect session starts its own Python
# daemon and workers: 2-5 s here before a job's first task body runs (imports included).
_SHARED_NS = uuid.UUID("5f0d8c1e-3a57-4c0e-9b7a-6cdc0da9e5a1")
_SHARED_SLOTS = 8  # ids tried in turn: a session released or expired on the server is gone


def shared_session(remote: str, name: str, conf: Mapping[str, str] | None = None) -> SparkSession:
    """The Spark Connect session named ``name`` on ``remote`` (``sc://``), created by the
    first process that asks and attached to by the next ones; its Python workers stay warm
    between runs. ``stop()`` on it only closes this client: it is never released. A name
    whose sessions were all closed on the server gets a fresh, unnamed session."""
    sep = ";" if ";" in remote else "/;"
    for slot in range(_SHARED_SLOTS):
        sid = uuid.uuid5(_SHARED_NS, f"{name}:{slot}")
        builder = _connect_builder(f"{remote.rstrip('/')}{sep}session_id={sid}", conf)
        try:
            session = builder.create()
            session.release_session_on_close = False
            session.conf.get("spark.sql.session.timeZone")  # a closed session fails here
            return session
        except Exception as exc:
            if "SESSION_CLOSED" not in str(exc):
                raise
    return spark_session(remote, conf=conf, fresh=True)


def _connect_builder(url: str, conf: Mapping[str, str] | None) -> Any:
    """A Spark Connect builder for ``url`` with the session-level SQL settings of the
    defaults and ``conf`` (static settings belong to the server)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(url)
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        if key.startswith("spark.sql."):
            builder = builder.config(key, value)
    return builder


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

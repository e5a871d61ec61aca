"""The control plane's resources: every sensor, op and dbt piece gets etcd, the settings and
Spark from here (dagster-open-platform's way: resources, not module-level helpers).

``CdcResource`` gives the settings (``CDC_DAGSTER_*`` under its non-empty fields), a metastore
connection per run (closed after it), and the owner loop of this code-server process: the one
explicit, rebuildable cache of the control plane (losing it, in a code-server restart, is an
owner switch: the next tick rebuilds from etcd). ``SparkResource`` is dagster-pyspark's lazy
session, built by the data plane's one builder (:func:`cdc_dagster.pipeline.engine.spark_session`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import Any, ClassVar

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import PrivateAttr

from cdc_dagster.defs.settings import Settings
from cdc_dagster.metastore import Metastore, connect
from cdc_dagster.pipeline.engine import session_alive, spark_session
from cdc_dagster.runtime import OwnerLoop
from scheduler_core.coordinator import CoordinatorConfig

_log = logging.getLogger(__name__)


def open_metastore(settings: Settings, **timeouts: float) -> Metastore:
    """A metastore connection per the settings (the caller closes it); ``timeouts``:
    ``rpc_timeout_s`` / ``retry_timeout_s`` of :func:`cdc_dagster.metastore.connect`."""
    return connect(
        list(settings.etcd) or None,
        settings.state_dir,
        cluster_id=settings.cluster_id,
        **timeouts,  # type: ignore[arg-type]
    )


class CdcResource(dg.ConfigurableResource):
    """Where etcd, the state dir and the change log are (empty fields: ``CDC_DAGSTER_*``)."""

    etcd: str = ""
    state_dir: str = ""
    cluster_id: str = ""
    changelog: str = ""

    _metastore: Any = PrivateAttr(default=None)

    # settings key -> this process's owner loop (see the module docstring).
    _owner_loops: ClassVar[dict[tuple[str, ...], OwnerLoop]] = {}
    _owner_loops_lock: ClassVar[threading.Lock] = threading.Lock()

    def settings(self) -> Settings:
        """The environment's settings with this resource's non-empty fields on top."""
        changes: dict[str, Any] = {}
        if self.etcd:
            changes["etcd"] = tuple(e for e in self.etcd.split(",") if e)
        if self.state_dir:
            changes["state_dir"] = Path(self.state_dir)
        if self.cluster_id:
            changes["cluster_id"] = self.cluster_id
        if self.changelog:
            changes["changelog"] = Path(self.changelog)
        return dataclasses.replace(Settings.from_env(), **changes)

    def metastore(self) -> Metastore:
        """This run's metastore connection (opened on first use, closed after the run)."""
        if self._metastore is None:
            self._metastore = open_metastore(self.settings())
        return self._metastore

    def owner_loop(self) -> OwnerLoop:
        """This process's owner loop for these settings (built on first use, then cached)."""
        s = self.settings()
        key = (*s.etcd, str(s.state_dir), s.cluster_id, s.owner_id)
        with self._owner_loops_lock:
            loop = self._owner_loops.get(key)
            if loop is None:
                loop = OwnerLoop(
                    open_metastore(s),
                    s.owner_id,
                    lease_ttl_s=s.owner_ttl_s,
                    config=CoordinatorConfig(add_table_batch_size=s.add_table_batch),
                )
                self._owner_loops[key] = loop
            return loop

    @classmethod
    def forget_owner_loops(cls) -> None:
        """Drop the cached owner loops (tests: the same as a code-server restart)."""
        with cls._owner_loops_lock:
            cls._owner_loops.clear()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """Close the connection the run opened."""
        if self._metastore is not None:
            self._metastore.close()
            self._metastore = None


_SESSION_LOCK = threading.RLock()


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session on Spark Connect (``remote`` or
    ``CDC_DAGSTER_SPARK_REMOTE``: ``sc://host:port``), else a ``local[2]`` in-process session."""

    spark_config: dict[str, Any] = {}
    remote: str = ""

    def _init_session(self, fresh: bool = False) -> None:
        if self._spark_session is not None:
            return
        remote = self.remote or Settings.from_env().spark_remote
        self._spark_session = spark_session(
            remote or "local[2]", dict(self.spark_config), fresh=fresh
        )

    def shared_session(self, name: str) -> Any:
        """Spark Connect's session ``name``, shared with other runs asking for it (its Python
        workers stay warm: ``pipeline.engine.shared_session``); in-process Spark: this
        resource's session."""
        from cdc_dagster.pipeline.engine import shared_session

        remote = self.remote or Settings.from_env().spark_remote
        if not remote.startswith("sc://"):
            return self.live_session()
        return shared_session(remote, name, dict(self.spark_config))

    def live_session(self) -> Any:
        """The session, built anew when the old one no longer answers (Spark Connect was
        restarted under a run that follows its mailbox: the old session is gone for good)."""
        with _SESSION_LOCK:  # a capture run's changefeed lanes ask from their threads
            session = self.spark_session
            if session_alive(session):
                return session
            _log.warning("the Spark session no longer answers; opening a new one")
            try:
                session.stop()
            except Exception as exc:
                _log.info("stopping the dead Spark session: %s", exc)
            self._spark_session = None
            self._init_session(fresh=True)
            return self._spark_session


def table_resources() -> dict[str, Any]:
    """The control plane's resources: metastore, Spark, in-memory IO between ops."""
    return {"cdc": CdcResource(), "spark": SparkResource(), "mem_io": dg.mem_io_manager}

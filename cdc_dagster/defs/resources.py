"""Resources: the metastore connection and the Spark session, configured at run time."""

from __future__ import annotations

from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import PrivateAttr

from cdc_dagster.defs.settings import Settings


class CdcResource(dg.ConfigurableResource):
    """Where etcd, the state dir and the change log are (empty fields: ``CDC_DAGSTER_*``)."""

    etcd: str = ""
    state_dir: str = ""
    cluster_id: str = ""
    changelog: str = ""

    def settings(self) -> Settings:
        """The environment's settings with this resource's non-empty fields on top."""
        import dataclasses
        from pathlib import Path

        base = Settings.from_env()
        changes: dict[str, Any] = {}
        if self.etcd:
            changes["etcd"] = tuple(e for e in self.etcd.split(",") if e)
        if self.state_dir:
            changes["state_dir"] = Path(self.state_dir)
        if self.cluster_id:
            changes["cluster_id"] = self.cluster_id
        if self.changelog:
            changes["changelog"] = Path(self.changelog)
        return dataclasses.replace(base, **changes)

    _metastore: Any = PrivateAttr(default=None)

    def metastore(self) -> Any:
        """The run's metastore connection (opened on first use, closed after the run)."""
        if self._metastore is None:
            from cdc_dagster.metastore import connect

            s = self.settings()
            self._metastore = connect(list(s.etcd) or None, s.state_dir, cluster_id=s.cluster_id)
        return self._metastore

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """Close the connection the run opened."""
        if self._metastore is not None:
            self._metastore.close()
            self._metastore = None


class SparkConnectResource(LazyPySparkResource):
    """dagster-pyspark's lazy session, pointed at Spark Connect (``spark.remote``) at run time.

    ``remote`` (or ``CDC_DAGSTER_SPARK_REMOTE``) is ``sc://host:port``; with neither, a
    ``local[2]`` in-process session (tests).
    """

    spark_config: dict[str, Any] = {}
    remote: str = ""

    def _init_session(self) -> None:
        if self._spark_session is not None:
            return
        remote = self.remote or Settings.from_env().spark_remote
        config = dict(self.spark_config)
        if remote:
            config["spark.remote"] = remote
        else:
            import sys

            config.setdefault("spark.master", "local[2]")
            config.setdefault("spark.pyspark.python", sys.executable)
            config.setdefault("spark.ui.enabled", "false")
            config.setdefault("spark.sql.shuffle.partitions", "4")
        from dagster_pyspark.resources import spark_session_from_config

        self._spark_session = spark_session_from_config(config)


def table_resources() -> dict[str, Any]:
    """The control plane's resources: metastore, Spark, in-memory IO between ops."""
    return {"cdc": CdcResource(), "spark": SparkConnectResource(), "mem_io": dg.mem_io_manager}


def dbt_resources() -> dict[str, Any]:
    """The dbt downstream's: the dbt CLI of ``dbt_downstream/`` and where builds go (both
    resolve their changefeed at run time: ``cdc_dagster.dbt.settings``)."""
    from cdc_dagster.dbt.assets import DbtDownstreamResource, dbt_resource

    return {"dbt": dbt_resource(), "cdc_dbt": DbtDownstreamResource()}

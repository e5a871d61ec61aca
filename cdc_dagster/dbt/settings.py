"""Which changefeed the dbt downstream builds on, and where it reads and writes.

Resolved when asked (sensor tick, run start), never at import time, in this order:

1. fields given in code (``syncpoint_sensor(..., delta_root=...)``, the ``cdc_dbt``
   resource's fields: tests);
2. ``CDC_DAGSTER_DBT_DELTA_ROOT`` / ``CDC_DAGSTER_DBT_CHANGEFEED`` (an override);
3. the changefeeds in etcd (the ``cdc`` resource's metastore, as the owner sensor finds them): the changefeed named by ``CDC_DAGSTER_DBT_CHANGEFEED``, else the
   only one with a syncpoint interval. Its sink URI says where: ``delta:///root`` (models in a
   DuckDB file beside the root) or ``postgresql://...`` (models in that database).

So ``cdc-dagster demo`` / ``server start`` need no dbt setting: the demo's changefeed is
in etcd, and the definitions module only assembles.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cdc_dagster.dbt.errors import DbtDownstreamError
from cdc_dagster.metastore import Metastore
from cdc_dagster.metastore.errors import MetastoreError
from cdc_dagster.sinks.uri import delta_root, delta_uri, is_delta, is_postgres

DELTA_ROOT_ENV = "CDC_DAGSTER_DBT_DELTA_ROOT"  # /abs/root or delta:///abs/root (the sink URI)
CHANGEFEED_ENV = "CDC_DAGSTER_DBT_CHANGEFEED"
DUCKDB_PATH_ENV = "CDC_DBT_DUCKDB_PATH"


class NoTargetError(DbtDownstreamError):
    """No changefeed to build on could be found (the message says what to set)."""


@dataclass(frozen=True, slots=True)
class DbtSettings:
    """The changefeed whose syncpoints the models build on, and its downstream.

    ``sink_uri`` is the changefeed's sink; for Delta, ``delta_root`` is its path and the
    models go to ``duckdb_path``; for PostgreSQL both are empty and the models go to the
    sink's own database (``cdc_dagster.dbt.pg``).
    """

    delta_root: str
    changefeed_id: str
    duckdb_path: str
    sink_uri: str = ""

    @property
    def is_postgres(self) -> bool:
        """True when the changefeed's sink is PostgreSQL."""
        return is_postgres(self.sink_uri)

    @staticmethod
    def for_delta(root: str, changefeed_id: str, duckdb_path: str = "") -> DbtSettings:
        """Settings of a Delta downstream (the DuckDB file defaults to ``<root>/../dbt``)."""
        root = delta_root(root)
        default_db = os.path.join(os.path.dirname(root.rstrip("/")), "dbt", "downstream.duckdb")
        return DbtSettings(
            delta_root=root,
            changefeed_id=changefeed_id,
            duckdb_path=duckdb_path or default_db,
            sink_uri=delta_uri(root),
        )

    @staticmethod
    def for_sink(changefeed_id: str, sink_uri: str, duckdb_path: str = "") -> DbtSettings:
        """Settings from a changefeed's sink URI (``delta://`` or ``postgresql://``)."""
        if is_delta(sink_uri):
            return DbtSettings.for_delta(sink_uri, changefeed_id, duckdb_path)
        return DbtSettings("", changefeed_id, "", sink_uri)

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> DbtSettings | None:
        """The settings from ``CDC_DAGSTER_DBT_*`` alone; None when no Delta root is set."""
        env = os.environ if environ is None else environ
        root = env.get(DELTA_ROOT_ENV, "").strip()
        if not root:
            return None
        return DbtSettings.for_delta(
            root,
            env.get(CHANGEFEED_ENV, "").strip() or "default",
            env.get(DUCKDB_PATH_ENV, "").strip(),
        )


# changefeed id -> (sink URI, sync_point_interval_s), read from etcd.
ChangefeedLookup = Callable[[], Mapping[str, tuple[str, int]]]


def changefeeds_of(ms: Metastore) -> dict[str, tuple[str, int]]:
    """Every changefeed's sink URI and syncpoint interval, from the control plane's etcd."""
    return {
        cf.info.changefeed_id: (cf.info.sink_uri, cf.info.sync_point_interval_s)
        for cf in ms.changefeeds.list()
    }


def pick_changefeed(changefeeds: Mapping[str, tuple[str, int]], wanted: str) -> tuple[str, str]:
    """(changefeed id, sink URI) to build on: ``wanted``, else the only one with syncpoints."""
    if wanted:
        if wanted not in changefeeds:
            raise NoTargetError(
                f"{CHANGEFEED_ENV}={wanted!r} names no changefeed (have {sorted(changefeeds)})"
            )
        return wanted, changefeeds[wanted][0]
    with_syncpoints = sorted(cf for cf, (_, every) in changefeeds.items() if every > 0)
    if len(with_syncpoints) != 1:
        raise NoTargetError(
            f"{len(with_syncpoints)} changefeeds record syncpoints ({with_syncpoints}); the dbt "
            f"models build on one: set {CHANGEFEED_ENV} (or create one with a sync point interval)"
        )
    return with_syncpoints[0], changefeeds[with_syncpoints[0]][0]


def resolve_settings(
    delta_root: str = "",
    changefeed_id: str = "",
    duckdb_path: str = "",
    environ: Mapping[str, str] | None = None,
    lookup: ChangefeedLookup | None = None,
) -> DbtSettings:
    """Given fields, else the environment, else the changefeed in etcd (module docstring)."""
    env = os.environ if environ is None else environ
    wanted = changefeed_id or env.get(CHANGEFEED_ENV, "").strip()
    duckdb_path = duckdb_path or env.get(DUCKDB_PATH_ENV, "").strip()
    root = delta_root or env.get(DELTA_ROOT_ENV, "").strip()
    if root:
        return DbtSettings.for_delta(root, wanted or "default", duckdb_path)
    if lookup is None:
        raise NoTargetError(
            f"no etcd to find the changefeed in; set {DELTA_ROOT_ENV} (and {CHANGEFEED_ENV})"
        )
    try:
        changefeeds = lookup()
    except MetastoreError as exc:
        raise NoTargetError(f"cannot read the changefeeds from etcd: {exc}") from exc
    cf, sink_uri = pick_changefeed(changefeeds, wanted)
    return DbtSettings.for_sink(cf, sink_uri, duckdb_path)

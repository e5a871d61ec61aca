"""dagster-dbt assets of ``dbt_downstream/``: every build pinned to one syncpoint.

Sources map onto the replica assets through ``config.meta.dagster.asset_key`` in the
project's ``sources.yml`` (``["replica", <database>, <table>]``, the control plane's
``Catalog.replica_key``), so the graph reads upstream -> replica -> model. Models are keyed
``["dbt", <model>]`` in group ``dbt_downstream``; dbt tests are asset checks.
"""

import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_dbt import DagsterDbtTranslator, DbtCliResource, DbtProject, dbt_assets

from cdc_dagster.dbt import pg
from cdc_dagster.dbt.build import (
    PROJECT_DIR,
    build_lock,
    build_target_path,
    dbt_executable,
    dbt_vars,
    load_manifest,
    optional_sources,
    record_build,
    source_tables,
)
from cdc_dagster.dbt.errors import BuildError
from cdc_dagster.dbt.pin import PinnedSyncpoint, latest_syncpoint, pin_syncpoint
from cdc_dagster.dbt.settings import ChangefeedLookup, DbtSettings, changefeeds_of, resolve_settings
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.sinks.uri import delta_root
from scheduler_core.ts import physical_ms

MODEL_KEY_PREFIX = "dbt"
GROUP = "dbt_downstream"
BUILD_TAG = "cdc/dbt_build"  # give it tag_concurrency_limits 1: builds share one DuckDB file


class SyncpointBuildConfig(dg.Config):
    """Which syncpoint a run builds (the sensor sets both; 0 / "" = the newest / resolved)."""

    syncpoint_ts: int = 0
    changefeed_id: str = ""


class DbtDownstreamResource(dg.ConfigurableResource):
    """Which changefeed the models build on and where they go.

    Empty fields are resolved at run time (``cdc_dagster.dbt.settings.resolve_settings``:
    ``CDC_DAGSTER_DBT_*``, else the changefeed in etcd), so production definitions use
    ``DbtDownstreamResource()``; tests set the fields.
    """

    delta_root: str = ""
    changefeed_id: str = ""
    duckdb_path: str = ""

    def settings(
        self, changefeed_id: str = "", lookup: ChangefeedLookup | None = None
    ) -> DbtSettings:
        """These fields over the environment, else the changefeeds ``lookup`` lists (etcd's);
        raises ``NoTargetError`` when unknown."""
        return resolve_settings(
            delta_root(self.delta_root) if self.delta_root else "",
            changefeed_id or self.changefeed_id,
            self.duckdb_path,
            lookup=lookup,
        )


class CdcDbtTranslator(DagsterDbtTranslator):
    """Models under ``["dbt", name]`` in group ``dbt_downstream``; sources by their meta key."""

    def get_asset_key(self, dbt_resource_props: Mapping[str, Any]) -> dg.AssetKey:
        if dbt_resource_props["resource_type"] == "source" or _meta_key(dbt_resource_props):
            return super().get_asset_key(dbt_resource_props)
        return dg.AssetKey([MODEL_KEY_PREFIX, dbt_resource_props["name"]])

    def get_group_name(self, dbt_resource_props: Mapping[str, Any]) -> str | None:
        return GROUP


def _meta_key(props: Mapping[str, Any]) -> Any:
    meta = props.get("config", {}).get("meta") or props.get("meta") or {}
    return meta.get("dagster", {}).get("asset_key")


def build_metadata(pinned: PinnedSyncpoint, postgres: bool = False) -> dict[str, dg.MetadataValue]:
    """Names the syncpoint and every table version the build read (ints plot in the UI).

    Delta: each table's Delta version at the syncpoint. PostgreSQL: the copy each source
    read (``table_sources``), taken when every table's committed ts was the syncpoint ts.
    """
    meta: dict[str, dg.MetadataValue] = {
        "changefeed": dg.MetadataValue.text(pinned.changefeed_id),
        "syncpoint_ts": dg.MetadataValue.int(pinned.ts),
        "syncpoint_time": dg.MetadataValue.timestamp(physical_ms(pinned.ts) / 1000.0),
        "downstream": dg.MetadataValue.text("postgres" if postgres else "delta"),
        "table_sources": dg.MetadataValue.json(
            {t.qualified_name: t.location for t in pinned.tables}
        ),
    }
    if not postgres:
        meta["table_versions"] = dg.MetadataValue.json(pinned.versions())
        for name, version in pinned.versions().items():
            meta[f"delta_version/{name}"] = dg.MetadataValue.int(version)
    return meta


def with_replica_lineage(
    assets: dg.AssetsDefinition, replica_keys: Mapping[dg.AssetKey, dg.AssetKey]
) -> dg.AssetsDefinition:
    """The dbt assets with each source dep mapped onto the replica asset that holds it.

    ``replica_keys`` maps a source's key (``["replica", db, table]``) to the replica asset
    the definitions have (the same key, or the schema's when tables are grouped); sources
    of tables the definitions do not replicate are dropped, so no stub asset appears.
    """

    def remap(spec: dg.AssetSpec) -> dg.AssetSpec:
        deps: dict[dg.AssetKey, dg.AssetDep] = {}
        for dep in spec.deps:
            if dep.asset_key.path[0] != "replica":
                deps[dep.asset_key] = dep
            elif dep.asset_key in replica_keys:
                key = replica_keys[dep.asset_key]
                deps[key] = dg.AssetDep(key)
        return spec.replace_attributes(deps=list(deps.values()))

    return assets.map_asset_specs(remap)


def project_for(project_dir: Path | str = PROJECT_DIR) -> DbtProject:
    """The ``DbtProject`` with a fresh manifest (``dbt parse`` if missing or stale)."""
    project = DbtProject(project_dir=Path(project_dir), profiles_dir=Path(project_dir))
    load_manifest(Path(project_dir), os.path.join(str(project_dir), "target", "parse.duckdb"))
    return project


def dbt_resource(project_dir: Path | str = PROJECT_DIR) -> DbtCliResource:
    """The ``dbt`` resource of the project (the venv's dbt, the in-project profiles.yml)."""
    return DbtCliResource(
        project_dir=str(project_dir), profiles_dir=str(project_dir), dbt_executable=dbt_executable()
    )


def dbt_assets_for(
    project_dir: Path | str = PROJECT_DIR, name: str = "dbt_downstream"
) -> dg.AssetsDefinition:
    """The dbt models as assets; a run pins one syncpoint (run config) and builds on it.

    Needs resources ``dbt`` (``DbtCliResource`` of the same project) and ``cdc_dbt``
    (``DbtDownstreamResource``).
    """
    project = project_for(project_dir)
    manifest = json.loads(project.manifest_path.read_text(encoding="utf-8"))

    @dbt_assets(
        manifest=project.manifest_path,
        project=project,
        name=name,
        dagster_dbt_translator=CdcDbtTranslator(),
        op_tags={BUILD_TAG: "1"},
    )
    def _dbt_downstream(
        context: dg.AssetExecutionContext,
        dbt: DbtCliResource,
        cdc_dbt: DbtDownstreamResource,
        cdc: CdcResource,
        config: SyncpointBuildConfig,
    ) -> Iterator[Any]:
        res = cdc_dbt.settings(config.changefeed_id, lambda: changefeeds_of(cdc.metastore()))
        if res.is_postgres:
            yield from _build_postgres(context, dbt, res, config.syncpoint_ts, manifest)
        else:
            yield from _build_delta(context, dbt, res, config.syncpoint_ts, manifest)

    return _dbt_downstream


def _stream(
    context: dg.AssetExecutionContext,
    invocation: Any,
    meta: dict[str, dg.MetadataValue],
) -> Iterator[Any]:
    for event in invocation.stream():
        if isinstance(event, dg.Output | dg.AssetMaterialization):
            event = event.with_metadata({**event.metadata, **meta})
        yield event


def _failed(res: DbtSettings, pinned: PinnedSyncpoint) -> BuildError:
    return BuildError(
        f"dbt build on syncpoint {pinned.ts} of changefeed {res.changefeed_id!r} failed "
        f"(read {pinned.versions()}); see the dbt events of this run"
    )


def _build_delta(
    context: dg.AssetExecutionContext,
    dbt: DbtCliResource,
    res: DbtSettings,
    ts: int,
    manifest: Mapping[str, Any],
) -> Iterator[Any]:
    ts = ts or latest_syncpoint(res.delta_root, res.changefeed_id)
    with build_lock(res.duckdb_path):
        started = time.monotonic()
        pinned = pin_syncpoint(
            res.duckdb_path,
            res.delta_root,
            res.changefeed_id,
            ts,
            source_tables(manifest),
            optional=optional_sources(manifest),
        )
        context.log.info(f"building on syncpoint {ts}: Delta versions {pinned.versions()}")
        invocation = dbt.cli(
            ["build", "--vars", dbt_vars(pinned, res.duckdb_path)],
            context=context,
            raise_on_error=False,
            target_path=build_target_path(res.duckdb_path),
        )
        yield from _stream(context, invocation, build_metadata(pinned))
        ok = invocation.is_successful()
        record_build(res.duckdb_path, pinned, ok, time.monotonic() - started)
    if not ok:
        raise _failed(res, pinned)


def _build_postgres(
    context: dg.AssetExecutionContext,
    dbt: DbtCliResource,
    res: DbtSettings,
    ts: int,
    manifest: Mapping[str, Any],
) -> Iterator[Any]:

    tables = source_tables(manifest)
    with pg.build_lock(res.sink_uri) as conn:
        if not ts:
            known = pg.list_pinned_syncpoints(conn, res.changefeed_id)
            ts = known[-1] if known else 0
        started = time.monotonic()
        pinned = pg.pin(conn, res.changefeed_id, ts, tables, optional_sources(manifest))
        context.log.info(f"building on syncpoint {ts}: PostgreSQL copies {pinned.versions()}")
        pg.set_password_env(res.sink_uri)
        invocation = dbt.cli(
            ["build", *pg.dbt_args(res.sink_uri, pinned, None)],
            context=context,
            raise_on_error=False,
            target_path=pg.target_path(PROJECT_DIR, res.changefeed_id),
        )
        yield from _stream(context, invocation, build_metadata(pinned, postgres=True))
        ok = invocation.is_successful()
        pg.record_build(conn, pinned, ok, time.monotonic() - started)
    if not ok:
        raise _failed(res, pinned)


def dbt_resources() -> dict[str, Any]:
    """The dbt downstream's resources: the dbt CLI of ``dbt_downstream/`` and where builds go
    (resolved at run time: ``cdc_dagster.dbt.settings``)."""
    return {"dbt": dbt_resource(), "cdc_dbt": DbtDownstreamResource()}

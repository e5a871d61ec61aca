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

from cdc_dagster.dbt.build import (
    PROJECT_DIR,
    build_lock,
    build_target_path,
    dbt_executable,
    dbt_vars,
    load_manifest,
    record_build,
    source_tables,
)
from cdc_dagster.dbt.errors import BuildError
from cdc_dagster.dbt.pin import PinnedSyncpoint, latest_syncpoint, pin_syncpoint
from cdc_dagster.dbt.settings import DELTA_ROOT_ENV, DbtSettings, delta_root_of
from scheduler_core.ts import physical_ms

MODEL_KEY_PREFIX = "dbt"
GROUP = "dbt_downstream"
BUILD_TAG = "cdc/dbt_build"  # give it tag_concurrency_limits 1: builds share one DuckDB file


class SyncpointBuildConfig(dg.Config):
    """Which syncpoint a run builds (the sensor sets it; 0 = the newest recorded)."""

    syncpoint_ts: int = 0


class DbtDownstreamResource(dg.ConfigurableResource):
    """Where the Delta tables, their syncpoints and the DuckDB file are.

    Empty fields are read from ``CDC_DAGSTER_DBT_*`` / ``CDC_DBT_DUCKDB_PATH`` at run time
    (``cdc_dagster.dbt.settings``), so production definitions can use ``DbtDownstreamResource()``.
    """

    delta_root: str = ""
    changefeed_id: str = ""
    duckdb_path: str = ""

    def settings(self) -> DbtSettings:
        """These fields over the environment's settings; raises when no Delta root is known."""
        env = DbtSettings.from_env()
        root = delta_root_of(self.delta_root) or (env.delta_root if env else "")
        if not root:
            raise BuildError(
                f"no Delta root for the dbt build: configure the cdc_dbt resource or set "
                f"{DELTA_ROOT_ENV} to the changefeed's sink (delta:///abs/root)"
            )
        default_db = os.path.join(os.path.dirname(root.rstrip("/")), "dbt", "downstream.duckdb")
        return DbtSettings(
            delta_root=root,
            changefeed_id=self.changefeed_id or (env.changefeed_id if env else "default"),
            duckdb_path=self.duckdb_path or (env.duckdb_path if env else default_db),
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


def build_metadata(pinned: PinnedSyncpoint) -> dict[str, dg.MetadataValue]:
    """Names the syncpoint and every table version the build read (ints plot in the UI)."""
    meta: dict[str, dg.MetadataValue] = {
        "changefeed": dg.MetadataValue.text(pinned.changefeed_id),
        "syncpoint_ts": dg.MetadataValue.int(pinned.ts),
        "syncpoint_time": dg.MetadataValue.timestamp(physical_ms(pinned.ts) / 1000.0),
        "table_versions": dg.MetadataValue.json(pinned.versions()),
    }
    for name, version in pinned.versions().items():
        meta[f"delta_version/{name}"] = dg.MetadataValue.int(version)
    return meta


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
    sources = source_tables(manifest)

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
        config: SyncpointBuildConfig,
    ) -> Iterator[Any]:
        yield from _build(context, dbt, cdc_dbt, config.syncpoint_ts, sources)

    return _dbt_downstream


def _build(
    context: dg.AssetExecutionContext,
    dbt: DbtCliResource,
    resource: DbtDownstreamResource,
    ts: int,
    sources: set[tuple[str, str]],
) -> Iterator[Any]:
    res = resource.settings()
    ts = ts or latest_syncpoint(res.delta_root, res.changefeed_id)
    with build_lock(res.duckdb_path):
        started = time.monotonic()
        pinned = pin_syncpoint(res.duckdb_path, res.delta_root, res.changefeed_id, ts, sources)
        context.log.info(f"building on syncpoint {ts}: Delta versions {pinned.versions()}")
        meta = build_metadata(pinned)
        invocation = dbt.cli(
            ["build", "--vars", dbt_vars(pinned, res.duckdb_path)],
            context=context,
            raise_on_error=False,
            target_path=build_target_path(res.duckdb_path),
        )
        for event in invocation.stream():
            if isinstance(event, dg.Output | dg.AssetMaterialization):
                event = event.with_metadata({**event.metadata, **meta})
            yield event
        ok = invocation.is_successful()
        record_build(res.duckdb_path, pinned, ok, time.monotonic() - started)
    if not ok:
        raise BuildError(
            f"dbt build on syncpoint {ts} of changefeed {res.changefeed_id!r} failed "
            f"(versions {pinned.versions()}); see the dbt events of this run"
        )

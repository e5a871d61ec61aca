"""One consistent dbt build: lock the DuckDB file, pin a syncpoint, ``dbt build``, record it.

Used as is by the CLI path (``run_build``) and piece by piece by the Dagster asset
(``cdc_dagster.dbt.assets``), so both build the same way.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from cdc_dagster.dbt.errors import BuildError
from cdc_dagster.dbt.pin import META_SCHEMA, PinnedSyncpoint, latest_syncpoint, pin_syncpoint

PROJECT_DIR = Path(__file__).resolve().parents[2] / "dbt_downstream"


@dataclass(frozen=True, slots=True)
class BuildResult:
    """What one build read and how long it took."""

    pinned: PinnedSyncpoint
    pin_seconds: float
    dbt_seconds: float
    success: bool
    log_tail: str = ""

    @property
    def seconds(self) -> float:
        """Pin + dbt build, wall clock."""
        return self.pin_seconds + self.dbt_seconds


@contextlib.contextmanager
def build_lock(duckdb_path: str) -> Iterator[None]:
    """One build at a time per DuckDB file: a second build would replace the pinned views."""
    os.makedirs(os.path.dirname(os.path.abspath(duckdb_path)), exist_ok=True)
    with open(f"{duckdb_path}.build-lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_target_path(duckdb_path: str) -> Path:
    """dbt's target dir of the builds on one DuckDB file: one, reused (builds are serialised),
    so partial parsing stays warm and runs do not pile up a target dir each."""
    return Path(os.path.abspath(duckdb_path)).parent / "dbt-target"


def dbt_vars(
    pinned: PinnedSyncpoint, duckdb_path: str, extra: Mapping[str, Any] | None = None
) -> str:
    """``--vars`` of a build: the DuckDB file and the sources pinned, the same every build of
    a changefeed so dbt's partial parsing holds (models read the syncpoint ts from
    ``cdc_meta.pinned_syncpoint``, not from a var)."""
    return json.dumps(
        {**(extra or {}), "duckdb_path": duckdb_path, "pinned_sources": pinned_sources(pinned)},
        sort_keys=True,
    )


def pinned_sources(pinned: PinnedSyncpoint) -> dict[str, list[str]]:
    """database -> the tables a build pinned (models loop over optional sources with it)."""
    out: dict[str, list[str]] = {}
    for t in pinned.tables:
        out.setdefault(t.database, []).append(t.table)
    return {db: sorted(tables) for db, tables in sorted(out.items())}


def source_tables(manifest: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The (database, table) of every dbt source: the views a build pins."""
    return {(s["schema"], s["identifier"]) for s in manifest.get("sources", {}).values()}


def optional_sources(manifest: Mapping[str, Any]) -> set[tuple[str, str]]:
    """Sources flagged ``cdc_optional`` in their meta: a syncpoint may lack them."""
    out = set()
    for s in manifest.get("sources", {}).values():
        meta = s.get("config", {}).get("meta") or s.get("meta") or {}
        if meta.get("cdc_optional"):
            out.add((s["schema"], s["identifier"]))
    return out


def record_build(duckdb_path: str, pinned: PinnedSyncpoint, success: bool, seconds: float) -> None:
    """Append the build to ``cdc_meta.syncpoint_builds`` (ts, versions, outcome, duration)."""
    with duckdb.connect(duckdb_path) as con:
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {META_SCHEMA}")
        con.execute(
            f"CREATE TABLE IF NOT EXISTS {META_SCHEMA}.syncpoint_builds (changefeed VARCHAR, "
            "syncpoint_ts BIGINT, table_versions VARCHAR, success BOOLEAN, seconds DOUBLE, "
            "built_at TIMESTAMPTZ)"
        )
        con.execute(
            f"INSERT INTO {META_SCHEMA}.syncpoint_builds VALUES (?, ?, ?, ?, ?, ?)",
            [
                pinned.changefeed_id,
                pinned.ts,
                json.dumps(pinned.versions(), ensure_ascii=False, sort_keys=True),
                success,
                seconds,
                dt.datetime.now(dt.UTC),
            ],
        )


def dbt_executable() -> str:
    """The ``dbt`` beside this interpreter (the venv's), else the one on PATH."""
    here = Path(sys.executable).parent / "dbt"
    return str(here) if here.exists() else "dbt"


def run_dbt(
    project_dir: Path, args: list[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            dbt_executable(),
            *args,
            "--project-dir",
            str(project_dir),
            "--profiles-dir",
            str(project_dir),
        ],
        cwd=project_dir,
        capture_output=True,
        text=True,
        env={**os.environ, "DBT_SEND_ANONYMOUS_USAGE_STATS": "false", **(env or {})},
        check=False,
    )


def _project_mtime(project_dir: Path) -> float:
    """The newest modification time of the files that make the manifest."""
    files = [project_dir / "dbt_project.yml", project_dir / "profiles.yml"]
    for sub in ("models", "tests", "macros", "seeds", "snapshots"):
        files += [p for p in (project_dir / sub).rglob("*") if p.is_file()]
    return max((p.stat().st_mtime for p in files if p.exists()), default=0.0)


def load_manifest(project_dir: Path, duckdb_path: str) -> dict[str, Any]:
    """The project's manifest: ``dbt parse`` when it is missing or older than the project.

    Processes that load it at once (the code server, run workers, two builds) parse one at
    a time, each into a directory of its own whose manifest then replaces the project's
    whole: dbt writes its target files in place, and a process reading the manifest while
    another parse rewrote it read half a file."""
    path = project_dir / "target" / "manifest.json"

    def stale() -> bool:
        return not path.exists() or path.stat().st_mtime < _project_mtime(project_dir)

    if stale():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / ".parse-lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if stale():  # (not if another process parsed while this one waited)
                    _parse_into(project_dir, path, duckdb_path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    return json.loads(path.read_text(encoding="utf-8"))


def _parse_into(project_dir: Path, manifest: Path, duckdb_path: str) -> None:
    """``dbt parse`` into a directory of its own; its manifest replaces ``manifest``."""
    out = Path(tempfile.mkdtemp(prefix="parse-", dir=manifest.parent))
    try:
        proc = run_dbt(project_dir, ["parse", "--vars", json.dumps({"duckdb_path": duckdb_path})],
                       env={"DBT_TARGET_PATH": str(out)})  # fmt: skip
        if proc.returncode != 0:
            raise BuildError(
                f"dbt parse failed in {project_dir}; fix the project:\n{proc.stdout[-3000:]}"
            )
        os.replace(out / "manifest.json", manifest)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run_build(
    delta_root: str,
    changefeed_id: str,
    duckdb_path: str,
    ts: int | None = None,
    project_dir: Path = PROJECT_DIR,
    extra_vars: Mapping[str, Any] | None = None,
    after_pin: Callable[[PinnedSyncpoint], None] | None = None,
) -> BuildResult:
    """Pin syncpoint ``ts`` (latest if None) and ``dbt build`` on it; raise if dbt fails.

    ``after_pin(pinned)`` runs between pinning and building (tests write new Delta
    versions there to prove the build does not see them).
    """
    ts = latest_syncpoint(delta_root, changefeed_id) if ts is None else ts
    manifest = load_manifest(project_dir, duckdb_path)
    with build_lock(duckdb_path):
        t0 = time.monotonic()
        pinned = pin_syncpoint(
            duckdb_path,
            delta_root,
            changefeed_id,
            ts,
            source_tables(manifest),
            optional=optional_sources(manifest),
        )
        t1 = time.monotonic()
        if after_pin is not None:
            after_pin(pinned)
        t2 = time.monotonic()
        proc = run_dbt(
            project_dir,
            ["build", "--vars", dbt_vars(pinned, duckdb_path, extra_vars)],
            {"DBT_TARGET_PATH": str(build_target_path(duckdb_path))},
        )
        t3 = time.monotonic()
        result = BuildResult(pinned, t1 - t0, t3 - t2, proc.returncode == 0, proc.stdout[-4000:])
        record_build(duckdb_path, pinned, result.success, result.seconds)
    if not result.success:
        raise BuildError(
            f"dbt build on syncpoint {ts} of changefeed {changefeed_id!r} failed "
            f"(versions {pinned.versions()}):\n{result.log_tail}"
        )
    return result

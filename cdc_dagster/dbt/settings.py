"""Where a deployment's dbt downstream reads and writes, from ``CDC_DAGSTER_DBT_*`` when asked.

Nothing reads the environment at import time: the sensor asks at tick time, the resource
at run time, so the definitions module can build both before the changefeed exists.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DELTA_ROOT_ENV = "CDC_DAGSTER_DBT_DELTA_ROOT"  # /abs/root or delta:///abs/root (the sink URI)
CHANGEFEED_ENV = "CDC_DAGSTER_DBT_CHANGEFEED"
DUCKDB_PATH_ENV = "CDC_DBT_DUCKDB_PATH"


@dataclass(frozen=True, slots=True)
class DbtSettings:
    """The changefeed whose syncpoints the models build on, its Delta root, the DuckDB file."""

    delta_root: str
    changefeed_id: str
    duckdb_path: str

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> DbtSettings | None:
        """The settings from the environment; None when no Delta root is configured."""
        env = os.environ if environ is None else environ
        root = env.get(DELTA_ROOT_ENV, "").strip()
        if not root:
            return None
        root = delta_root_of(root)
        default_db = os.path.join(os.path.dirname(root.rstrip("/")), "dbt", "downstream.duckdb")
        return DbtSettings(
            delta_root=root,
            changefeed_id=env.get(CHANGEFEED_ENV, "").strip() or "default",
            duckdb_path=env.get(DUCKDB_PATH_ENV, "").strip() or default_db,
        )


def delta_root_of(uri_or_path: str) -> str:
    """``delta:///abs/root`` or ``/abs/root`` -> ``/abs/root``."""
    return uri_or_path[len("delta://") :] if uri_or_path.startswith("delta://") else uri_or_path

"""Fixtures: a replicated Delta downstream (real DeltaSink) and a DuckDB file, in /tmp/h-dbt."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from tests.integration.dbt_build.replica import Replica

BASE = os.environ.get("CDC_DBT_TEST_TMP", "/tmp/h-dbt")


@pytest.fixture()
def workdir() -> Iterator[str]:
    os.makedirs(BASE, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BASE) as d:
        yield d


@pytest.fixture()
def replica(workdir: str) -> Replica:
    return Replica(os.path.join(workdir, "delta ü"))  # a space and unicode in the root


@pytest.fixture()
def duckdb_path(workdir: str) -> str:
    return os.path.join(workdir, "dbt", "downstream.duckdb")

"""One local Spark session for the whole test session (a new one costs 6-8 s)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from changelog_v1 import Writer, changelog_reader


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from cdc_dagster.pipeline.engine import spark_session

    session = spark_session(
        os.environ.get("CDC_SPARK_MASTER", "local[2]"),
        conf={"spark.sql.shuffle.partitions": "2"},
    )
    yield session


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "log"


@pytest.fixture
def writer(log_dir: Path) -> Writer:
    return Writer(log_dir)


@pytest.fixture
def reader(writer: Writer, log_dir: Path) -> Any:
    return changelog_reader(log_dir)

"""A code location for the browser test: the test Definitions over $CDC_DBT_TEST_DELTA_ROOT."""

from __future__ import annotations

import os

import dagster as dg

from tests.integration.dbt.test_definitions import build_defs


@dg.definitions
def defs() -> dg.Definitions:
    root = os.environ["CDC_DBT_TEST_DELTA_ROOT"]
    return build_defs(root, os.path.join(os.path.dirname(root), "dbt", "downstream.duckdb"))

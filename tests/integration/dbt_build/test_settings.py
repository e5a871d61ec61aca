"""Which changefeed the dbt downstream builds on: fields, environment, else etcd (pure)."""

from __future__ import annotations

import pytest

from cdc_dagster.dbt.settings import NoTargetError, resolve_settings
from cdc_dagster.defs.dbt.sensor import parse_cursor

DEMO = {"demo": ("delta:///state/lake", 30), "other": ("delta:///x", 0)}


def lookup(found):
    def _lookup():
        return found

    return _lookup


def test_the_only_changefeed_with_syncpoints_is_found_in_etcd() -> None:
    s = resolve_settings(environ={}, lookup=lookup(DEMO))
    assert (s.changefeed_id, s.delta_root, s.is_postgres) == ("demo", "/state/lake", False)
    assert s.duckdb_path == "/state/dbt/downstream.duckdb"


def test_a_postgres_sink_builds_in_its_database() -> None:
    uri = "postgresql://etl:${PG_PW}@db:5432/wh"
    s = resolve_settings(environ={}, lookup=lookup({"pg": (uri, 10)}))
    assert (s.changefeed_id, s.sink_uri, s.is_postgres, s.delta_root) == ("pg", uri, True, "")


def test_several_changefeeds_with_syncpoints_need_a_choice() -> None:
    both = {**DEMO, "b": ("delta:///b", 5)}
    with pytest.raises(NoTargetError, match="CDC_DAGSTER_DBT_CHANGEFEED"):
        resolve_settings(environ={}, lookup=lookup(both))
    s = resolve_settings(environ={"CDC_DAGSTER_DBT_CHANGEFEED": "b"}, lookup=lookup(both))
    assert (s.changefeed_id, s.delta_root) == ("b", "/b")
    with pytest.raises(NoTargetError, match="names no changefeed"):
        resolve_settings(environ={"CDC_DAGSTER_DBT_CHANGEFEED": "zz"}, lookup=lookup(both))


def test_the_environment_and_fields_override_etcd() -> None:
    def no_etcd():
        raise AssertionError("etcd must not be asked")

    env = {"CDC_DAGSTER_DBT_DELTA_ROOT": "delta:///a%20b/lake", "CDC_DAGSTER_DBT_CHANGEFEED": "c"}
    s = resolve_settings(environ=env, lookup=no_etcd)
    assert (s.delta_root, s.changefeed_id) == ("/a b/lake", "c")
    s = resolve_settings("/f", "g", "/d.duckdb", environ=env, lookup=no_etcd)
    assert (s.delta_root, s.changefeed_id, s.duckdb_path) == ("/f", "g", "/d.duckdb")


def test_the_sensor_cursor_restarts_for_a_new_changefeed() -> None:
    assert parse_cursor(None, "demo") == 0
    assert parse_cursor("demo:123", "demo") == 123
    assert parse_cursor("old:123", "demo") == 0

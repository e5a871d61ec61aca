"""Identifiers become safe, reversible path components; weird names round trip through Delta."""

from __future__ import annotations

import os

import pytest
from conftest import CF, batch
from deltalake import DeltaTable

from cdc_dagster.schema import ColumnSchema, TableSchema
from cdc_dagster.sinks.delta import read_table_at
from cdc_dagster.sinks.delta_paths import decode_component, encode_component

WEIRD = [
    'q"uote',
    "back`tick",
    "semi;colon; DROP TABLE x;--",
    "spa ce",
    "ünïcödé ☃ 表",
    "sl/ash",
    "..",
    ".",
    ".hidden",
    "_cdc_dagster",
    "_delta_log",
    "pct%2F",
    "tilde~7E",
    "br[a]{c}",
    "nl\nx",
    "ap'os",
    "a\\b",
]


@pytest.mark.parametrize("name", WEIRD)
def test_component_is_safe_and_reversible(name):
    comp = encode_component(name)
    assert decode_component(comp) == name
    assert set(comp) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
    assert comp not in (".", "..") and not comp.startswith((".", "_"))


def test_plain_names_stay_readable():
    assert encode_component("accounts_0") == "accounts_0"
    assert encode_component("a b") == "a~20b"


def test_long_names_are_hashed_and_distinct():
    a, b = "表" * 100 + "a", "表" * 100 + "b"
    assert len(encode_component(a).encode()) <= 200
    assert encode_component(a) != encode_component(b)


def test_weird_identifiers_round_trip_through_delta(sink):
    cols = tuple(ColumnSchema(i + 2, n, "string") for i, n in enumerate(WEIRD))
    t = TableSchema(
        3, 'd"b`; x', "t ☃/..;", (ColumnSchema(1, 'k`ey"', "int64", False), *cols), (1,)
    )
    token = sink.acquire(CF, t)
    row = {'k`ey"': 1, **{n: f"v-{n}" for n in WEIRD}}
    sink.write(CF, t, batch(t, [row, {'k`ey"': 2, WEIRD[0]: "x"}]), 0, 10, token)
    sink.write(CF, t, batch(t, [{'k`ey"': 2, "op": "d"}]), 10, 20, token)
    got = read_table_at(sink.root, t).to_pylist()
    assert got == [row]
    # the table is where the docs say, inside the root, and nothing else was created but
    # the sink's own directory (its vacuum clock for the table, under the same encoding)
    assert sink.path(t) == os.path.join(sink.root, "d~22b~60~3B~20x", "t~20~E2~98~83~2F..~3B")
    assert sorted(os.listdir(sink.root)) == ["_cdc_dagster", "d~22b~60~3B~20x"]
    meta = os.path.join(sink.root, "_cdc_dagster")
    assert [(os.path.relpath(d, meta), f) for d, _, fs in os.walk(meta) for f in fs] == [
        (os.path.join("vacuum", "d~22b~60~3B~20x"), "t~20~E2~98~83~2F..~3B")
    ]
    assert DeltaTable(sink.path(t)).metadata().name == t.qualified_name

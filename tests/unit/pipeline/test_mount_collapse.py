"""Mount and collapse, the per-table steps of a Spark task, on plain Arrow tables."""

from __future__ import annotations

import sys
from decimal import Decimal as D
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_dagster.pipeline import spark_tasks
from cdc_dagster.pipeline.job import balance

sys.path.insert(0, str(Path(__file__).parents[2] / "integration" / "pipeline"))
from helpers import DELETE, INSERT, UPDATE, accounts, rows

S = accounts(1)


def test_mount_names_columns_and_keys_deletes_by_before_image() -> None:
    data = rows(
        S,
        [
            (20, 0, INSERT, {"id": 1, "owner": "a", "balance": D("1.00")}, None),
            (30, 0, DELETE, None, {"id": 1}),
        ],
    )
    out = spark_tasks.mount(S, data)
    assert out.column_names == ["id", "owner", "balance", "_cdc_op", "_cdc_commit_ts", "_cdc_seq"]
    assert out.column("id").to_pylist() == [1, 1]
    assert out.column("_cdc_op").to_pylist() == [spark_tasks.OP_UPSERT, spark_tasks.OP_DELETE]


def test_mount_splits_a_key_change_into_delete_old_then_upsert_new() -> None:
    data = rows(S, [(30, 0, UPDATE, {"id": 3, "owner": "b", "balance": D("3.00")}, {"id": 2})])
    out = spark_tasks.mount(S, data).to_pylist()
    assert [(r["id"], r["_cdc_op"]) for r in out] == [(2, 1), (3, 0)]
    assert out[0]["_cdc_seq"] < out[1]["_cdc_seq"]


def test_collapse_keeps_the_last_change_per_key_within_the_range() -> None:
    data = rows(
        S,
        [
            (20, 0, INSERT, {"id": 1, "owner": "a", "balance": D("1.00")}, None),
            (20, 1, INSERT, {"id": 2, "owner": "b", "balance": D("2.00")}, None),
            (30, 0, UPDATE, {"id": 1, "owner": "a2", "balance": D("1.50")}, None),
            (40, 0, UPDATE, {"id": 4, "owner": "b", "balance": D("2.00")}, {"id": 2}),
            (50, 0, DELETE, None, {"id": 1}),
        ],
    )
    staged = spark_tasks.mount(S, data)
    batch = spark_tasks.collapse(S, staged, 10, 40).to_pylist()
    got = {r["id"]: (r["owner"], r["_cdc_op"], r["_cdc_commit_ts"]) for r in batch}
    assert got == {1: ("a2", 0, 30), 2: (None, 1, 40), 4: ("b", 0, 40)}
    assert (
        spark_tasks.collapse(S, staged, 40, 50).to_pylist()[0]["_cdc_op"] == spark_tasks.OP_DELETE
    )


def test_a_null_in_a_not_null_column_is_bad_input_naming_the_file(tmp_path: Path) -> None:
    data = rows(S, [(20, 0, INSERT, {"id": 1, "owner": "a", "balance": None}, None)])
    with pytest.raises(spark_tasks.BadInputError, match=r"f\.parquet.*'balance'.*rewrite"):
        spark_tasks._fit(S, data, "f.parquet", "table bank.accounts_1 (id 1)")


def test_a_column_of_another_type_is_bad_input(tmp_path: Path) -> None:
    data = rows(S, [(20, 0, INSERT, {"id": 1, "owner": "a", "balance": D("1")}, None)])
    data = data.set_column(4, "c2", pa.array([b"\xff"], pa.binary()))
    with pytest.raises(spark_tasks.BadInputError, match="c2"):
        spark_tasks._fit(S, data, "f.parquet", "table bank.accounts_1 (id 1)")


def test_balance_spreads_the_biggest_tables_over_slots() -> None:
    specs = [{"table_id": i, "weight": w} for i, w in enumerate([10, 1, 9, 1, 1])]
    slots = balance(specs, 2)
    loads = sorted(sum(s["weight"] for s in slot) for slot in slots)
    assert loads == [11, 11]


def test_a_phase_runs_in_process_only_when_small_in_bytes_and_in_rows() -> None:
    from cdc_dagster.pipeline.job import local

    specs = [{"weight": 4 << 20, "rows": 300_000}, {"weight": 4 << 20, "rows": 1}]
    assert local(specs, 16 << 20, 0)  # no row limit: bytes decide
    assert not local(specs, 16 << 20, 250_000)  # a million-row slice of small rows
    assert local(specs, 16 << 20, 300_001)
    assert not local(specs, 7 << 20, 10**9)  # too many bytes, whatever the rows
    assert local([{"weight": 1}], 16 << 20, 5)  # a spec without rows counts none

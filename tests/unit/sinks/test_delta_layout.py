"""The Delta sink's key-range writes (``delta_layout``): a batch rewrites only the files its
keys fall in, files stay clustered by key, any table layout heals (real deltalake)."""

from __future__ import annotations

import json
import os
import random
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import CF, accounts, batch
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from deltalake.transaction import AddAction

import cdc_dagster.sinks.delta_layout as layout
from cdc_dagster.sinks.delta import delta_schema, read_table_at


@pytest.fixture
def small_files(monkeypatch):
    """Files of ~40 rows (the accounts rows are ~30 bytes each in Parquet)."""
    monkeypatch.setattr(layout, "MIN_FILE_ROWS", 40)
    monkeypatch.setattr(layout, "TARGET_FILE_BYTES", 1)  # the minimum rows decide


def files_of(sink, t) -> list[layout.DataFile]:
    return layout.data_files(DeltaTable(sink.path(t)), "id")


def content(sink, t) -> dict:
    rows = read_table_at(sink.root, t).to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "a key is in the table twice"
    return {r["id"]: (r["balance"], r["note"]) for r in rows}


def last_commit(sink, t) -> dict:
    return DeltaTable(sink.path(t)).history(1)[0]


def upserts(ids, note="x") -> list[dict]:
    return [{"id": i, "balance": Decimal(i % 1000), "note": f"{note}{i}"} for i in ids]


def test_random_batches_keep_the_table_equal_to_its_model_and_clustered(sink, small_files):
    t = accounts()
    token = sink.acquire(CF, t)
    rng = random.Random(20)
    model: dict = {}
    ts = 0
    splits = heals = before = 0
    for n in range(40):
        if n == 20:  # an unclustered file lands (an older writer, a DDL's rewrite)
            olds = range(1, 600, 7)
            dt = DeltaTable(sink.path(t))
            dt.delete("id % 7 = 1")  # its keys out first: the table stays one row per key
            extra = batch(t, upserts(olds, "old")).drop_columns(["_cdc_op", "_cdc_commit_ts"])
            write_deltalake(sink.path(t), extra.cast(delta_schema(t)), mode="append")
            model.update(
                {k: (Decimal(k % 1000).quantize(Decimal("0.01")), f"old{k}") for k in olds}
            )
            assert not layout.clustered(files_of(sink, t))
            heals += 1
        rows = []
        for k in rng.sample(range(1, 600), rng.choice([1, 5, 30, 120])):
            if rng.random() < 0.3:
                rows.append({"id": k, "op": "d"})
                model.pop(k, None)
            else:
                rows.append({"id": k, "balance": Decimal(n), "note": f"n{n}"})
                model[k] = (Decimal(n).quantize(Decimal("0.01")), f"n{n}")
        ts += 10
        assert sink.write(CF, t, batch(t, rows), ts - 10, ts, token) == ts
        files = files_of(sink, t)
        assert layout.clustered(files), files
        assert content(sink, t) == model
        assert all(f.rows <= 2 * 40 + 120 for f in files)
        splits += len(files) > before
        before = len(files)
    assert splits and heals
    assert len(files) >= len(model) // 80


def test_an_update_rewrites_only_the_file_holding_its_key(sink, small_files):
    t = accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, upserts(range(1, 401))), 0, 10, token)
    files = files_of(sink, t)
    assert len(files) >= 5 and layout.clustered(files)
    holder = next(f for f in files if f.lo <= 250 <= f.hi)
    sink.write(CF, t, batch(t, upserts([250], "new")), 10, 20, token)
    after = {f.path for f in files_of(sink, t)}
    assert after - {f.path for f in files} and len(after - {f.path for f in files}) == 1
    assert {f.path for f in files} - after == {holder.path}
    assert (last_commit(sink, t)["filesRemoved"], last_commit(sink, t)["filesAdded"]) == (1, 1)
    assert content(sink, t)[250] == (Decimal("250.00"), "new250")


def test_inserts_above_every_key_grow_a_tail_file_then_start_a_new_one(sink, small_files):
    t = accounts()
    token = sink.acquire(CF, t)
    ts = 0
    for start in range(1, 401, 10):  # an insert-only table: ten new keys per batch
        ts += 10
        sink.write(CF, t, batch(t, upserts(range(start, start + 10))), ts - 10, ts, token)
        files = files_of(sink, t)
        assert layout.clustered(files)
        assert all(f.rows <= 40 + 10 for f in files)
    assert 400 // 50 <= len(files) <= 400 // 40 + 1  # not a file per batch
    assert len(content(sink, t)) == 400


def test_deletes_of_keys_no_file_holds_rewrite_nothing(sink, small_files):
    t = accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, upserts(range(0, 200, 2))), 0, 10, token)
    files = {f.path for f in files_of(sink, t)}
    sink.write(CF, t, batch(t, [{"id": k, "op": "d"} for k in (1, 51, 99, 1001)]), 10, 20, token)
    assert {f.path for f in files_of(sink, t)} == files
    assert sink.committed(CF, t).committed_ts == 20


def test_a_table_without_key_stats_is_rewritten_whole_and_clustered(sink, small_files):
    t = accounts()
    token = sink.acquire(CF, t)
    rows = batch(t, upserts(range(1, 101))).drop_columns(["_cdc_op", "_cdc_commit_ts"])
    pq.write_table(rows.cast(delta_schema(t)), os.path.join(sink.path(t), "nostats.parquet"))
    size = os.path.getsize(os.path.join(sink.path(t), "nostats.parquet"))
    dt = DeltaTable(sink.path(t))
    dt.create_write_transaction(  # a writer that wrote no stats (they are optional in Delta)
        [AddAction("nostats.parquet", size, {}, 0, True, json.dumps({"numRecords": 100}))],
        "append",
        dt.schema(),
    )
    files = files_of(sink, t)
    assert files and files[0].lo is None and not layout.clustered(files)
    sink.write(CF, t, batch(t, upserts([5], "new")), 0, 10, token)
    after = files_of(sink, t)
    assert layout.clustered(after) and len(after) >= 2
    assert "nostats.parquet" not in {f.path for f in after}
    assert len(content(sink, t)) == 100 and content(sink, t)[5][1] == "new5"


def test_a_failed_commit_leaves_no_file_behind(sink, small_files, monkeypatch):
    t = accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, upserts(range(1, 101))), 0, 10, token)
    before = set(os.listdir(sink.path(t)))

    def refuse(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", refuse)
    with pytest.raises(OSError, match="disk full"):
        sink.write(CF, t, batch(t, upserts(range(50, 150), "new")), 10, 20, token)
    assert set(os.listdir(sink.path(t))) == before
    assert sink.committed(CF, t).committed_ts == 10


def test_delta_rs_prunes_files_by_the_stats_it_writes(sink, small_files):
    t = accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, upserts(range(1, 401))), 0, 10, token)
    dt = DeltaTable(sink.path(t))
    qb = QueryBuilder().register("t", dt)
    got = pa.table(qb.execute("SELECT count(*) AS n, max(note) AS note FROM t WHERE id = 250"))
    assert got.to_pylist() == [{"n": 1, "note": "x250"}]
    assert dt.get_add_actions(flatten=True).num_rows == len(files_of(sink, t))


def test_upserts_in_a_gap_between_full_files_get_a_file_of_their_own(sink, small_files):
    t = accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, upserts(range(1, 81))), 0, 10, token)  # full files
    sink.write(CF, t, batch(t, upserts(range(1001, 1081))), 10, 20, token)
    files = {f.path for f in files_of(sink, t)}
    assert len(files) == 2 and all(f.rows >= 40 for f in files_of(sink, t))
    sink.write(CF, t, batch(t, upserts([500, 505, 510])), 20, 30, token)  # a snapshot's chunk
    after = files_of(sink, t)
    assert files < {f.path for f in after}  # nothing rewritten: one file added
    new = [f for f in after if f.path not in files]
    assert [(f.lo, f.hi, f.rows) for f in new] == [(500, 510, 3)]
    assert (last_commit(sink, t)["filesRemoved"], last_commit(sink, t)["filesAdded"]) == (0, 1)


def test_chunks_arriving_in_any_order_leave_a_clustered_table(sink, small_files):
    t = accounts()
    token = sink.acquire(CF, t)
    chunks = [range(s, s + 25) for s in range(1, 1001, 25)]
    random.Random(7).shuffle(chunks)
    ts = 0
    for first in range(0, len(chunks), 3):  # a slice of three chunks per batch
        ts += 10
        keys = [k for c in chunks[first : first + 3] for k in c]
        sink.write(CF, t, batch(t, upserts(keys)), ts - 10, ts, token)
        assert layout.clustered(files_of(sink, t))
    assert sorted(content(sink, t)) == list(range(1, 1001))
    assert all(f.rows <= 3 * 40 for f in files_of(sink, t))

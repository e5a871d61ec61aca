"""DeltaSink.write: primary-key MERGE, replay, gaps, fencing, bad batches (real deltalake)."""

from __future__ import annotations

import pickle
from decimal import Decimal

import pyarrow as pa
import pytest
from conftest import CF, accounts, batch
from deltalake import DeltaTable

from cdc_dagster.sinks.base import (
    Committed,
    FencedError,
    SinkError,
    SinkGapError,
    SinkSchemaError,
)
from cdc_dagster.sinks.delta import DeltaSink, app_id, read_table_at
from cdc_dagster.sinks.uri import open_sink


def rows_of(sink: DeltaSink, table, version=None) -> dict:
    t = read_table_at(sink.root, table, version)
    return {r["id"]: (r["balance"], r["note"]) for r in t.to_pylist()}


def test_never_written_table_is_committed_zero_token_zero(sink):
    assert sink.committed(CF, accounts()) == Committed(0, 0)


def test_acquire_creates_the_table_and_each_acquire_raises_the_token(sink):
    t = accounts()
    assert sink.acquire(CF, t) == 1
    assert sink.acquire(CF, t) == 2
    assert sink.committed(CF, t) == Committed(0, 2)
    assert read_table_at(sink.root, t).num_rows == 0
    assert read_table_at(sink.root, t).schema.names == ["id", "balance", "note"]


def test_upsert_update_delete_round_trip(sink):
    t = accounts()
    token = sink.acquire(CF, t)
    b1 = batch(
        t,
        [
            {"id": 1, "balance": Decimal("1.00"), "note": "a"},
            {"id": 2, "balance": Decimal("2.00"), "note": None},
            {"id": 3, "balance": Decimal("3.00"), "note": "c"},
        ],
    )
    assert sink.write(CF, t, b1, 0, 10, token) == 10
    b2 = batch(
        t,
        [
            {"id": 1, "balance": Decimal("1.50"), "note": "a2"},
            {"id": 2, "op": "d"},
            {"id": 4, "balance": Decimal("4.00"), "note": "ü☃"},
            {"id": 99, "op": "d"},
        ],
    )
    assert sink.write(CF, t, b2, 10, 20, token) == 20
    assert rows_of(sink, t) == {
        1: (Decimal("1.50"), "a2"),
        3: (Decimal("3.00"), "c"),
        4: (Decimal("4.00"), "ü☃"),
    }
    assert sink.committed(CF, t) == Committed(20, token)
    # the commit that carries the data also carries checkpoint and fence
    dt = DeltaTable(sink.path(t))
    assert dt.transaction_version(app_id(CF, "checkpoint")) == 20
    assert dt.history(1)[0]["operation"] == "WRITE"  # an integer key: by key range
    assert dt.history(1)[0]["cdcDagsterWrite"] == "key range"


def test_replayed_batch_is_a_no_op(sink):
    t = accounts()
    token = sink.acquire(CF, t)
    b = batch(t, [{"id": 1, "balance": Decimal("1.00")}])
    sink.write(CF, t, b, 0, 10, token)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("5.00")}]), 10, 20, token)
    version = DeltaTable(sink.path(t)).version()
    assert sink.write(CF, t, b, 0, 10, token) == 20  # old batch replayed after a crash
    assert sink.write(CF, t, b, 10, 20, token) == 20
    assert DeltaTable(sink.path(t)).version() == version
    assert rows_of(sink, t) == {1: (Decimal("5.00"), None)}


def test_batch_starting_above_committed_is_a_gap(sink):
    t = accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("1")}]), 0, 10, token)
    with pytest.raises(SinkGapError, match=r"\(15, 20\].*committed ts 10"):
        sink.write(CF, t, batch(t, [{"id": 2, "balance": Decimal("2")}]), 15, 20, token)
    assert sink.committed(CF, t) == Committed(10, token)


def test_first_batch_of_a_never_written_table_may_start_anywhere(sink):
    t = accounts()
    token = sink.acquire(CF, t)
    assert sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("1")}]), 50, 60, token) == 60


def test_a_root_gone_is_the_sinks_outage_not_a_fence_and_heals_when_it_is_back(sink):
    """The root replaced by a file (a lost mount): the write and a new acquire say the root
    is not a directory (retried, the table kept) instead of refusing as fenced (which
    would stop the table); with the root back the same write goes in."""
    import os

    t = accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("1")}]), 0, 10, token)
    aside = sink.root + ".aside"
    os.rename(sink.root, aside)
    with open(sink.root, "w") as f:
        f.write("not a directory")
    b = batch(t, [{"id": 2, "balance": Decimal("2")}])
    for call in (lambda: sink.write(CF, t, b, 10, 20, token), lambda: sink.acquire(CF, t)):
        with pytest.raises(SinkError, match=r"root .* is a file, not a directory") as caught:
            call()
        assert not isinstance(caught.value, FencedError)
    os.remove(sink.root)
    with pytest.raises(SinkError, match=r"root .* is missing, not a directory"):
        sink.write(CF, t, b, 10, 20, token)
    os.rename(aside, sink.root)
    assert sink.write(CF, t, b, 10, 20, token) == 20
    assert set(rows_of(sink, t)) == {1, 2}


def test_stale_token_is_refused_and_changes_nothing(sink):
    t = accounts()
    old = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("1")}]), 0, 10, old)
    new = sink.acquire(CF, t)
    version = DeltaTable(sink.path(t)).version()
    with pytest.raises(FencedError, match=f"token {old} refused, the table's token is {new}"):
        sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("9")}]), 10, 20, old)
    with pytest.raises(FencedError):  # even a replay from a stale writer is refused
        sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("1")}]), 0, 10, old)
    assert DeltaTable(sink.path(t)).version() == version
    assert sink.committed(CF, t) == Committed(10, new)
    assert sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("9")}]), 10, 20, new) == 20


def test_write_to_a_missing_table_is_fenced(sink):
    """A table missing in a root that is there (dropped, or never acquired): fenced. (A
    root that is not there is the sink's outage: the test above.)"""
    import os

    os.makedirs(sink.root, exist_ok=True)
    t = accounts()
    with pytest.raises(FencedError, match="no Delta table"):
        sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal("1")}]), 0, 10, 1)


def test_changefeeds_keep_separate_checkpoints_and_tokens(sink):
    t = accounts()
    a = sink.acquire("cf-a", t)
    sink.acquire("cf-b", t)
    b = sink.acquire("cf-b", t)
    sink.write("cf-a", t, batch(t, [{"id": 1, "balance": Decimal("1")}]), 0, 10, a)
    assert sink.committed("cf-a", t) == Committed(10, 1)
    assert sink.committed("cf-b", t) == Committed(0, b)


def test_empty_batch_advances_the_committed_ts(sink):
    t = accounts()
    token = sink.acquire(CF, t)
    assert sink.write(CF, t, batch(t, []), 0, 10, token) == 10
    assert sink.committed(CF, t) == Committed(10, token)


def test_missing_column_is_a_schema_error_naming_table_and_column(sink):
    t = accounts()
    token = sink.acquire(CF, t)
    b = batch(t, [{"id": 1, "balance": Decimal("1")}]).drop_columns(["note"])
    with pytest.raises(SinkSchemaError, match=r"bank\.accounts \(id 7\).*missing \['note'\]"):
        sink.write(CF, t, b, 0, 10, token)
    assert sink.committed(CF, t) == Committed(0, token)


def test_value_that_does_not_fit_the_column_type_is_a_schema_error(sink):
    t = accounts()
    token = sink.acquire(CF, t)
    b = batch(t, [{"id": 1, "balance": Decimal("1")}])
    b = b.set_column(1, "balance", pa.array(["not a number"]))
    with pytest.raises(SinkSchemaError, match="column 'balance'"):
        sink.write(CF, t, b, 0, 10, token)


def test_batch_for_a_schema_the_delta_table_does_not_have_is_a_schema_error(sink):
    t = accounts()
    token = sink.acquire(CF, t)
    from cdc_dagster.schema import ColumnSchema

    wider = accounts(extra=(ColumnSchema(4, "added", "int32"),))
    with pytest.raises(SinkSchemaError, match=r"column .added.*DDL not applied"):
        sink.write(CF, wider, batch(wider, [{"id": 1, "balance": Decimal("1")}]), 0, 10, token)


def test_uncollapsed_batch_and_null_key_are_refused(sink):
    t = accounts()
    token = sink.acquire(CF, t)
    dup = batch(t, [{"id": 1, "balance": Decimal("1")}, {"id": 1, "balance": Decimal("2")}])
    with pytest.raises(SinkSchemaError, match="more than once"):
        sink.write(CF, t, dup, 0, 10, token)
    null_key = batch(t, [{"id": None, "balance": Decimal("1")}])
    with pytest.raises(SinkSchemaError, match="primary-key column 'id' is null"):
        sink.write(CF, t, null_key, 0, 10, token)


def test_sink_pickles_and_comes_from_its_uri(sink):
    assert pickle.loads(pickle.dumps(sink)) == sink
    assert open_sink(sink.uri) == sink
    assert open_sink("delta:///tmp/x%20y") == DeltaSink("/tmp/x y")


def _codecs(sink: DeltaSink, table) -> set[str]:
    import pyarrow.parquet as pq

    from cdc_dagster.sinks.delta import local_path

    files = DeltaTable(sink.path(table)).file_uris()
    assert files
    return {
        pq.ParquetFile(local_path(f)).metadata.row_group(0).column(i).compression
        for f in files
        for i in range(len(table.columns))
    }


@pytest.mark.parametrize(
    ("uri_query", "codec"),
    [
        ("", "ZSTD"),
        ("?compression=snappy", "SNAPPY"),
        ("?compression=uncompressed", "UNCOMPRESSED"),
    ],
)
def test_files_are_written_with_the_uris_compression(tmp_path, uri_query, codec):
    sink = open_sink(f"delta://{tmp_path}/lake{uri_query}")
    assert open_sink(sink.uri) == sink
    assert pickle.loads(pickle.dumps(sink)) == sink
    t = accounts()
    token = sink.acquire(CF, t)
    rows = [{"id": i, "balance": Decimal(i), "note": f"n{i}"} for i in range(100)]
    sink.write(CF, t, batch(t, rows), 0, 10, token)
    assert _codecs(sink, t) == {codec}
    sink.write(CF, t, batch(t, [{"id": 1, "op": "d"}, {"id": 500, "note": "x"}]), 10, 20, token)
    assert _codecs(sink, t) == {codec}  # the MERGE's rewrite too
    assert len(rows_of(sink, t)) == 100


def test_an_unknown_compression_is_refused(tmp_path):
    with pytest.raises(SinkError, match="not one of zstd"):
        DeltaSink(str(tmp_path), compression="brotli")


def test_a_table_written_in_snappy_takes_the_new_codec_as_its_files_are_rewritten(tmp_path):
    """A lake written before zstd (delta-rs's snappy) stays readable, and a MERGE rewrites
    the files it touches in the URI's codec: rows exactly as merged."""
    old = open_sink(f"delta://{tmp_path}/lake?compression=snappy")
    new = open_sink(f"delta://{tmp_path}/lake")
    assert new.compression == "zstd" and new.root == old.root
    t = accounts()
    token = old.acquire(CF, t)
    old.write(CF, t, batch(t, [{"id": i, "balance": Decimal(i)} for i in range(50)]), 0, 10, token)
    assert _codecs(old, t) == {"SNAPPY"}
    new.write(
        CF, t, batch(t, [{"id": 3, "op": "d"}, {"id": 7, "balance": Decimal(70)}]), 10, 20, token
    )
    assert _codecs(new, t) == {"ZSTD"}
    want = {i: (Decimal(i), None) for i in range(50) if i != 3} | {7: (Decimal(70), None)}
    assert rows_of(new, t) == want

"""The sink travels to a worker process (as a Spark task would get it) and writes there."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(__file__))
from delta_race_worker import CF, TABLE, _batch

from cdc_dagster.sinks.delta import DeltaSink, read_table_at
from cdc_dagster.sinks.uri import open_sink


def _task(payload: bytes, uri: str, token: int) -> None:
    pickled = pickle.loads(payload)
    pickled.write(CF, TABLE, _batch(1, "pickled"), 0, 10, token)
    open_sink(uri).write(CF, TABLE, _batch(2, "uri"), 10, 20, token)


def test_sink_pickled_or_built_from_its_uri_writes_in_a_fresh_process(tmp_path):
    sink = DeltaSink(str(tmp_path / "lake ☃"))
    token = sink.acquire(CF, TABLE)
    proc = multiprocessing.get_context("spawn").Process(
        target=_task, args=(pickle.dumps(sink), sink.uri, token)
    )
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    rows = {r["id"]: r["who"] for r in read_table_at(sink.root, TABLE).to_pylist()}
    assert rows == {1: "pickled", 2: "uri"}
    assert sink.committed(CF, TABLE).committed_ts == 20

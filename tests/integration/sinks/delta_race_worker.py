"""Worker processes for the Delta fencing race (spawned; importable by path)."""

from __future__ import annotations

import random
import time

import pyarrow as pa

import cdc_dagster.sinks.delta as delta_mod
from cdc_dagster.schema import ColumnSchema, TableSchema
from cdc_dagster.sinks.base import FencedError
from cdc_dagster.sinks.delta import DeltaSink

CF = "race"
TABLE = TableSchema(
    7,
    "bank",
    "accounts",
    (ColumnSchema(1, "id", "int64", False), ColumnSchema(2, "who", "string")),
    (1,),
)


def _batch(key: int, who: str) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([key], pa.int64()),
            "who": pa.array([who]),
            "_cdc_op": pa.array([0], pa.int8()),
            "_cdc_commit_ts": pa.array([key], pa.int64()),
        }
    )


def run(role: str, root: str, rounds: int, barrier, tasks, results) -> None:
    """Each round: wait for the main process's (token, committed), race, report the outcome.

    ``acquirer`` takes a new token and writes with it at once (the new primary);
    ``zombie`` writes with the round's old token (the capture that lost its lease).
    """
    sink = DeltaSink(root)
    merges = [0]
    real_apply = delta_mod._apply

    def counting_apply(*args):
        merges[0] += 1
        real_apply(*args)

    delta_mod._apply = counting_apply
    jitter = random.Random(f"{role}-7")
    for _ in range(rounds):
        rnd, token, committed = tasks.get()
        barrier.wait()
        key = 2 * rnd + (role == "acquirer")
        time.sleep(jitter.uniform(0, 0.03))  # vary who gets ahead
        if role == "acquirer" and rnd % 4 == 0:
            time.sleep(0.06)  # every 4th round the zombie gets a clear lead: it lands first
        merges[0] = 0
        try:
            if role == "acquirer":
                token = sink.acquire(CF, TABLE)
            end_ts = committed + 1 + (role == "acquirer")
            end = sink.write(CF, TABLE, _batch(key, role), committed, end_ts, token)
            results.put((rnd, role, "ok", token, end, merges[0]))
        except FencedError:
            results.put((rnd, role, "fenced", token, None, merges[0]))

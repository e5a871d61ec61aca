"""A small workload for the executor tests: tables, their changes, and the expected content."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

from changelog_v1 import Writer
from helpers import DELETE, INSERT, UPDATE, accounts, create, rows

from cdc_dagster.schema import TableSchema
from scheduler_core.ts import compose

BASE_MS = 1_700_000_000_000


def ts(i: int) -> int:
    """The i-th test timestamp (one a second)."""
    return compose(BASE_MS + i * 1000)


class Workload:
    """Deterministic changes to ``n`` accounts tables, written to a change log step by step.

    ``changes[t]`` is every change written so far, ``(commit_ts, seq, op, after, before)``;
    :meth:`expected` replays them (the oracle: a dict per key, no Spark).
    """

    def __init__(self, writer: Writer, table_ids: list[int], seed: int = 7, shards: int = 1):
        self.writer = writer
        self.rng = random.Random(seed)
        self.schemas: dict[int, TableSchema] = {t: accounts(t, shards=shards) for t in table_ids}
        self.changes: dict[int, list[tuple[Any, ...]]] = {t: [] for t in table_ids}
        self.keys: dict[int, set[int]] = {t: set() for t in table_ids}
        self.step = 1
        self.shards = shards
        writer.write_ddl(create(ts(1), *self.schemas.values()))
        self.resolve(ts(1))

    def resolve(self, upto: int) -> None:
        for t in self.schemas:
            for shard in range(self.shards):
                self.writer.advance_resolved(t, shard, upto)

    def write(self, steps: int = 3, per_step: int = 20) -> int:
        """Write ``steps`` commit timestamps of changes to every table; resolve; return the ts."""
        for _ in range(steps):
            self.step += 1
            commit_ts = ts(self.step)
            for t, schema in self.schemas.items():
                batch = [self._change(t, commit_ts, seq) for seq in range(per_step)]
                self.changes[t] += batch
                self.writer.write_rows(t, 0, ts(1), rows(schema, batch))
        self.resolve(ts(self.step))
        return ts(self.step)

    def _change(self, t: int, commit_ts: int, seq: int) -> tuple[Any, ...]:
        keys = self.keys[t]
        r = self.rng.random()
        bal = Decimal(self.rng.randrange(0, 100000)) / 100
        if not keys or r < 0.4:
            k = self.rng.randrange(1, 10**6)
            keys.add(k)
            return (commit_ts, seq, INSERT, {"id": k, "owner": f"o{k}é", "balance": bal}, None)
        k = self.rng.choice(sorted(keys))
        if r < 0.7:
            return (commit_ts, seq, UPDATE, {"id": k, "owner": "upd", "balance": bal}, None)
        if r < 0.8:
            new = self.rng.randrange(10**6, 2 * 10**6)
            keys.discard(k)
            keys.add(new)
            return (
                commit_ts,
                seq,
                UPDATE,
                {"id": new, "owner": "moved", "balance": bal},
                {"id": k},
            )
        keys.discard(k)
        return (commit_ts, seq, DELETE, None, {"id": k})

    def expected(self, t: int, upto: int) -> dict[int, tuple[Any, ...]]:
        """Table ``t``'s content after every change with commit ts <= ``upto``."""
        out: dict[int, tuple[Any, ...]] = {}
        for commit_ts, _seq, op, after, before in sorted(self.changes[t], key=lambda c: c[:2]):
            if commit_ts > upto:
                break
            if before:
                out.pop(before["id"], None)
            if op != DELETE:
                out[after["id"]] = (after["owner"], after["balance"])
        return out


def delta_content(root: Path, schema: TableSchema) -> dict[int, tuple[Any, ...]]:
    """What the Delta table holds, keyed like :meth:`Workload.expected` (duplicates fail)."""
    from cdc_dagster.sinks.delta import read_table_at

    table = read_table_at(str(root), schema).to_pylist()
    out = {r["id"]: (r["owner"], r["balance"]) for r in table}
    assert len(out) == len(table), "a key is in the downstream twice"
    return out

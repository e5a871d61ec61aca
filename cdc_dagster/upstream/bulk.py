"""Vectorised bank transfers: narrow rows at benchmark rates, the same invariant and format.

``Workload.step_transfers`` uses this when a benchmark needs millions of rows: each
transaction moves a few cents between two accounts (in one bank table or across two),
computed with numpy instead of row by row. Balances may go negative here (the total is
what the invariant is about), and keys are never changed, so the model stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pyarrow as pa

from cdc_dagster.upstream.changelog import OP_UPDATE, ChangeLogWriter, data_file_schema
from cdc_dagster.upstream.workload_model import TableModel
from scheduler_core.ts import LOGICAL_BITS


@dataclass(frozen=True, slots=True)
class _Events:
    """Two events per transaction (debit, credit), in commit order."""

    account: np.ndarray  # global account index
    commit_ts: np.ndarray
    seq: np.ndarray
    balance: np.ndarray  # cents after the event


def bulk_transfers(
    banks: Sequence[TableModel],
    writer: ChangeLogWriter,
    seed: int,
    n_txns: int,
    commit_ts: np.ndarray,
) -> int:
    """Commit ``n_txns`` transfers among ``banks`` at ``commit_ts`` (ascending), random from
    ``seed``; updates the tables' models; returns rows written."""
    sizes = np.array([len(t.keys) for t in banks])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    total = int(offsets[-1])
    if total < 2 or n_txns == 0:
        return 0
    rng = np.random.default_rng(seed)
    src = rng.integers(0, total, n_txns)
    dst = (src + rng.integers(1, total, n_txns)) % total  # never the same account
    cents = rng.integers(1, 10_000, n_txns)
    start = np.concatenate([[_cents(t.rows[k][2]) for k in t.keys] for t in banks])
    events = _apply(start, src, dst, cents, commit_ts)
    rows = 0
    for i, t in enumerate(banks):
        mine = (events.account >= offsets[i]) & (events.account < offsets[i + 1])
        rows += _write_table(writer, t, events, mine, int(offsets[i]))
    return rows


def _apply(
    start: np.ndarray, src: np.ndarray, dst: np.ndarray, cents: np.ndarray, ts: np.ndarray
) -> _Events:
    n = len(src)
    account = np.empty(2 * n, np.int64)
    account[0::2], account[1::2] = src, dst
    delta = np.empty(2 * n, np.int64)
    delta[0::2], delta[1::2] = -cents, cents
    order = np.argsort(account, kind="stable")  # per account, in commit order
    sorted_acc, sorted_delta = account[order], delta[order]
    running = np.cumsum(sorted_delta)
    first = np.r_[True, sorted_acc[1:] != sorted_acc[:-1]]
    base = np.maximum.accumulate(np.where(first, np.arange(2 * n), 0))
    before_group = np.where(base > 0, running[base - 1], 0)
    balance = np.empty(2 * n, np.int64)
    balance[order] = start[sorted_acc] + running - before_group
    seq = np.tile(np.array([0, 1], np.int32), n)
    return _Events(account, np.repeat(ts, 2), seq, balance)


def _write_table(
    writer: ChangeLogWriter, t: TableModel, ev: _Events, mine: np.ndarray, offset: int
) -> int:
    if not mine.any():
        return 0
    local = ev.account[mine] - offset
    balance, ts, seq = ev.balance[mine], ev.commit_ts[mine], ev.seq[mine]
    snapshot = _snapshot(t)
    shards = snapshot.column("c1").to_numpy() % t.schema.shards
    for shard in range(t.schema.shards):
        pick = shards[local] == shard
        if pick.any():
            writer.write_rows(
                t.schema.table_id,
                shard,
                t.version,
                _rows(t, snapshot, local[pick], balance[pick], ts[pick], seq[pick]),
            )
    # The model: each touched account ends at its last balance.
    accounts, first_from_end = np.unique(local[::-1], return_index=True)
    last = balance[::-1][first_from_end]  # events are in commit order: the last one counts
    for idx, cents in zip(accounts.tolist(), last.tolist(), strict=True):
        key = t.keys[idx]
        t.rows[key] = {**t.rows[key], 2: Decimal(cents).scaleb(-2)}
    return int(mine.sum())


def _snapshot(t: TableModel) -> pa.Table:
    rows = [t.rows[k] for k in t.keys]
    arrays = {f"c{c.id}": pa.array([r.get(c.id) for r in rows], c.arrow) for c in t.schema.columns}
    return pa.table(arrays)


def _rows(
    t: TableModel,
    snapshot: pa.Table,
    local: np.ndarray,
    balance: np.ndarray,
    ts: np.ndarray,
    seq: np.ndarray,
) -> pa.Table:
    n = len(local)
    after = snapshot.take(pa.array(local))
    cols: dict[str, pa.Array] = {
        "_commit_ts": pa.array(ts, pa.int64()),
        "_seq": pa.array(seq, pa.int32()),
        "_op": pa.array(np.full(n, OP_UPDATE, np.int8)),
        "_schema_version": pa.array(np.full(n, t.version, np.int64)),
    }
    for c in t.schema.columns:
        cols[f"c{c.id}"] = after.column(f"c{c.id}")
    cols["c2"] = _decimal_cents(balance, t.schema.column(2).arrow)
    schema = data_file_schema(t.schema)
    arrays = [cols.get(f.name, pa.nulls(n, f.type)) for f in schema]
    return pa.Table.from_arrays(
        [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays],
        schema=schema,
    )


def _decimal_cents(cents: np.ndarray, typ: pa.DataType) -> pa.Array:
    """int64 cents as decimal128(p, 2): the unscaled value is the cents, sign-extended."""
    words = np.empty((len(cents), 2), np.int64)
    words[:, 0], words[:, 1] = cents, np.where(cents < 0, -1, 0)
    return pa.Array.from_buffers(typ, len(cents), [None, pa.py_buffer(words.tobytes())])


def _cents(value: Decimal) -> int:
    return int(value.scaleb(2))


def ts_range(first: int, n: int, step_ms: int) -> np.ndarray:
    """``n`` commit ts from ``first``, ``step_ms`` apart."""
    return first + (np.arange(n, dtype=np.int64) * step_ms << LOGICAL_BITS)

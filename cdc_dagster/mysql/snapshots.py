"""Chunked, lock-free, resumable snapshots: the files the chunk readers and the puller share.

A table to snapshot (a new changefeed's tables, a table joining, a re-snapshot) gets a
*generation* in the puller's state, which holds the table's resolved mark where it was
asked for until the snapshot is complete. Then, under the change log's root:

```
snapshot/<table_id>/<gen>/plan.json                     the key ranges (chunk readers run them in parallel)
snapshot/<table_id>/<gen>/chunks/<range>-<chunk>.parquet rows of one chunk, read at one binlog position
snapshot/<table_id>/<gen>/done/<range>-<chunk>.json      the chunk is in the change log (or was empty)
```

A chunk is read in a short ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` whose binlog
position MariaDB reports (DBLog's watermark, read-only: no signal table, no lock but a
metadata lock for the chunk's few milliseconds). The puller places the chunk's rows in
the stream exactly there -- at a free TS between the table's last change at or before that
position and its first change after it (``mysql.state.SLOTS``) -- so no reconciliation
with the binlog is needed: each chunk row says what its key held at that point, and every
later change follows it. A chunk placed twice (a crash between placing and marking it
done) says the same thing twice. Chunks within a range follow one another by key
(keyset: each starts after the last key of the one before); a range is covered when its
chunks are done from its low end to one marked ``last``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_dagster.upstream.changelog import write_json

CHUNK_KEY = b"cdc_dagster.chunk"
_CHUNK_NAME = re.compile(r"(\d{4})-(\d{6})\.(parquet|json)")

Key = list[Any] | None  # a primary-key tuple as JSON values; None: the table's end


def encode_key(values: tuple[Any, ...] | list[Any] | None) -> Key:
    """Key values (as pymysql gives them) as JSON values."""
    if values is None:
        return None
    out: list[Any] = []
    for v in values:
        if isinstance(v, bytes):
            out.append({"b64": base64.b64encode(v).decode()})
        elif isinstance(v, Decimal):
            out.append({"dec": str(v)})
        elif isinstance(v, dt.datetime | dt.date | dt.timedelta):
            out.append({"text": str(v)})
        else:
            out.append(v)
    return out


def decode_key(key: Key) -> tuple[Any, ...] | None:
    """JSON key values back into query arguments."""
    if key is None:
        return None
    out: list[Any] = []
    for v in key:
        if isinstance(v, dict):
            out.append(
                base64.b64decode(v["b64"]) if "b64" in v else Decimal(v["dec"]) if "dec" in v
                else v["text"]
            )  # fmt: skip
        else:
            out.append(v)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Plan:
    """A table's snapshot split into key ranges ``(lo, hi]`` (None: open end)."""

    table_id: int
    generation: int
    ranges: tuple[tuple[Key, Key], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "table_id": self.table_id,
            "generation": self.generation,
            "ranges": [list(r) for r in self.ranges],
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Plan:
        return Plan(obj["table_id"], obj["generation"], tuple(tuple(r) for r in obj["ranges"]))


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk: keys in ``(lo, hi]`` of range ``range_no`` as read at ``position``."""

    range_no: int
    chunk_no: int
    position: dict[int, str]  # MariaDB GTID per domain of the chunk's snapshot
    lo: Key
    hi: Key  # the last key read; the range's high end when ``last``
    last: bool  # the range ends with this chunk
    rows: int
    schema_version: int  # of the change log's schema the rows were read with

    @property
    def name(self) -> str:
        return f"{self.range_no:04d}-{self.chunk_no:06d}"

    def to_json(self) -> dict[str, Any]:
        return {
            "range": self.range_no,
            "chunk": self.chunk_no,
            "position": {str(k): v for k, v in self.position.items()},
            "lo": self.lo,
            "hi": self.hi,
            "last": self.last,
            "rows": self.rows,
            "schema_version": self.schema_version,
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Chunk:
        return Chunk(
            obj["range"],
            obj["chunk"],
            {int(k): v for k, v in obj["position"].items()},
            obj["lo"],
            obj["hi"],
            obj["last"],
            obj["rows"],
            obj["schema_version"],
        )


def generation_dir(root: str | os.PathLike[str], table_id: int, generation: int) -> Path:
    return Path(root) / "snapshot" / str(table_id) / str(generation)


def write_plan(root: str | os.PathLike[str], plan: Plan) -> None:
    path = generation_dir(root, plan.table_id, plan.generation) / "plan.json"
    write_json(path, plan.to_json())


def read_plan(root: str | os.PathLike[str], table_id: int, generation: int) -> Plan | None:
    path = generation_dir(root, table_id, generation) / "plan.json"
    try:
        return Plan.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None


def write_chunk(gen_dir: Path, chunk: Chunk, rows: pa.Table) -> None:
    """A chunk's rows (or, empty, its done mark directly: nothing to place)."""
    if chunk.rows == 0:
        write_json(gen_dir / "done" / f"{chunk.name}.json", chunk.to_json())
        return
    path = gen_dir / "chunks" / f"{chunk.name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
    rows = rows.replace_schema_metadata({CHUNK_KEY: json.dumps(chunk.to_json()).encode()})
    pq.write_table(rows, tmp)
    os.replace(tmp, path)


def chunk_of(path: Path) -> Chunk:
    """The chunk record of a chunk file (from its Parquet metadata)."""
    meta = pq.read_metadata(path).metadata or {}
    return Chunk.from_json(json.loads(meta[CHUNK_KEY]))


def pending_chunks(gen_dir: Path) -> list[tuple[Path, Chunk]]:
    """Chunk files written and not yet placed, in (range, chunk) order."""
    d = gen_dir / "chunks"
    if not d.exists():
        return []
    paths = sorted(p for p in d.iterdir() if _CHUNK_NAME.fullmatch(p.name))
    return [(p, chunk_of(p)) for p in paths]


def done_chunks(gen_dir: Path) -> dict[tuple[int, int], Chunk]:
    """Chunks in the change log (or empty), by (range, chunk)."""
    d = gen_dir / "done"
    if not d.exists():
        return {}
    out = {}
    for p in d.iterdir():
        if _CHUNK_NAME.fullmatch(p.name):
            c = Chunk.from_json(json.loads(p.read_text()))
            out[(c.range_no, c.chunk_no)] = c
    return out


def mark_done(gen_dir: Path, chunk: Chunk, fsync: bool = True) -> None:
    write_json(gen_dir / "done" / f"{chunk.name}.json", chunk.to_json(), fsync=fsync)


def range_chunks(records: dict[tuple[int, int], Chunk], range_no: int) -> dict[int, Chunk]:
    return {n: c for (r, n), c in records.items() if r == range_no}


def _chain(lo: Key, chunks: dict[int, Chunk]) -> tuple[list[Chunk], Key, bool]:
    """Chunks following each other by key from ``lo``: (chain, where it ends, ended last)."""
    by_lo: dict[str, Chunk] = {}
    for _, c in sorted(chunks.items()):
        by_lo.setdefault(json.dumps(c.lo), c)
    chain, expect = [], lo
    while (c := by_lo.get(json.dumps(expect))) is not None and c not in chain:
        chain.append(c)
        if c.last:
            return chain, expect, True
        expect = c.hi
    return chain, expect, False


def covered(plan: Plan, done: dict[tuple[int, int], Chunk]) -> bool:
    """Whether every range of ``plan`` is covered by done chunks, low end to a last one."""
    return all(_chain(lo, range_chunks(done, r))[2] for r, (lo, _) in enumerate(plan.ranges))


@dataclass(frozen=True, slots=True)
class NextRead:
    """What a chunk reader reads next in a range: keys in ``(lo, bound]``, ``limit`` rows
    at most (None: all of them, to fill a hole up to a chunk already read)."""

    chunk_no: int
    lo: Key
    bound: Key
    limit: int | None
    fills_hole: bool


def next_read(
    plan: Plan, range_no: int, records: dict[tuple[int, int], Chunk], limit: int
) -> NextRead | None:
    """The next read of a range given the chunks read or done so far (None: covered).
    Chunks are numbered in reading order; a hole (a chunk lost before it was placed) is
    filled up to the first chunk read after it (the lowest number outside the chain)."""
    lo, hi = plan.ranges[range_no]
    chunks = range_chunks(records, range_no)
    chain, expect, done = _chain(lo, chunks)
    if done:
        return None
    n = max(chunks, default=-1) + 1
    starts = {json.dumps(c.lo) for c in chain}
    after = sorted(k for k, c in chunks.items() if json.dumps(c.lo) not in starts)
    if after:
        return NextRead(n, expect, chunks[after[0]].lo, None, True)
    return NextRead(n, expect, hi, limit, False)


__all__ = [
    "Chunk",
    "NextRead",
    "Plan",
    "covered",
    "decode_key",
    "done_chunks",
    "encode_key",
    "generation_dir",
    "mark_done",
    "next_read",
    "pending_chunks",
    "read_plan",
    "write_chunk",
    "write_plan",
]

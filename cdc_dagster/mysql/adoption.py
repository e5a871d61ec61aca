"""The puller's half of chunked snapshots: place each chunk in the stream, release the table.

The puller remembers, for each table being snapshotted, the (domain, seq) GTID and TS of
every transaction or DDL of that table it wrote in this run. A chunk read at binlog
position S is placed once the stream has passed S, at a free TS (``state.SLOTS``) just
below the table's first change after S -- or, when the table has had none since S, at a
fresh TS. A chunk read before this run's history began, or with the schema of another
version than the one valid where it lands, is dropped: its reader reads it again. When a
table's plan is covered by chunks in the change log, its resolved mark is released.
See ``mysql.snapshots`` for why this needs no reconciliation with the binlog.
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from cdc_dagster.mysql.context import PullerContext
from cdc_dagster.mysql.snapshots import (
    Chunk,
    covered,
    done_chunks,
    generation_dir,
    mark_done,
    pending_chunks,
    read_plan,
    release_generation,
    sweep_generations,
)
from cdc_dagster.mysql.state import SLOTS

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _History:
    """A snapshotting table's changes in this run: (domain, seq, ts), in stream order."""

    since: dict[int, int]  # the stream's position (seq per domain) when it began
    changes: list[tuple[int, int, int]] = field(default_factory=list)
    used: set[int] = field(default_factory=set)  # slots placed in


def _seq(gtid: str) -> int:
    return int(gtid.rsplit("-", 1)[1])


class Adopter:
    """Chunk placement for one puller run (see the module docstring)."""

    def __init__(self) -> None:
        self.history: dict[int, _History] = {}
        self.placed: list[tuple[Path, Chunk]] = []  # done marks due after the state save
        self.released: list[Path] = []  # generation dirs to remove after the state save
        self.swept = False  # generation dirs no snapshot holds were removed (once a run)

    def track(self, ctx: PullerContext, table_id: int) -> None:
        """Start remembering a snapshotting table's changes (from the stream's position)."""
        since = {d: _seq(g) for d, g in ctx.state.position.items()}
        self.history.setdefault(table_id, _History(since))

    def restart(self, ctx: PullerContext, table_id: int) -> None:
        """A new snapshot of the table (a re-snapshot) starts here: remember from now."""
        self.history.pop(table_id, None)
        self.track(ctx, table_id)

    def note(self, table_ids: set[int], domain: int, gtid: str | None, ts: int) -> None:
        """A transaction or DDL touching ``table_ids`` got ``ts``."""
        if gtid is None:
            return
        seq = _seq(gtid)
        for tid in table_ids & self.history.keys():
            self.history[tid].changes.append((domain, seq, ts))

    def adopt(self, ctx: PullerContext) -> None:
        """Before a flush's state save: place readable chunks, release covered tables (in
        the same save as their last chunks: no flush interval between)."""
        if not self.swept:
            self.swept = True
            sweep_generations(ctx.root, ctx.state.snapshots)
        for tid, gen in list(ctx.state.snapshots.items()):
            gen_dir = generation_dir(ctx.root, tid, gen)
            plan = read_plan(ctx.root, tid, gen)
            done = done_chunks(gen_dir)
            if plan is None or not covered(plan, done):
                self.track(ctx, tid)
                for path, chunk in pending_chunks(gen_dir):
                    key = (chunk.range_no, chunk.chunk_no)
                    if key in done:
                        path.unlink(missing_ok=True)  # marked done; a crash left the file
                    elif self._place(ctx, tid, path, chunk):
                        done[key] = chunk  # in the log with this save; marked done after it
            if plan is not None and covered(plan, done):
                del ctx.state.snapshots[tid]
                self.history.pop(tid, None)
                self.released.append(gen_dir)
                log.info("table %d: snapshot complete; its resolved mark moves on", tid)

    def after_save(self, fsync: bool) -> None:
        """After the state save: mark placed chunks done, remove released generations."""
        for path, chunk in self.placed:
            if path.parent.parent not in self.released:  # removed whole just below
                mark_done(path.parent.parent, chunk, fsync)
                path.unlink(missing_ok=True)
        self.placed = []
        for gen_dir in self.released:
            release_generation(gen_dir)
        self.released = []

    def _place(self, ctx: PullerContext, tid: int, path: Path, chunk: Chunk) -> bool:
        """Place the chunk if the stream has passed its position; whether it was placed."""
        pos = {d: _seq(g) for d, g in ctx.state.position.items()}
        if any(pos.get(d, -1) < _seq(g) for d, g in chunk.position.items()):
            return False  # the stream has not reached the chunk's position yet
        hist = self.history[tid]
        slot = self._slot(ctx, hist, chunk)
        version = ctx.writer.log.schema_version_at(tid, slot) if slot else None
        if slot is None or version != chunk.schema_version:
            log.info("table %d: chunk %s dropped (read before this run's history or with "
                     "another schema version); it is read again", tid, chunk.name)  # fmt: skip
            path.unlink(missing_ok=True)
            return False
        tag = f"{zlib.crc32(f'{tid}/{path}'.encode()):08x}"
        # linked: the chunk file stays until it is marked done, so its reader never sees
        # a chunk that is neither read nor done (and reads it again)
        ctx.writer.adopt_rows(tid, 0, slot, path, tag, link=True)
        hist.used.add(slot)
        self.placed.append((path, chunk))
        ctx.stats.snapshot_rows += chunk.rows
        return True

    def _slot(self, ctx: PullerContext, hist: _History, chunk: Chunk) -> int | None:
        s = {d: _seq(g) for d, g in chunk.position.items()}
        if any(s.get(d, 0) < seq for d, seq in hist.since.items() if d in s):
            return None  # read before this run began to remember the table's changes
        after = next((ts for d, seq, ts in hist.changes if seq > s.get(d, -1)), None)
        if after is None:  # no change of the table since S: any new TS is after S
            return ctx.alloc.issue(time.time())
        for slot in range(after - 1, after - SLOTS, -1):
            if slot not in hist.used:
                return slot
        return None


__all__ = ["Adopter"]

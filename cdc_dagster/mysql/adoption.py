"""The puller's half of chunked snapshots: place each chunk in the stream, release the table.

The puller remembers, for each table being snapshotted, the (domain, seq) GTID and TS of
every transaction or DDL of that table it wrote in this run. A chunk read at binlog
position S is placed once the stream has passed S, at a free TS (``state.SLOTS``) just
below the table's first change after S -- or, when the table has had none since S, at a
fresh TS. A chunk read before this run's history began, or with the schema of another
version than the one valid where it lands, is dropped: its reader reads it again. When a
table's plan is covered by chunks in the change log, its resolved mark is released.
See ``mysql.snapshots`` for why this needs no reconciliation with the binlog.

A chunk comes with its snapshot's binlog coordinates (server id, file, offset), which are
turned into the GTIDs S here: while tables are being snapshotted the puller remembers the
GTIDs after every transaction it read, by the file and offset where that transaction ends
(``ended``; a snapshot's offset is where its last transaction ends), and where every
transaction begins (the first one of a stream: where the stream resumed), for
``ENDS_KEEP_S``. Coordinates not remembered (forgotten, or in a quiet binlog where no
transaction went by: the stream is past them once a heartbeat says so) are asked
of the upstream (``BINLOG_GTID_POS``, on the puller's side: ``PullerContext.gtid_at``).
Coordinates of another server than the stream's cannot be turned into GTIDs here: the
chunk is dropped and the generation's readers give GTIDs from then on
(``snapshots.ask_gtid_positions``).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cdc_dagster.mysql.context import PullerContext
from cdc_dagster.mysql.snapshots import (
    BellLog,
    Chunk,
    ask_gtid_positions,
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

ENDS_KEEP_S = 120.0  # transactions' ends remembered this long (wall seconds) ...
ENDS_MAX = 400_000  # ... and at most this many
_WAIT = object()  # the stream has not reached the chunk's position
# A flush looks again at the tables rung for (``BellLog``) and those with chunks waiting for
# the stream; at every table being snapshotted on the first and then at least this often
# (a table left out by mistake would be placed this much later, not never).
LOOK_ALL_S = 5.0


class AdoptionContext(PullerContext, Protocol):
    """What adoption needs of the puller beyond ``PullerContext``: where its stream is."""

    # the binlog (file, offset) the stream is past (None: not known yet on this stream)
    binlog_at: tuple[str, int] | None
    stream_server_id: int | None  # the server the stream reads (None: not connected)

    def gtid_at(self, server_id: int, log_file: str, offset: int) -> dict[int, str] | None:
        """The upstream's GTID per domain at ``log_file:offset`` (None: it is not server
        ``server_id``, or it has no such binlog)."""


def binlog_order(log_file: str, offset: int) -> tuple[int, int]:
    """A binlog position's order: the file's number (``name.000012``), then the offset."""
    return int(log_file.rsplit(".", 1)[1]), offset


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
        # (file, offset) where a transaction ends -> GTID sequence per domain after it
        self.ends: dict[tuple[str, int], dict[int, int]] = {}
        self._ends_order: deque[tuple[float, tuple[str, int]]] = deque()
        self.resolved: dict[Path, dict[int, int] | None] = {}  # chunk coordinates asked
        # the lowest binlog coordinates (``binlog_order``) of a chunk the stream had not
        # reached at the last ``adopt``: the puller flushes once it passes them (None: none)
        self.waiting: tuple[int, int] | None = None
        # (table, generation) looked at with no chunk left to place and not covered: not
        # looked at again until a reader rings for the table (``BellLog``)
        self.quiet: set[tuple[int, int]] = set()
        self._bell: BellLog | None = None
        self._looked_all = 0.0

    def ended(self, log_file: str, offset: int, position: dict[int, str]) -> None:
        """A transaction ends (or one begins: where the one before ended) at
        ``log_file:offset``, the stream then at ``position``."""
        key = (log_file, offset)
        self.ends[key] = {d: _seq(g) for d, g in position.items()}
        now = time.monotonic()
        order = self._ends_order
        order.append((now, key))
        while now - order[0][0] > ENDS_KEEP_S or len(order) > ENDS_MAX:
            self.ends.pop(order.popleft()[1], None)

    def forget_ends(self) -> None:
        """The stream (re)connected, maybe to another server, or no table is being
        snapshotted any more: forget the ends."""
        self.ends.clear()
        self._ends_order.clear()
        self.resolved.clear()

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

    def adopt(self, ctx: AdoptionContext) -> None:
        """Before a flush's state save: place readable chunks, release covered tables (in
        the same save as their last chunks: no flush interval between)."""
        self.waiting = None
        if not self.swept:
            self.swept = True
            sweep_generations(ctx.root, ctx.state.snapshots)
        rung = self._rung(ctx.root)
        self.quiet &= set(ctx.state.snapshots.items())  # released or re-snapshotted: gone
        for tid, gen in list(ctx.state.snapshots.items()):
            if rung is not None and (tid, gen) in self.quiet and tid not in rung:
                continue  # nothing written for it since it was looked at (a file look each)
            self.quiet.discard((tid, gen))
            gen_dir = generation_dir(ctx.root, tid, gen)
            plan = read_plan(ctx.root, tid, gen)
            done = done_chunks(gen_dir)
            left = False
            if plan is None or not covered(plan, done):
                self.track(ctx, tid)
                for path, chunk in pending_chunks(gen_dir):
                    key = (chunk.range_no, chunk.chunk_no)
                    if key in done:
                        path.unlink(missing_ok=True)  # marked done; a crash left the file
                    elif self._place(ctx, tid, path, chunk):
                        done[key] = chunk  # in the log with this save; marked done after it
                    else:
                        left = left or path.exists()  # waits for the stream (not dropped)
            if plan is not None and covered(plan, done):
                del ctx.state.snapshots[tid]
                self.history.pop(tid, None)
                self.released.append(gen_dir)
                log.info("table %d: snapshot complete; its resolved mark moves on", tid)
            elif not left:
                self.quiet.add((tid, gen))
        if not self.history and self.ends:
            self.forget_ends()

    def _rung(self, root: str) -> set[int] | None:
        """The tables rung for since the last flush; None: look at every table (the first
        flush, a bell not read, or ``LOOK_ALL_S`` since the last look at all)."""
        if self._bell is None:
            self._bell = BellLog(root)
        rung = self._bell.rung()
        now = time.monotonic()
        if rung is None or now - self._looked_all >= LOOK_ALL_S:
            self._looked_all = now
            return None
        return rung

    def passed(self, at: tuple[str, int] | None) -> bool:
        """Whether the stream, now past ``at``, has reached a chunk the last ``adopt`` left
        waiting for it (the flush that places it is due now, not at the next interval)."""
        return self.waiting is not None and at is not None and binlog_order(*at) >= self.waiting

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

    def _position(
        self, ctx: AdoptionContext, path: Path, chunk: Chunk
    ) -> dict[int, int] | object | None:
        """The chunk's GTID sequence per domain; None: it cannot be placed (drop it);
        ``_WAIT``: the stream has not reached it."""
        if chunk.binlog is None:
            return {d: _seq(g) for d, g in chunk.position.items()}
        if path in self.resolved:
            return self.resolved[path]
        server_id, log_file, offset = chunk.binlog
        if ctx.stream_server_id is None:
            return _WAIT
        if server_id != ctx.stream_server_id:
            log.warning(
                "chunk %s was read on server %d, the binlog stream is server %d's: dropped, "
                "and the snapshot's readers give GTID positions from now on",
                path, server_id, ctx.stream_server_id,
            )  # fmt: skip
            ask_gtid_positions(path.parent.parent)
            return None
        found = self.ends.get((log_file, offset))
        if found is None:
            at = ctx.binlog_at
            where = binlog_order(log_file, offset)
            if at is None or binlog_order(*at) < where:
                if self.waiting is None or where < self.waiting:
                    self.waiting = where
                return _WAIT
            gtids = ctx.gtid_at(server_id, log_file, offset)  # a quiet binlog, or forgotten
            found = None if gtids is None else {d: _seq(g) for d, g in gtids.items()}
            if gtids is not None:
                # remembered as an end: in a quiet binlog every chunk is read at the same
                # coordinates, and asking once for each (a connection, and MariaDB reading
                # the binlog file up to there) made 100 tables' snapshot 50% slower
                self.ended(log_file, offset, gtids)
        self.resolved[path] = found
        return found

    def _place(self, ctx: AdoptionContext, tid: int, path: Path, chunk: Chunk) -> bool:
        """Place the chunk if the stream has passed its position; whether it was placed."""
        spos = self._position(ctx, path, chunk)
        if spos is _WAIT:
            return False
        assert spos is None or isinstance(spos, dict)
        pos = {d: _seq(g) for d, g in ctx.state.position.items()}
        if spos is not None and any(pos.get(d, -1) < s for d, s in spos.items()):
            return False  # the stream has not reached the chunk's position yet
        self.resolved.pop(path, None)
        hist = self.history[tid]
        slot = None if spos is None else self._slot(ctx, hist, spos)
        version = ctx.writer.log.schema_version_at(tid, slot) if slot else None
        if slot is None or version != chunk.schema_version:
            log.info("table %d: chunk %s dropped (read before this run's history, on another "
                     "server or with another schema version); it is read again",
                     tid, chunk.name)  # fmt: skip
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

    def _slot(self, ctx: PullerContext, hist: _History, s: dict[int, int]) -> int | None:
        if any(s.get(d, 0) < seq for d, seq in hist.since.items() if d in s):
            return None  # read before this run began to remember the table's changes
        after = next((ts for d, seq, ts in hist.changes if seq > s.get(d, -1)), None)
        if after is None:  # no change of the table since S: any new TS is after S
            return ctx.alloc.issue(time.time())
        for slot in range(after - 1, after - SLOTS, -1):
            if slot not in hist.used:
                return slot
        return None


__all__ = ["ENDS_KEEP_S", "Adopter", "AdoptionContext", "binlog_order"]

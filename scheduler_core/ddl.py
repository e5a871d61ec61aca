"""DDL events and the DDL manager: pending DDLs, barriers and syncpoints of one changefeed.

Follows TiCDC's "DDL only blocks related tables" RFC (tiflow
``docs/RFCS/20230320_ddl_block_related_table.md``): a DDL that touches exactly one
existing table holds back that table alone (a *table barrier*); a DDL that creates
tables, touches several, is schema-level, or touches a table outside the current set
holds back the whole changefeed (a *global barrier*), as the target ts does.

Syncpoints are not barriers: their TSs are known in advance (aligned multiples of the
interval), so each table's sink splits its commits at them and carries on; the owner
records a syncpoint once the changefeed checkpoint has passed it. What must see the table
set as it was at a syncpoint waits for it to be recorded: a DDL (or table-set change)
above an unrecorded syncpoint is not ready until then, so the record lists exactly the
tables that existed at its TS.

Barrier semantics: a sink may write changes with commit ts <= its barrier ts, so a
table held at a DDL's commit ts has written every change below it and none above it.
A DDL commits in its own upstream transaction, so no row change shares its commit ts;
the DDL therefore applies after every change below it and before any above it
(correctness property 5), once the checkpoint of what it blocks has reached it.
"""

from __future__ import annotations

import bisect
import enum
import logging
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import NamedTuple

from scheduler_core.errors import ConfigError, InvalidMessageError, ProtocolError, SchedulerError
from scheduler_core.messages import Barrier
from scheduler_core.model import check_ts
from scheduler_core.ts import MAX_TS, add_ms, compose, physical_ms

log = logging.getLogger(__name__)


class DDLKind(enum.Enum):
    """What a DDL does, which decides what it must block."""

    ALTER_TABLE = "alter_table"  # changes one existing table (columns, indexes, options)
    TRUNCATE_TABLE = "truncate_table"  # empties one existing table, keeping its table id
    CREATE_TABLE = "create_table"  # creates one or more tables (ids in ``creates``)
    DROP_TABLE = "drop_table"  # drops one or more existing tables (``drops`` == ``table_ids``)
    RENAME_TABLES = "rename_tables"  # renames tables; may move them into or out of the filter
    MULTI_TABLE = "multi_table"  # any other DDL touching several existing tables at once
    CREATE_SCHEMA = "create_schema"  # creates a schema (database); touches no table
    DROP_SCHEMA = "drop_schema"  # drops a schema and every table in it


class _Drops(enum.Enum):
    NONE = 0  # the kind never drops a table
    ALL = 1  # it drops every table it touches; ``drops`` defaults to ``table_ids``
    SUBSET = 2  # it may drop some of the tables it touches


class _Rule(NamedTuple):
    min_tables: int
    max_tables: int | None
    min_creates: int
    max_creates: int | None
    drops: _Drops
    needs_schema: bool


# What each kind may carry, as data (one place to read every kind's shape).
_RULES: dict[DDLKind, _Rule] = {
    DDLKind.ALTER_TABLE: _Rule(1, 1, 0, 0, _Drops.NONE, False),
    DDLKind.TRUNCATE_TABLE: _Rule(1, 1, 0, 0, _Drops.NONE, False),
    DDLKind.CREATE_TABLE: _Rule(0, 0, 1, None, _Drops.NONE, False),
    DDLKind.DROP_TABLE: _Rule(1, None, 0, 0, _Drops.ALL, False),
    DDLKind.RENAME_TABLES: _Rule(1, None, 0, None, _Drops.SUBSET, False),
    DDLKind.MULTI_TABLE: _Rule(2, None, 0, None, _Drops.SUBSET, False),
    DDLKind.CREATE_SCHEMA: _Rule(0, 0, 0, 0, _Drops.NONE, True),
    DDLKind.DROP_SCHEMA: _Rule(0, None, 0, 0, _Drops.ALL, True),
}

# Kinds that block only their table when it is the one existing table they touch.
_ONE_TABLE_KINDS = frozenset({DDLKind.ALTER_TABLE, DDLKind.TRUNCATE_TABLE, DDLKind.DROP_TABLE})


def _table_id_tuple(name: str, values: object) -> tuple[int, ...]:
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise InvalidMessageError(f"{name} must be a tuple of table ids, got {values!r}")
    ids = tuple(values)  # type: ignore[call-overload]
    for table_id in ids:
        if type(table_id) is not int or table_id < 0:
            raise InvalidMessageError(f"{name} must hold int table ids >= 0, got {table_id!r}")
    if len(set(ids)) != len(ids):
        raise InvalidMessageError(f"{name} lists a table id twice: {ids}")
    return ids


def _check_count(kind: DDLKind, name: str, n: int, lo: int, hi: int | None) -> None:
    if n < lo or (hi is not None and n > hi):
        want = f"exactly {lo}" if lo == hi else f"at least {lo}" if hi is None else f"{lo}..{hi}"
        raise InvalidMessageError(f"a {kind.name} DDL needs {want} {name}, got {n}")


@dataclass(frozen=True, slots=True)
class DDLEvent:
    """One upstream DDL: when it committed, what it is, and which tables it touches.

    ``table_ids`` are the existing tables it touches, ``creates`` the tables it adds to
    the changefeed, ``drops`` (a subset of ``table_ids``) the tables it removes.
    """

    commit_ts: int
    kind: DDLKind
    query: str
    table_ids: tuple[int, ...] = ()
    creates: tuple[int, ...] = ()
    drops: tuple[int, ...] = ()
    schema: str | None = None

    def __post_init__(self) -> None:
        check_ts("commit_ts", self.commit_ts)
        if not isinstance(self.kind, DDLKind):
            raise InvalidMessageError(f"kind must be a DDLKind, got {self.kind!r}")
        if not isinstance(self.query, str) or not self.query.strip():
            raise InvalidMessageError(f"query must be a non-empty str, got {self.query!r}")
        if self.schema is not None and (not isinstance(self.schema, str) or not self.schema):
            raise InvalidMessageError(
                f"schema must be None or a non-empty str, got {self.schema!r}"
            )
        for name in ("table_ids", "creates", "drops"):
            object.__setattr__(self, name, _table_id_tuple(name, getattr(self, name)))
        self._check_shape(_RULES[self.kind])

    def _check_shape(self, rule: _Rule) -> None:
        k = self.kind
        _check_count(k, "table_ids", len(self.table_ids), rule.min_tables, rule.max_tables)
        _check_count(k, "creates", len(self.creates), rule.min_creates, rule.max_creates)
        if rule.needs_schema and self.schema is None:
            raise InvalidMessageError(f"a {k.name} DDL needs schema, the schema's name")
        both = sorted(set(self.creates) & set(self.table_ids))
        if both:
            raise InvalidMessageError(
                f"{k.name} at {self.commit_ts}: tables {both} "
                "are both created and already existing; list a new table in creates only"
            )
        if rule.drops is _Drops.ALL and not self.drops:
            object.__setattr__(self, "drops", self.table_ids)
        if rule.drops is _Drops.NONE and self.drops:
            raise InvalidMessageError(f"a {k.name} DDL drops no table, got drops={self.drops}")
        if rule.drops is _Drops.ALL and set(self.drops) != set(self.table_ids):
            raise InvalidMessageError(
                f"a {k.name} DDL drops every table it touches: drops={self.drops} "
                f"must equal table_ids={self.table_ids} (or be left empty)"
            )
        if not set(self.drops) <= set(self.table_ids):
            raise InvalidMessageError(
                f"{k.name} at {self.commit_ts}: drops={self.drops} must be among "
                f"table_ids={self.table_ids} (a dropped table is one the DDL touches)"
            )

    @property
    def touched(self) -> tuple[int, ...]:
        """Every table the DDL touches or creates: the tables whose DDLs it is ordered with."""
        return self.table_ids + self.creates

    def blocks_only(self, current_tables: Container[int]) -> int | None:
        """The one table this DDL blocks, or None when it must block the whole changefeed."""
        if self.kind in _ONE_TABLE_KINDS and len(self.table_ids) == 1 and not self.creates:
            table_id = self.table_ids[0]
            if table_id in current_tables:
                return table_id
        return None

    def __str__(self) -> str:
        return f"{self.kind.name} {self.query!r} at commit_ts {self.commit_ts}"


@dataclass(frozen=True, slots=True)
class TableSetChange:
    """What the table set gains and loses once a DDL ran; new tables start at ``barrier_ts``."""

    barrier_ts: int
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_ts("barrier_ts", self.barrier_ts)
        object.__setattr__(self, "added", _table_id_tuple("added", self.added))
        object.__setattr__(self, "removed", _table_id_tuple("removed", self.removed))


class DDLManagerInvariantError(SchedulerError):
    """The DDL manager reached a state its invariants forbid (a bug, never input)."""


_Key = tuple[int, str]  # (commit_ts, query): how a DDL is recognised when delivered twice


def _key(event: DDLEvent) -> _Key:
    return event.commit_ts, event.query


def _first_syncpoint(checkpoint_ts: int, interval_ms: int) -> int:
    # Aligned to multiples of the interval, so every owner (and every restart) agrees
    # on the same syncpoint TSs without having to persist them.
    return compose((physical_ms(checkpoint_ts) // interval_ms + 1) * interval_ms)


def is_syncpoint(ts: int, interval_ms: int | None) -> bool:
    """``ts`` is a syncpoint TS (an aligned multiple of the interval, logical part 0)."""
    return (
        bool(interval_ms) and ts == compose(physical_ms(ts)) and physical_ms(ts) % interval_ms == 0
    )


def syncpoints_between(lo: int, hi: int, interval_ms: int | None) -> list[int]:
    """The syncpoint TSs in ``(lo, hi)``, ascending: where a sink batch ``(lo, hi]`` is cut.

    A sink commits every table's changes up to each syncpoint TS on its own (a batch never
    spans one), so the downstream has a version of each table exactly at each syncpoint.
    """
    if not interval_ms or hi <= lo:
        return []
    out = []
    sp = _first_syncpoint(lo, interval_ms)
    while sp < hi:
        out.append(sp)
        sp = add_ms(sp, interval_ms)
    return out


class DDLManager:
    """Owner-side DDL state of one changefeed: pending DDLs, barriers, syncpoints, target ts.

    Each tick: ``add_ddl`` what the DDL stream delivered, ``barrier(current_tables)`` to
    broadcast, then ``ready(...)`` / ``ready_syncpoint(...)`` to find what may run now, and
    ``ddl_done`` / ``syncpoint_done`` once it ran downstream. A DDL becomes ready only
    after a ``barrier()`` call held it back (a sink could not have stopped at it before).

    Invariants, checked after every change: pending DDLs are sorted by (commit_ts,
    arrival); each has commit_ts above the start checkpoint; ready DDLs are pending; per
    table, pending DDLs have strictly increasing commit_ts; the next syncpoint is an
    aligned TS above the last one recorded. State and per-tick cost are O(pending DDLs).

    Syncpoints are no barrier (see the module docstring): ``ready_syncpoint`` returns the
    next one once the checkpoint passed it, and a DDL above an unrecorded syncpoint is not
    ready until that syncpoint is recorded.

    To resume after a crash, build it from the persisted checkpoint minus one when a DDL
    at exactly that checkpoint may not have run yet (TiCDC starts its DDL puller at
    checkpoint - 1 for the same reason); the DDL sink must then skip DDLs it already ran.
    """

    __slots__ = (
        "_announced",
        "_checkpoint_ts",
        "_ddl_resolved_ts",
        "_interval_ms",
        "_newest_ts",
        "_next_syncpoint",
        "_pending",
        "_queue",
        "_ready",
        "_recent_done",
        "_seq",
        "_target_ts",
    )

    def __init__(
        self,
        checkpoint_ts: int,
        *,
        sync_point_interval_ms: int | None = None,
        target_ts: int | None = None,
        ddl_resolved_ts: int | None = None,
        last_syncpoint_ts: int = 0,
    ) -> None:
        """Start at the changefeed's ``checkpoint_ts``.

        ``last_syncpoint_ts``: the last syncpoint recorded (0: none). The next one is the
        first aligned TS above it, even if the checkpoint has passed it meanwhile (the
        checkpoint does not wait for syncpoints: an owner that died before recording one
        leaves it to its successor); with none recorded, the first above the checkpoint.

        ``ddl_resolved_ts``, when given, switches on tracking of the DDL stream's resolved
        ts: every DDL with commit_ts <= it has been added. The global barrier then never
        passes it (advance it with ``advance_ddl_resolved``), so no table can sink past a
        DDL the owner has not seen yet. Without it the caller must add every DDL before
        any table's checkpoint can reach it.
        """
        _check_config_ts("checkpoint_ts", checkpoint_ts)
        self._checkpoint_ts = checkpoint_ts
        self._target_ts = _check_target(target_ts, checkpoint_ts)
        self._interval_ms = _check_interval(sync_point_interval_ms)
        _check_config_ts("last_syncpoint_ts", last_syncpoint_ts)
        after = last_syncpoint_ts or checkpoint_ts
        self._next_syncpoint = (
            None if self._interval_ms is None else _first_syncpoint(after, self._interval_ms)
        )
        if ddl_resolved_ts is not None:
            _check_config_ts("ddl_resolved_ts", ddl_resolved_ts)
        self._ddl_resolved_ts = ddl_resolved_ts
        self._seq = 0
        # (commit_ts, arrival seq, event), sorted: the seq keeps equal TSs in arrival order.
        self._queue: list[tuple[int, int, DDLEvent]] = []
        self._pending: dict[_Key, tuple[int, int, DDLEvent]] = {}
        self._ready: set[_Key] = set()
        # Only entries above the checkpoint: anything at or below it is refused anyway.
        self._newest_ts: dict[int, int] = {}
        self._recent_done: dict[_Key, DDLEvent] = {}
        # What the last barrier() held back: (event, is_global), in queue order.
        self._announced: tuple[tuple[DDLEvent, bool], ...] = ()

    # ----------------------------------------------------------------- read-only view
    @property
    def pending(self) -> tuple[DDLEvent, ...]:
        """DDLs added and not yet done, in commit-ts order."""
        return tuple(event for _, _, event in self._queue)

    @property
    def next_syncpoint_ts(self) -> int | None:
        """The next syncpoint not yet recorded (None when syncpoints are off)."""
        return self._next_syncpoint

    @property
    def ddl_resolved_ts(self) -> int | None:
        """How far the DDL stream is known complete (None: not tracked)."""
        return self._ddl_resolved_ts

    @property
    def checkpoint_ts(self) -> int:
        """The highest changefeed checkpoint seen (at start, or passed to a query)."""
        return self._checkpoint_ts

    def __repr__(self) -> str:
        return (
            f"DDLManager(checkpoint_ts={self._checkpoint_ts}, pending={len(self._queue)}, "
            f"next_syncpoint_ts={self._next_syncpoint}, target_ts={self._target_ts})"
        )

    # ----------------------------------------------------------------- inputs
    def add_ddl(self, event: DDLEvent) -> bool:
        """Queue a DDL from the DDL stream; False when ignored (a duplicate, or after target_ts)."""
        if not isinstance(event, DDLEvent):
            raise InvalidMessageError(f"add_ddl takes a DDLEvent, got {event!r}")
        if self._is_duplicate(event):
            return False
        self._check_arrival(event)
        if self._target_ts is not None and event.commit_ts > self._target_ts:
            log.info(
                "%s ignored: after target_ts %s, the changefeed ends first", event, self._target_ts
            )
            return False
        entry = (event.commit_ts, self._seq, event)
        self._seq += 1
        bisect.insort(self._queue, entry)
        self._pending[_key(event)] = entry
        for table_id in event.touched:
            self._newest_ts[table_id] = event.commit_ts
        self._check_invariant()
        return True

    def advance_ddl_resolved(self, ddl_resolved_ts: int) -> None:
        """The DDL stream promises every DDL with commit_ts <= ``ddl_resolved_ts`` was added."""
        if self._ddl_resolved_ts is None:
            raise ConfigError(
                "advance_ddl_resolved called on a DDLManager built without ddl_resolved_ts; "
                "pass ddl_resolved_ts= to the constructor to track the DDL stream"
            )
        check_ts("ddl_resolved_ts", ddl_resolved_ts)
        # Resolved marks never go back; a lower one (a replay) says nothing new.
        self._ddl_resolved_ts = max(self._ddl_resolved_ts, ddl_resolved_ts)

    def _is_duplicate(self, event: DDLEvent) -> bool:
        seen = self._pending.get(_key(event))
        known = seen[2] if seen is not None else self._recent_done.get(_key(event))
        if known is None:
            return False
        if known != event:
            raise ProtocolError(
                f"{event} conflicts with the DDL already added with the same commit_ts and query "
                f"({known!r}); the DDL stream must deliver one event per DDL"
            )
        log.debug("%s delivered again, ignored", event)
        return True

    def _check_arrival(self, event: DDLEvent) -> None:
        if event.commit_ts <= self._checkpoint_ts:
            raise ProtocolError(
                f"{event} is at or below the changefeed checkpoint {self._checkpoint_ts}: "
                "it arrived after every table passed it; rebuild the DDL manager from an "
                "earlier checkpoint"
            )
        if self._ddl_resolved_ts is not None and event.commit_ts <= self._ddl_resolved_ts:
            raise ProtocolError(
                f"{event} arrived after the DDL stream resolved past it "
                f"(ddl_resolved_ts {self._ddl_resolved_ts}); fix the DDL stream's resolved marks"
            )
        for table_id in event.touched:
            newest = self._newest_ts.get(table_id)
            if newest is not None and event.commit_ts <= newest:
                raise ProtocolError(
                    f"{event} is out of order for table {table_id}, which already has a DDL at "
                    f"commit_ts {newest}; the DDL stream must deliver each table's DDLs in "
                    "commit-ts order"
                )

    # ----------------------------------------------------------------- barrier
    def barrier(self, current_tables: Container[int]) -> Barrier:
        """The barriers to broadcast now; ``current_tables`` is the changefeed's table set (a set).

        Open (:class:`Barrier` ``open_until_ts``) when the global barrier is only the DDL
        stream's resolved ts: no DDL and no target ts holds the changefeed there.
        Costs O(pending DDLs below the global barrier): membership is asked only for
        tables those DDLs touch.
        """
        hard = MAX_TS if self._target_ts is None else self._target_ts
        stream = self._ddl_resolved_ts
        global_ts = hard if stream is None else min(hard, stream)
        by_ddl = False
        heads: dict[int, int] = {}
        announced: list[tuple[DDLEvent, bool]] = []
        for commit_ts, _, event in self._queue:
            if commit_ts > global_ts:
                break  # sorted: everything after is held back by the global barrier anyway
            table_id = event.blocks_only(current_tables)
            if table_id is None:
                global_ts, by_ddl = commit_ts, True  # the first global DDL in commit-ts order
                announced.append((event, True))
            elif table_id not in heads:  # only a table's earliest DDL is its barrier
                heads[table_id] = commit_ts
                announced.append((event, False))
        self._announced = tuple(announced)
        # A table barrier at or above the global one would hold nothing more back.
        table_barriers = {t: ts for t, ts in heads.items() if ts < global_ts}
        opened = stream is not None and not by_ddl and global_ts == stream < hard
        return Barrier(global_ts, table_barriers, hard if opened else 0)

    # ----------------------------------------------------------------- ready / done
    def ready(
        self, table_checkpoint: Callable[[int], int], changefeed_checkpoint: int
    ) -> list[DDLEvent]:
        """DDLs that may run now, in commit-ts order; ``table_checkpoint(t)``: table t's checkpoint.

        A table barrier DDL is ready once its table's checkpoint reached its commit_ts; a
        global DDL once the changefeed checkpoint did and every DDL before it is done.
        """
        self._observe_checkpoint(changefeed_checkpoint)
        head = self._queue[0][2] if self._queue else None
        out: list[DDLEvent] = []
        for event, is_global in self._announced:
            key = _key(event)
            if key not in self._pending:
                continue  # done since the last barrier()
            if not self.after_syncpoints(event.commit_ts):
                continue  # the syncpoint below it lists the tables as they were: first
            if is_global:
                ok = event is head and changefeed_checkpoint >= event.commit_ts
            else:
                ok = table_checkpoint(event.table_ids[0]) >= event.commit_ts
            if ok:
                self._ready.add(key)
                out.append(event)
        return out

    def ddl_done(self, event: DDLEvent) -> TableSetChange:
        """The DDL ran downstream: its barrier moves on. Returns the table set change it makes."""
        key = _key(event)
        entry = self._pending.get(key)
        if entry is None or entry[2] != event:
            raise ProtocolError(
                f"ddl_done for {event}, which is not pending: it was already done or never "
                "added; report each DDL done once"
            )
        if key not in self._ready:
            raise ProtocolError(
                f"ddl_done for {event}, which is not ready: the checkpoint of what it blocks "
                "has not reached its commit_ts; run only DDLs that ready() returned"
            )
        del self._queue[bisect.bisect_left(self._queue, entry[:2])]
        del self._pending[key]
        self._ready.discard(key)
        self._recent_done[key] = event
        self._check_invariant()
        return TableSetChange(event.commit_ts, added=event.creates, removed=event.drops)

    # ----------------------------------------------------------------- syncpoints, end
    def after_syncpoints(self, ts: int) -> bool:
        """True when every syncpoint below ``ts`` was recorded: a DDL or table-set change at
        ``ts`` may change the table set (one exactly at a syncpoint goes first)."""
        return self._next_syncpoint is None or self._next_syncpoint >= ts

    def ready_syncpoint(self, changefeed_checkpoint: int) -> int | None:
        """Syncpoint TS to record now; None if unreached, a DDL at or before it waits, or off."""
        self._observe_checkpoint(changefeed_checkpoint)
        return self._syncpoint_if_ready()

    def syncpoint_done(self, ts: int) -> None:
        """The syncpoint at ``ts`` was recorded downstream; the next one becomes the barrier."""
        ready = self._syncpoint_if_ready()
        if ready is None or ts != ready:
            raise ProtocolError(
                f"syncpoint_done({ts}) but the syncpoint ready to record is {ready} (next "
                f"syncpoint {self._next_syncpoint}, checkpoint {self._checkpoint_ts}); record "
                "only the TS ready_syncpoint() returned, once"
            )
        assert self._interval_ms is not None
        self._next_syncpoint = add_ms(ts, self._interval_ms)
        self._check_invariant()

    def _syncpoint_if_ready(self) -> int | None:
        sp = self._next_syncpoint
        if sp is None or self._checkpoint_ts < sp:
            return None
        # A DDL at the syncpoint's TS is part of the snapshot at that TS: it runs first.
        if self._queue and self._queue[0][0] <= sp:
            return None
        return sp

    def finished(self, changefeed_checkpoint: int) -> bool:
        """True once the checkpoint reached target_ts and everything at or before it ran."""
        self._observe_checkpoint(changefeed_checkpoint)
        target = self._target_ts
        if target is None or self._checkpoint_ts < target or self._queue:
            return False
        return self._next_syncpoint is None or self._next_syncpoint > target

    # ----------------------------------------------------------------- internals
    def _observe_checkpoint(self, changefeed_checkpoint: int) -> None:
        check_ts("changefeed_checkpoint", changefeed_checkpoint)
        if changefeed_checkpoint <= self._checkpoint_ts:
            return
        self._checkpoint_ts = changefeed_checkpoint
        # Records at or below the checkpoint are redundant with the checkpoint rule.
        cp = changefeed_checkpoint
        self._newest_ts = {t: ts for t, ts in self._newest_ts.items() if ts > cp}
        self._recent_done = {k: e for k, e in self._recent_done.items() if k[0] > cp}

    def _check_invariant(self) -> None:
        last: dict[int, int] = {}
        for i, (commit_ts, _, event) in enumerate(self._queue):
            if i and self._queue[i - 1][:2] >= (commit_ts, self._queue[i][1]):
                raise DDLManagerInvariantError(f"pending DDLs out of order at {event}")
            if self._pending.get(_key(event)) != self._queue[i]:
                raise DDLManagerInvariantError(f"{event} queued but not indexed")
            for table_id in event.touched:
                if last.get(table_id, -1) >= commit_ts:
                    raise DDLManagerInvariantError(f"table {table_id}: {event} not after {last}")
                last[table_id] = commit_ts
        if len(self._pending) != len(self._queue) or not self._ready <= self._pending.keys():
            raise DDLManagerInvariantError("pending index, queue and ready set disagree")


def _check_config_ts(name: str, value: int) -> None:
    if type(value) is not int or not 0 <= value <= MAX_TS:
        raise ConfigError(f"{name} must be an int TS in [0, 2^63), got {value!r}")


def _check_target(target_ts: int | None, checkpoint_ts: int) -> int | None:
    if target_ts is None:
        return None
    _check_config_ts("target_ts", target_ts)
    if target_ts < checkpoint_ts:
        raise ConfigError(
            f"target_ts {target_ts} is below the checkpoint {checkpoint_ts}: the changefeed "
            "would already be past its end; set a later target_ts or none"
        )
    return target_ts


def _check_interval(interval_ms: int | None) -> int | None:
    if interval_ms is not None and (type(interval_ms) is not int or interval_ms <= 0):
        raise ConfigError(
            "sync_point_interval_ms must be a positive int (milliseconds) or None, "
            f"got {interval_ms!r}"
        )
    return interval_ms

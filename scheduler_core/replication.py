"""ReplicationSet: the owner's state machine for one table.

Semantics follow TiCDC scheduler v3 (``replication_set.go``). ``poll`` runs the transition
table in :mod:`scheduler_core.transitions`: it looks up the row for (set state, shape,
reporting capture's role, reported table state) and carries it out (next state, roles,
dispatch, whether the report's checkpoint is taken). Every case, and each deliberate
difference from TiCDC with the scenario behind it, is read there. The plain paths, for
orientation::

    add     ABSENT -add_table-> PREPARE, prepare(s) -s Prepared-> COMMIT, s promoted,
            commit(s) -s Replicating-> REPLICATING
    move    REPLICATING -move_table-> PREPARE, prepare(s) -s Prepared-> COMMIT, remove(p)
            -p Stopped-> s promoted, commit(s) at p's final checkpoint -s Replicating->
            REPLICATING
    remove  REPLICATING -remove_table-> REMOVING, remove(p) -p Stopped-> removed

Code here does only what a row cannot say: the checkpoint arithmetic (component-wise max,
never regressing), whether an Undetermined capture holds the table (a promoting row's
``WHILE_UNDETERMINED`` twin runs then), resolving ``UNOWNED`` by whether captures remain,
rebuilding a set from the captures' reports (an owner switch), the admin requests (each
sets up its shape and feeds the table a report), and the invariant check.

Invariants, checked before and after every step: at most one primary, and it is in
``captures`` with the PRIMARY role; PREPARE/COMMIT/REPLICATING have at least one capture;
REPLICATING has a primary and no secondary; at most one secondary; ABSENT has no capture;
an empty REMOVING set is a removed table; checkpoints never regress.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

from scheduler_core.errors import MultiplePrimaryError, SchedulerError
from scheduler_core.messages import AddTableRequest, Dispatch, RemoveTableRequest
from scheduler_core.model import Checkpoint, ReplicationSetState, Role, TableState, TableStatus
from scheduler_core.transitions import STEPS, Send, Step

log = logging.getLogger(__name__)

S = ReplicationSetState
T = TableState

_STOPPED_OR_ABSENT = (T.STOPPED, T.ABSENT)


class ReplicationSetInvariantError(SchedulerError):
    """A replication set reached a state its invariants forbid (a bug, never input)."""


class ReplicationSet:
    """Owner-side view of one table: its state and which captures hold it in which role."""

    __slots__ = ("_captures", "_checkpoint", "_dropping", "primary", "state", "table_id")

    def __init__(self, table_id: int, checkpoint: Checkpoint) -> None:
        self.table_id = table_id
        self.state = S.ABSENT
        self.primary: str | None = None
        self._captures: dict[str, Role] = {}
        self._checkpoint = checkpoint
        self._dropping = False  # REMOVING because the table leaves the changefeed

    # ----------------------------------------------------------------- construction
    @classmethod
    def rebuild(
        cls, table_id: int, checkpoint: Checkpoint, reports: Mapping[str, TableStatus]
    ) -> ReplicationSet:
        """Rebuild from what the captures report (the owner-switch path)."""
        rs = cls(table_id, checkpoint)
        for capture_id, status in reports.items():
            if status.table_id != table_id:
                raise ReplicationSetInvariantError(
                    f"rebuild of table {table_id} got a report for table {status.table_id} "
                    f"from capture {capture_id!r}"
                )
        held = {c: s for c, s in reports.items() if s.state not in _STOPPED_OR_ABSENT}
        primaries = [c for c, s in held.items() if s.state == T.REPLICATING]
        if len(primaries) > 1:
            raise MultiplePrimaryError(table_id, primaries)
        # Two secondaries cannot come from one owner; keep the more advanced one (Prepared
        # over Preparing, then the higher checkpoint) and treat the other as stopping.
        preparing = [c for c, s in held.items() if s.state in (T.PREPARING, T.PREPARED)]
        secondary = max(
            preparing,
            key=lambda c: (held[c].state == T.PREPARED, held[c].checkpoint.checkpoint_ts),
            default=None,
        )
        for capture_id, status in held.items():
            if status.state == T.REPLICATING:
                rs._captures[capture_id] = Role.PRIMARY
                rs.primary = capture_id
            elif capture_id == secondary:
                rs._captures[capture_id] = Role.SECONDARY
            else:
                log.warning("table %s: capture %s is stopping during rebuild", table_id, capture_id)
                rs._captures[capture_id] = Role.UNDETERMINED
        # Progress comes from the primary only; with none, from every holder and every
        # Stopped report: the next primary starts at the old one's final checkpoint, which
        # is at least what a stopping capture sank and what a secondary prepares from.
        if rs.primary is not None:
            rs._update_checkpoint(held[rs.primary].checkpoint)
        else:
            for status in reports.values():
                if status.state != T.ABSENT:
                    rs._update_checkpoint(status.checkpoint)
        committed = secondary is not None and held[secondary].state == T.PREPARED
        rs.state = cls._rebuilt_state(rs, committed)
        rs._check_invariant()
        return rs

    @classmethod
    def committing(cls, table_id: int, capture_id: str, checkpoint: Checkpoint) -> ReplicationSet:
        """COMMIT with ``capture_id`` promoted and told to sink (an add's second phase)."""
        rs = cls(table_id, checkpoint)
        rs.state = S.COMMIT
        rs.primary = capture_id
        rs._captures[capture_id] = Role.PRIMARY
        rs._check_invariant()
        return rs

    @staticmethod
    def _rebuilt_state(rs: ReplicationSet, committed: bool) -> ReplicationSetState:
        if not rs._captures:
            return S.ABSENT
        if committed:
            return S.COMMIT
        if rs.secondary is not None:
            return S.PREPARE
        if rs.primary is not None:
            return S.REPLICATING
        # Only Undetermined captures: nobody may be promoted until they stop.
        return S.REMOVING

    # ----------------------------------------------------------------- read-only view
    @property
    def captures(self) -> Mapping[str, Role]:
        """Captures holding the table, with their roles (read-only)."""
        return MappingProxyType(self._captures)

    @property
    def secondary(self) -> str | None:
        """The capture preparing the table, if any."""
        for capture_id, role in self._captures.items():
            if role == Role.SECONDARY:
                return capture_id
        return None

    @property
    def checkpoint(self) -> Checkpoint:
        """The table's progress as last reported; never regresses."""
        return self._checkpoint

    @property
    def removed(self) -> bool:
        """True once the table was removed (``handle_remove_table``) and no capture holds it."""
        return self._dropping and self.state == S.REMOVING and not self._captures

    def has_undetermined(self) -> bool:
        """Whether a capture of unknown state (possibly still writing) holds the table."""
        return Role.UNDETERMINED in self._captures.values()

    def __repr__(self) -> str:
        return (
            f"ReplicationSet(table_id={self.table_id}, state={self.state.name}, "
            f"primary={self.primary!r}, captures={dict(self._captures)}, "
            f"checkpoint={self._checkpoint})"
        )

    # ----------------------------------------------------------------- handlers
    def poll(self, status: TableStatus, from_capture: str) -> list[Dispatch]:
        """Feed one capture's report; run its row of the transition table (<= 1 dispatch)."""
        role = self._captures.get(from_capture)
        if role is None:
            return []  # a capture outside the set: stale or unknown, ignore
        if status.table_id != self.table_id:
            raise ReplicationSetInvariantError(
                f"table {self.table_id} polled with a status for table {status.table_id}"
            )
        self._check_invariant()
        secondary = self.secondary
        key = (self.state, self.primary is not None, secondary is not None, role, status.state)
        step = STEPS.get(key)
        if step is None:
            raise ReplicationSetInvariantError(f"no transition for {key}: {self!r}")
        if step.waiting is not None and self.has_undetermined():
            log.info("table %s: waiting for undetermined captures before promoting", self.table_id)
            step = step.waiting
        # A row names captures by their role before the step: the primary, the secondary,
        # or the reporter (the one Undetermined capture a step may change).
        out = self._run(step, status, (self.primary, secondary, from_capture))
        self._check_invariant()
        return out

    def handle_add_table(self, capture_id: str) -> list[Dispatch]:
        """Start adding the table to ``capture_id`` (ignored unless ABSENT)."""
        if self.state != S.ABSENT:
            log.warning("table %s: add to %s ignored in %s", self.table_id, capture_id, self.state)
            return []
        self.state = S.PREPARE
        self._captures[capture_id] = Role.SECONDARY
        return self.poll(self._absent(), capture_id)

    def handle_move_table(self, dest_capture_id: str) -> list[Dispatch]:
        """Start moving the table to ``dest_capture_id`` (ignored unless REPLICATING elsewhere)."""
        if self.state != S.REPLICATING or self.primary == dest_capture_id:
            log.warning(
                "table %s: move to %s ignored in %s (primary %s)",
                self.table_id,
                dest_capture_id,
                self.state.name,
                self.primary,
            )
            return []
        if dest_capture_id in self._captures:
            log.warning(
                "table %s: move to %s ignored, it holds the table", self.table_id, dest_capture_id
            )
            return []
        self.state = S.PREPARE
        self._captures[dest_capture_id] = Role.SECONDARY
        return self.poll(self._absent(), dest_capture_id)

    def handle_remove_table(self) -> list[Dispatch]:
        """Start removing the table (ignored unless REPLICATING)."""
        if self.removed or self.state != S.REPLICATING:
            log.warning("table %s: remove ignored in %s", self.table_id, self.state.name)
            return []
        self.state = S.REMOVING
        self._dropping = True
        assert self.primary is not None
        return self.poll(TableStatus(self.table_id, T.REPLICATING, self._checkpoint), self.primary)

    def handle_capture_shutdown(self, capture_id: str) -> tuple[list[Dispatch], bool]:
        """A capture is gone: treat its table as Stopped. Returns (dispatches, affected)."""
        if capture_id not in self._captures:
            return [], False
        return self.poll(TableStatus(self.table_id, T.STOPPED, self._checkpoint), capture_id), True

    # ----------------------------------------------------------------- the machine
    def _run(
        self, step: Step, status: TableStatus, holders: tuple[str | None, str | None, str]
    ) -> list[Dispatch]:
        """Carry out one row; ``holders`` are the captures in each role (indexed by Role)."""
        if step.raises:
            raise MultiplePrimaryError(self.table_id, [self.primary or "?", holders[-1]])
        if step.advance:
            self._update_checkpoint(status.checkpoint)
        for before, after in step.changes:
            capture_id = holders[before]
            assert capture_id is not None
            self._change_role(capture_id, after)
        if step.state is not None:
            self.state = step.state
        else:  # UNOWNED: Undetermined captures must stop first; a removed table stays removed
            self.state = S.REMOVING if self._captures or self._dropping else S.ABSENT
        to = None if step.to is None else holders[step.to]
        if step.send is None or to is None:
            return []
        if step.send == Send.REMOVE:
            return [RemoveTableRequest(to, self.table_id)]
        return [AddTableRequest(to, self.table_id, step.send == Send.PREPARE, self._checkpoint)]

    def _change_role(self, capture_id: str, role: Role | None) -> None:
        if role is None:
            del self._captures[capture_id]
        else:
            self._captures[capture_id] = role
        if role == Role.PRIMARY:
            self.primary = capture_id
        elif capture_id == self.primary:
            self.primary = None

    # ----------------------------------------------------------------- helpers
    def _absent(self) -> TableStatus:
        return TableStatus(self.table_id, T.ABSENT, self._checkpoint)

    def _update_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._checkpoint = self._checkpoint.advanced(checkpoint)

    def _check_invariant(self) -> None:
        roles = self._captures
        values = list(roles.values())
        n_primary, n_secondary = values.count(Role.PRIMARY), values.count(Role.SECONDARY)
        ok = (
            (
                (n_primary == 0 and self.primary is None)
                or (n_primary == 1 and roles.get(self.primary) == Role.PRIMARY)  # type: ignore[arg-type]
            )
            and n_secondary <= 1
            and (roles or self.state in (S.ABSENT, S.REMOVING))
            and (self.state != S.REPLICATING or (self.primary is not None and not n_secondary))
            and (self.state != S.ABSENT or not roles)
            and (roles or self.state != S.REMOVING or self._dropping)
        )
        if not ok:
            raise ReplicationSetInvariantError(f"invariant broken: {self!r}")

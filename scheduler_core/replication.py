"""ReplicationSet: the owner's state machine for one table.

Semantics follow TiCDC scheduler v3 (``replication_set.go``). The transitions are data in
:mod:`scheduler_core.transitions` (every set state x capture role x reported table state,
checked against this code by ``tests/unit/replication/test_transitions.py``); in short::

    ABSENT      --add_table-->                          PREPARE (secondary), send prepare
    PREPARE     --secondary Absent-->                   re-send prepare (lost, or restarted)
    PREPARE     --secondary Prepared-->                 COMMIT
    PREPARE     --secondary Stopping/Stopped-->         REPLICATING (if primary) | ABSENT |
                                                        REMOVING (Undetermined remain)
    PREPARE     --primary Stopping-->                   primary becomes Undetermined
    PREPARE     --primary Stopped/Absent-->             no primary: promote once prepared
    COMMIT      --secondary Prepared, primary-->        send Remove(primary)
    COMMIT      --secondary Prepared, no primary-->     promote + send commit, unless an
                                                        Undetermined capture remains
    COMMIT      --primary Stopped/Absent-->             promote secondary, send commit | ABSENT
    COMMIT      --primary Replicating, no secondary-->  REPLICATING
    REPLICATING --move_table-->                         PREPARE (dest as secondary)
    REPLICATING --primary Stopped/Absent-->             ABSENT | REMOVING (Undetermined remain)
    REPLICATING --remove_table-->                       REMOVING, send Remove(primary)
    REMOVING    --every capture Stopped/Absent-->       removed (remove_table) | ABSENT
    any         --Undetermined Stopped/Absent-->        it leaves; --other report--> Remove(it)

Where a table's checkpoint comes from: only the primary's reports (Replicating, Stopping,
Stopped); with no primary, the Stopped report of an Undetermined capture (its final
checkpoint, where the next primary starts). An Absent report carries no progress; a
rebuild takes the primary's checkpoint, or with none every holder's.

Deliberate differences from TiCDC scheduler v3, each with the scenario behind it:

1. *A primary that reports Stopping during PREPARE is kept as Undetermined*, not cleared
   (TiCDC clears it). It may still flush; promoting the secondary then would make two
   writers (planted bug ``promote_while_undetermined``, soak profile
   ``slow_stop_owner_churn``).
2. *An Undetermined capture is cleared in every state once it reports Absent or Stopped,
   and no secondary is promoted while one remains* (TiCDC only handles it in rebuild).
   Scenario: owner switch during a move; rebuilt {A Stopping, B Prepared}; promoting B
   before A stopped gives two writers.
3. *No primary, no secondary, Undetermined remain -> REMOVING, then ABSENT* (TiCDC goes
   ABSENT at once). Re-adding while the old holder may still write would double-write; a
   capture leaves the set exactly once (issue 10: a secondary's Stopped fed twice raised
   KeyError, aborted ``handle_capture_removed`` and stalled the changefeed).
4. *Checkpoint only from the primary* (TiCDC takes any capture's). Rebuilt {B Replicating
   at 100, A Stopping}; A's Stopped at 150 made the table checkpoint 150 while B was at
   100, and a table DDL at 140 ran early.
5. *Rebuild keeps the more advanced of two Preparing/Prepared captures as secondary*
   (Prepared first, then the higher checkpoint); TiCDC keeps whichever came first.

Invariants, checked on every step: at most one primary, and it is in ``captures`` with
the PRIMARY role; PREPARE/COMMIT/REPLICATING have at least one capture; REPLICATING has
a primary and no secondary; at most one secondary; ABSENT has no capture; an empty
REMOVING set is a removed table; checkpoints never regress.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

from scheduler_core.errors import MultiplePrimaryError, SchedulerError
from scheduler_core.messages import AddTableRequest, Dispatch, RemoveTableRequest
from scheduler_core.model import Checkpoint, ReplicationSetState, Role, TableState, TableStatus

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
        """Feed one capture's report; return the dispatches it calls for (at most one)."""
        if from_capture not in self._captures:
            return []  # a capture outside the set: stale or unknown, ignore
        if status.table_id != self.table_id:
            raise ReplicationSetInvariantError(
                f"table {self.table_id} polled with a status for table {status.table_id}"
            )
        out: list[Dispatch] = []
        changed = True
        while changed:
            self._check_invariant()
            msg, changed = self._step(status, from_capture)
            if msg is not None:
                out.append(msg)
        self._check_invariant()
        assert len(out) <= 1, f"one poll emitted {out}"
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
    def _step(self, status: TableStatus, capture_id: str) -> tuple[Dispatch | None, bool]:
        if capture_id not in self._captures:
            # The report already took the capture out of the set (a secondary stopping while
            # an Undetermined capture keeps the set REMOVING): nothing more to do with it.
            return None, False
        if self.state == S.REMOVING:
            return self._on_removing(status, capture_id)
        if self._captures.get(capture_id) == Role.UNDETERMINED:
            return self._on_undetermined(status, capture_id)
        if self.state == S.ABSENT:
            return self._on_absent(status, capture_id)
        if self.state == S.PREPARE:
            return self._on_prepare(status, capture_id)
        if self.state == S.COMMIT:
            return self._on_commit(status, capture_id)
        if self.state == S.REPLICATING:
            return self._on_replicating(status, capture_id)
        return self._on_removing(status, capture_id)

    def _on_undetermined(
        self, status: TableStatus, capture_id: str
    ) -> tuple[Dispatch | None, bool]:
        # It was stopping (or a primary that began stopping): it may still write until
        # it reports Stopped or Absent, so nobody is promoted before that.
        if status.state in _STOPPED_OR_ABSENT:
            if self.primary is None and status.state == T.STOPPED:
                # With no primary, its final checkpoint is where the next primary starts.
                self._update_checkpoint(status.checkpoint)
            del self._captures[capture_id]
            if not self._captures:
                self.state = S.ABSENT
            return None, False
        if status.state == T.REPLICATING and self.primary is not None:
            raise MultiplePrimaryError(self.table_id, [self.primary, capture_id])
        if status.state in (T.REPLICATING, T.PREPARING, T.PREPARED):
            # Not ours to use: it must stop before anyone is promoted.
            return RemoveTableRequest(capture_id, self.table_id), False
        return None, False

    def _on_absent(self, status: TableStatus, capture_id: str) -> tuple[Dispatch | None, bool]:
        if status.state == T.ABSENT:
            self.state = S.PREPARE
            self._captures[capture_id] = Role.SECONDARY
            return None, True
        return self._ignore(status, capture_id)

    def _on_prepare(self, status: TableStatus, capture_id: str) -> tuple[Dispatch | None, bool]:
        role = self._captures.get(capture_id)
        st = status.state
        if role == Role.SECONDARY:
            if st == T.ABSENT:  # the add request was lost, or the capture restarted: re-send
                return AddTableRequest(capture_id, self.table_id, True, self._checkpoint), False
            if st == T.PREPARING:
                return None, False  # preparing may take long; nothing to do
            if st == T.PREPARED:
                self.state = S.COMMIT
                return None, True
            if st in (T.STOPPING, T.STOPPED):
                del self._captures[capture_id]
                self.state = S.REPLICATING if self.primary is not None else self._unowned_state()
                return None, True
        elif capture_id == self.primary:
            if st == T.REPLICATING:
                self._update_checkpoint(status.checkpoint)
                return None, False
            if st in _STOPPED_OR_ABSENT:
                self._update_final(status)
                # Primary gone while the secondary prepares: promote it once prepared.
                self._clear_primary()
                return None, False
            if st == T.STOPPING:
                # TiCDC clears the primary here; it may still be writing, so keep it
                # as Undetermined until it reports Stopped.
                self._update_checkpoint(status.checkpoint)
                self._demote_primary()
                return None, False
        return self._ignore(status, capture_id)

    def _on_commit(self, status: TableStatus, capture_id: str) -> tuple[Dispatch | None, bool]:
        st = status.state
        if st == T.PREPARED:
            return self._commit_on_prepared(capture_id), False
        if st in _STOPPED_OR_ABSENT:
            return self._commit_on_stopped(status, capture_id)
        if st == T.REPLICATING and capture_id == self.primary:
            self._update_checkpoint(status.checkpoint)
            if self.secondary is not None:
                # The source has not stopped yet: ask again.
                return RemoveTableRequest(capture_id, self.table_id), False
            self.state = S.REPLICATING
            return None, True
        if st == T.REPLICATING:
            raise MultiplePrimaryError(self.table_id, [self.primary or "?", capture_id])
        if st == T.STOPPING and capture_id == self.primary:
            self._update_checkpoint(status.checkpoint)
            return None, False
        return self._ignore(status, capture_id)

    def _commit_on_prepared(self, capture_id: str) -> Dispatch | None:
        if self._captures.get(capture_id) == Role.SECONDARY:
            if self.primary is not None:
                return RemoveTableRequest(self.primary, self.table_id)
            if self.has_undetermined():
                log.info(
                    "table %s: waiting for undetermined captures before promoting", self.table_id
                )
                return None
            self._promote(capture_id)
        if capture_id == self.primary and self.secondary is None:
            # Promoted, but still Prepared: the commit request was lost. Re-send.
            return AddTableRequest(capture_id, self.table_id, False, self._checkpoint)
        return None

    def _commit_on_stopped(
        self, status: TableStatus, capture_id: str
    ) -> tuple[Dispatch | None, bool]:
        if capture_id == self.primary:
            self._update_final(status)
            self._clear_primary()
            secondary = self.secondary
            if secondary is None:
                self.state = self._unowned_state()
                return None, True
            if self.has_undetermined():
                return None, False  # promote on the secondary's next Prepared report
            self._promote(secondary)
            # The new primary starts exactly at the final checkpoint of the old one.
            return AddTableRequest(secondary, self.table_id, False, self._checkpoint), False
        if self._captures.get(capture_id) == Role.SECONDARY:
            del self._captures[capture_id]
            if self.primary is None:
                self.state = self._unowned_state()
            return None, True
        return self._ignore(status, capture_id)

    def _on_replicating(self, status: TableStatus, capture_id: str) -> tuple[Dispatch | None, bool]:
        st = status.state
        if capture_id == self.primary:
            if st == T.REPLICATING:
                self._update_checkpoint(status.checkpoint)
                return None, False
            if st in _STOPPED_OR_ABSENT:
                self._update_final(status)
                self._clear_primary()
                self.state = self._unowned_state()
                return None, True
            if st == T.STOPPING:
                self._update_checkpoint(status.checkpoint)
                return None, False
        elif st == T.REPLICATING:
            raise MultiplePrimaryError(self.table_id, [self.primary or "?", capture_id])
        return self._ignore(status, capture_id)

    def _on_removing(self, status: TableStatus, capture_id: str) -> tuple[Dispatch | None, bool]:
        st = status.state
        if st in (T.PREPARING, T.PREPARED, T.REPLICATING):
            if st == T.REPLICATING and capture_id == self.primary:
                self._update_checkpoint(status.checkpoint)
            return RemoveTableRequest(capture_id, self.table_id), False
        if st in _STOPPED_OR_ABSENT:
            if capture_id == self.primary or (
                self.primary is None and self._captures[capture_id] == Role.UNDETERMINED
            ):
                self._update_final(status)
            if capture_id == self.primary:
                self._clear_primary()
            else:
                del self._captures[capture_id]
            if not self._captures and not self._dropping:
                # It only waited for Undetermined captures to stop: re-add it from here.
                self.state = S.ABSENT
            return None, False
        return None, False  # Stopping: wait

    # ----------------------------------------------------------------- helpers
    def _absent(self) -> TableStatus:
        return TableStatus(self.table_id, T.ABSENT, self._checkpoint)

    def _ignore(self, status: TableStatus, capture_id: str) -> tuple[None, bool]:
        log.debug(
            "table %s: ignore %s from %s in %s", self.table_id, status.state.name, capture_id, self
        )
        return None, False

    def _promote(self, capture_id: str) -> None:
        if self.primary is not None:
            del self._captures[self.primary]
        self._captures[capture_id] = Role.PRIMARY
        self.primary = capture_id

    def _clear_primary(self) -> None:
        if self.primary is not None:
            del self._captures[self.primary]
            self.primary = None

    def _update_final(self, status: TableStatus) -> None:
        # A Stopped report carries the capture's final checkpoint; an Absent one no progress.
        if status.state == T.STOPPED:
            self._update_checkpoint(status.checkpoint)

    def _update_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._checkpoint = self._checkpoint.advanced(checkpoint)

    def _demote_primary(self) -> None:
        if self.primary is not None:
            self._captures[self.primary] = Role.UNDETERMINED
            self.primary = None

    def _unowned_state(self) -> ReplicationSetState:
        # No primary and no secondary: Absent, unless Undetermined captures remain, which
        # must stop first (Removing; the manager re-adds the table once they are gone).
        return S.ABSENT if not self._captures else S.REMOVING

    def _check_invariant(self) -> None:
        roles = self._captures
        primaries = [c for c, r in roles.items() if r == Role.PRIMARY]
        secondaries = [c for c, r in roles.items() if r == Role.SECONDARY]
        ok = (
            len(primaries) <= 1
            and primaries == ([self.primary] if self.primary is not None else [])
            and len(secondaries) <= 1
            and (roles or self.state in (S.ABSENT, S.REMOVING))
            and (self.state != S.REPLICATING or (self.primary is not None and not secondaries))
            and (self.state != S.ABSENT or not roles)
            and (roles or self.state != S.REMOVING or self._dropping)
        )
        if not ok:
            raise ReplicationSetInvariantError(f"invariant broken: {self!r}")
        if len(primaries) > 1:
            raise MultiplePrimaryError(self.table_id, primaries)

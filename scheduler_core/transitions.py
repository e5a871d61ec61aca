"""ReplicationSet's transitions as data: the table ``ReplicationSet.poll`` runs.

Like h11's ``_state.py``: every transition is a row here, and :class:`ReplicationSet
<scheduler_core.replication.ReplicationSet>` only looks the row up and carries it out, so
what one reads here is what runs. Code outside the table does only what a row cannot say:
checkpoint arithmetic, the invariant check, rebuilding a set from reports, and the
admin requests (add, move, remove, capture shutdown), which feed a report into the table.

**Reading a row.** A key is (set state, shape, reporter, reported table state):

* *shape*: which of a primary and a secondary the set holds: ``'ps'``, ``'p'``, ``'s'``,
  or ``'-'`` (neither: only Undetermined captures). Undetermined captures may be present
  in any shape; they are not part of it.
* *reporter*: the reporting capture, named by its role: ``p`` the primary, ``s`` the
  secondary, ``u`` an Undetermined capture. A report from a capture outside the set is
  ignored in every state (ABSENT holds no capture, so it ignores every report).

A value is (next set state, roles after, dispatch, checkpoint), or :data:`RAISES`:

* *roles after*: ``<name><P|S|U>`` for ``p``, ``s`` and a reporting ``u`` (``sP``: the
  secondary was promoted); a name left out has left the set. Undetermined captures that
  did not report never change.
* *next state* :data:`UNOWNED`: neither primary nor secondary is left; the set is ABSENT
  (the manager re-adds the table), or REMOVING while Undetermined captures remain (they
  must stop first) or while the table is being removed (``handle_remove_table``; then an
  empty set is a removed table).
* *dispatch*: ``prepare(x)`` / ``commit(x)`` are an ``AddTableRequest`` (secondary or
  not) at the set's checkpoint after the step; ``remove(x)`` a ``RemoveTableRequest``.
* *checkpoint*: :data:`ADVANCE` takes the report's checkpoint (never regressing),
  :data:`HOLD` leaves it.
* :data:`RAISES`: two captures sink the table (:class:`~scheduler_core.errors.
  MultiplePrimaryError`); nothing changes.

A row that promotes the secondary (``sP``) has a twin in :data:`WHILE_UNDETERMINED`, which
runs instead while an Undetermined capture holds the table (``has_undetermined()``): it
may still write, so nobody is promoted yet.

**The rules, and where they differ from TiCDC scheduler v3** (``replication_set.go``),
each with the scenario behind it:

* A secondary's Absent re-sends its prepare (the add was lost, or it restarted); its
  Stopping or Stopped takes it out of the set (it never sank). A primary or Undetermined
  capture leaves only on Stopped or Absent.
* Promotion sends the commit at the set's checkpoint: the old primary's final one, or
  with no primary an Undetermined capture's final (Stopped) checkpoint.
* The checkpoint comes only from the primary's reports (Replicating, Stopping, Stopped;
  not its Stopping while the table is removed); with no primary, from an Undetermined
  capture's Stopped report. An Absent report carries no progress.

1. *A primary that reports Stopping during PREPARE becomes Undetermined*, not cleared
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
   (Prepared first, then the higher checkpoint); TiCDC keeps whichever came first
   (``ReplicationSet.rebuild``, code).

``tests/unit/replication/test_transitions.py`` runs every row through ``poll`` (with and
without an Undetermined bystander), explores every reachable set to show the table is
total and has no dead row, and checks each row against the safety rules above.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from scheduler_core.errors import SchedulerError
from scheduler_core.model import ReplicationSetState, Role, TableState

S = ReplicationSetState
ABSENT, PREPARING, PREPARED = TableState.ABSENT, TableState.PREPARING, TableState.PREPARED
REPLICATING, STOPPING, STOPPED = TableState.REPLICATING, TableState.STOPPING, TableState.STOPPED
PREPARE, COMMIT, REMOVING = S.PREPARE, S.COMMIT, S.REMOVING
RAISES = "raises MultiplePrimaryError"
UNOWNED = "unowned"
ADVANCE, HOLD = "advance", "hold"

Key = tuple[ReplicationSetState, str, str, TableState]
Row = tuple[ReplicationSetState | str, str, str | None, str]

# (set state, shape) -> how a set of that shape arises.
SHAPES: dict[tuple[ReplicationSetState, str], str] = {
    (PREPARE, "s"): "an add (handle_add_table), or rebuilt from {Preparing}",
    (PREPARE, "ps"): "a move (handle_move_table), or rebuilt from {Replicating, Preparing}",
    (COMMIT, "p"): "an add's second phase: the secondary promoted, its commit sent",
    (COMMIT, "s"): "rebuilt from {Prepared}, or the primary left and promotion waits",
    (COMMIT, "ps"): "a move's second phase: the primary told to stop",
    (S.REPLICATING, "p"): "one capture sinks the table",
    (REMOVING, "p"): "handle_remove_table: the primary told to stop",
    (REMOVING, "-"): "only Undetermined captures left: they must stop before a re-add",
}

# fmt: off
TRANSITIONS: dict[Key, Row | str] = {
    # PREPARE, s: a secondary prepares; no primary
    (PREPARE, 's', 's', ABSENT):      (PREPARE, 'sS', 'prepare(s)', HOLD),
    (PREPARE, 's', 's', PREPARING):   (PREPARE, 'sS', None, HOLD),
    (PREPARE, 's', 's', PREPARED):    (COMMIT, 'sP', 'commit(s)', HOLD),
    (PREPARE, 's', 's', REPLICATING): (PREPARE, 'sS', None, HOLD),
    (PREPARE, 's', 's', STOPPING):    (UNOWNED, '', None, HOLD),
    (PREPARE, 's', 's', STOPPED):     (UNOWNED, '', None, HOLD),
    (PREPARE, 's', 'u', ABSENT):      (PREPARE, 'sS', None, HOLD),
    (PREPARE, 's', 'u', PREPARING):   (PREPARE, 'sS uU', 'remove(u)', HOLD),
    (PREPARE, 's', 'u', PREPARED):    (PREPARE, 'sS uU', 'remove(u)', HOLD),
    (PREPARE, 's', 'u', REPLICATING): (PREPARE, 'sS uU', 'remove(u)', HOLD),
    (PREPARE, 's', 'u', STOPPING):    (PREPARE, 'sS uU', None, HOLD),
    (PREPARE, 's', 'u', STOPPED):     (PREPARE, 'sS', None, ADVANCE),
    # PREPARE, ps: a move's first phase; the primary keeps sinking
    (PREPARE, 'ps', 'p', ABSENT):      (PREPARE, 'sS', None, HOLD),
    (PREPARE, 'ps', 'p', PREPARING):   (PREPARE, 'pP sS', None, HOLD),
    (PREPARE, 'ps', 'p', PREPARED):    (PREPARE, 'pP sS', None, HOLD),
    (PREPARE, 'ps', 'p', REPLICATING): (PREPARE, 'pP sS', None, ADVANCE),
    (PREPARE, 'ps', 'p', STOPPING):    (PREPARE, 'pU sS', None, ADVANCE),
    (PREPARE, 'ps', 'p', STOPPED):     (PREPARE, 'sS', None, ADVANCE),
    (PREPARE, 'ps', 's', ABSENT):      (PREPARE, 'pP sS', 'prepare(s)', HOLD),
    (PREPARE, 'ps', 's', PREPARING):   (PREPARE, 'pP sS', None, HOLD),
    (PREPARE, 'ps', 's', PREPARED):    (COMMIT, 'pP sS', 'remove(p)', HOLD),
    (PREPARE, 'ps', 's', REPLICATING): (PREPARE, 'pP sS', None, HOLD),
    (PREPARE, 'ps', 's', STOPPING):    (S.REPLICATING, 'pP', None, HOLD),
    (PREPARE, 'ps', 's', STOPPED):     (S.REPLICATING, 'pP', None, HOLD),
    (PREPARE, 'ps', 'u', ABSENT):      (PREPARE, 'pP sS', None, HOLD),
    (PREPARE, 'ps', 'u', PREPARING):   (PREPARE, 'pP sS uU', 'remove(u)', HOLD),
    (PREPARE, 'ps', 'u', PREPARED):    (PREPARE, 'pP sS uU', 'remove(u)', HOLD),
    (PREPARE, 'ps', 'u', REPLICATING): RAISES,
    (PREPARE, 'ps', 'u', STOPPING):    (PREPARE, 'pP sS uU', None, HOLD),
    (PREPARE, 'ps', 'u', STOPPED):     (PREPARE, 'pP sS', None, HOLD),
    # COMMIT, p: promoted, waiting for it to report Replicating
    (COMMIT, 'p', 'p', ABSENT):      (UNOWNED, '', None, HOLD),
    (COMMIT, 'p', 'p', PREPARING):   (COMMIT, 'pP', None, HOLD),
    (COMMIT, 'p', 'p', PREPARED):    (COMMIT, 'pP', 'commit(p)', HOLD),
    (COMMIT, 'p', 'p', REPLICATING): (S.REPLICATING, 'pP', None, ADVANCE),
    (COMMIT, 'p', 'p', STOPPING):    (COMMIT, 'pP', None, ADVANCE),
    (COMMIT, 'p', 'p', STOPPED):     (UNOWNED, '', None, ADVANCE),
    (COMMIT, 'p', 'u', ABSENT):      (COMMIT, 'pP', None, HOLD),
    (COMMIT, 'p', 'u', PREPARING):   (COMMIT, 'pP uU', 'remove(u)', HOLD),
    (COMMIT, 'p', 'u', PREPARED):    (COMMIT, 'pP uU', 'remove(u)', HOLD),
    (COMMIT, 'p', 'u', REPLICATING): RAISES,
    (COMMIT, 'p', 'u', STOPPING):    (COMMIT, 'pP uU', None, HOLD),
    (COMMIT, 'p', 'u', STOPPED):     (COMMIT, 'pP', None, HOLD),
    # COMMIT, s: prepared, no primary: promote it
    (COMMIT, 's', 's', ABSENT):      (UNOWNED, '', None, HOLD),
    (COMMIT, 's', 's', PREPARING):   (COMMIT, 'sS', None, HOLD),
    (COMMIT, 's', 's', PREPARED):    (COMMIT, 'sP', 'commit(s)', HOLD),
    (COMMIT, 's', 's', REPLICATING): RAISES,
    (COMMIT, 's', 's', STOPPING):    (COMMIT, 'sS', None, HOLD),
    (COMMIT, 's', 's', STOPPED):     (UNOWNED, '', None, HOLD),
    (COMMIT, 's', 'u', ABSENT):      (COMMIT, 'sS', None, HOLD),
    (COMMIT, 's', 'u', PREPARING):   (COMMIT, 'sS uU', 'remove(u)', HOLD),
    (COMMIT, 's', 'u', PREPARED):    (COMMIT, 'sS uU', 'remove(u)', HOLD),
    (COMMIT, 's', 'u', REPLICATING): (COMMIT, 'sS uU', 'remove(u)', HOLD),
    (COMMIT, 's', 'u', STOPPING):    (COMMIT, 'sS uU', None, HOLD),
    (COMMIT, 's', 'u', STOPPED):     (COMMIT, 'sS', None, ADVANCE),
    # COMMIT, ps: the secondary is prepared; the primary must stop before it is promoted
    (COMMIT, 'ps', 'p', ABSENT):      (COMMIT, 'sP', 'commit(s)', HOLD),
    (COMMIT, 'ps', 'p', PREPARING):   (COMMIT, 'pP sS', None, HOLD),
    (COMMIT, 'ps', 'p', PREPARED):    (COMMIT, 'pP sS', None, HOLD),
    (COMMIT, 'ps', 'p', REPLICATING): (COMMIT, 'pP sS', 'remove(p)', ADVANCE),
    (COMMIT, 'ps', 'p', STOPPING):    (COMMIT, 'pP sS', None, ADVANCE),
    (COMMIT, 'ps', 'p', STOPPED):     (COMMIT, 'sP', 'commit(s)', ADVANCE),
    (COMMIT, 'ps', 's', ABSENT):      (COMMIT, 'pP', None, HOLD),
    (COMMIT, 'ps', 's', PREPARING):   (COMMIT, 'pP sS', None, HOLD),
    (COMMIT, 'ps', 's', PREPARED):    (COMMIT, 'pP sS', 'remove(p)', HOLD),
    (COMMIT, 'ps', 's', REPLICATING): RAISES,
    (COMMIT, 'ps', 's', STOPPING):    (COMMIT, 'pP sS', None, HOLD),
    (COMMIT, 'ps', 's', STOPPED):     (COMMIT, 'pP', None, HOLD),
    (COMMIT, 'ps', 'u', ABSENT):      (COMMIT, 'pP sS', None, HOLD),
    (COMMIT, 'ps', 'u', PREPARING):   (COMMIT, 'pP sS uU', 'remove(u)', HOLD),
    (COMMIT, 'ps', 'u', PREPARED):    (COMMIT, 'pP sS uU', 'remove(u)', HOLD),
    (COMMIT, 'ps', 'u', REPLICATING): RAISES,
    (COMMIT, 'ps', 'u', STOPPING):    (COMMIT, 'pP sS uU', None, HOLD),
    (COMMIT, 'ps', 'u', STOPPED):     (COMMIT, 'pP sS', None, HOLD),
    # REPLICATING, p
    (S.REPLICATING, 'p', 'p', ABSENT):      (UNOWNED, '', None, HOLD),
    (S.REPLICATING, 'p', 'p', PREPARING):   (S.REPLICATING, 'pP', None, HOLD),
    (S.REPLICATING, 'p', 'p', PREPARED):    (S.REPLICATING, 'pP', None, HOLD),
    (S.REPLICATING, 'p', 'p', REPLICATING): (S.REPLICATING, 'pP', None, ADVANCE),
    (S.REPLICATING, 'p', 'p', STOPPING):    (S.REPLICATING, 'pP', None, ADVANCE),
    (S.REPLICATING, 'p', 'p', STOPPED):     (UNOWNED, '', None, ADVANCE),
    (S.REPLICATING, 'p', 'u', ABSENT):      (S.REPLICATING, 'pP', None, HOLD),
    (S.REPLICATING, 'p', 'u', PREPARING):   (S.REPLICATING, 'pP uU', 'remove(u)', HOLD),
    (S.REPLICATING, 'p', 'u', PREPARED):    (S.REPLICATING, 'pP uU', 'remove(u)', HOLD),
    (S.REPLICATING, 'p', 'u', REPLICATING): RAISES,
    (S.REPLICATING, 'p', 'u', STOPPING):    (S.REPLICATING, 'pP uU', None, HOLD),
    (S.REPLICATING, 'p', 'u', STOPPED):     (S.REPLICATING, 'pP', None, HOLD),
    # REMOVING, p: the table is being removed; every holder is told to stop
    (REMOVING, 'p', 'p', ABSENT):      (UNOWNED, '', None, HOLD),
    (REMOVING, 'p', 'p', PREPARING):   (REMOVING, 'pP', 'remove(p)', HOLD),
    (REMOVING, 'p', 'p', PREPARED):    (REMOVING, 'pP', 'remove(p)', HOLD),
    (REMOVING, 'p', 'p', REPLICATING): (REMOVING, 'pP', 'remove(p)', ADVANCE),
    (REMOVING, 'p', 'p', STOPPING):    (REMOVING, 'pP', None, HOLD),
    (REMOVING, 'p', 'p', STOPPED):     (UNOWNED, '', None, ADVANCE),
    (REMOVING, 'p', 'u', ABSENT):      (REMOVING, 'pP', None, HOLD),
    (REMOVING, 'p', 'u', PREPARING):   (REMOVING, 'pP uU', 'remove(u)', HOLD),
    (REMOVING, 'p', 'u', PREPARED):    (REMOVING, 'pP uU', 'remove(u)', HOLD),
    (REMOVING, 'p', 'u', REPLICATING): (REMOVING, 'pP uU', 'remove(u)', HOLD),
    (REMOVING, 'p', 'u', STOPPING):    (REMOVING, 'pP uU', None, HOLD),
    (REMOVING, 'p', 'u', STOPPED):     (REMOVING, 'pP', None, HOLD),
    # REMOVING, -: only Undetermined captures; each must stop
    (REMOVING, '-', 'u', ABSENT):      (UNOWNED, '', None, HOLD),
    (REMOVING, '-', 'u', PREPARING):   (REMOVING, 'uU', 'remove(u)', HOLD),
    (REMOVING, '-', 'u', PREPARED):    (REMOVING, 'uU', 'remove(u)', HOLD),
    (REMOVING, '-', 'u', REPLICATING): (REMOVING, 'uU', 'remove(u)', HOLD),
    (REMOVING, '-', 'u', STOPPING):    (REMOVING, 'uU', None, HOLD),
    (REMOVING, '-', 'u', STOPPED):     (UNOWNED, '', None, ADVANCE),
}

# What a promoting row does instead while an Undetermined capture holds the table.
WHILE_UNDETERMINED: dict[Key, Row] = {
    (PREPARE, 's', 's', PREPARED): (COMMIT, 'sS', None, HOLD),
    (COMMIT, 's', 's', PREPARED):  (COMMIT, 'sS', None, HOLD),
    (COMMIT, 'ps', 'p', ABSENT):   (COMMIT, 'sS', None, HOLD),
    (COMMIT, 'ps', 'p', STOPPED):  (COMMIT, 'sS', None, ADVANCE),
}
# fmt: on


# ----------------------------------------------------------------- the form poll runs
class TransitionTableError(SchedulerError):
    """A row of the transition table is malformed (a bug in the table, found at import)."""


class Send(enum.IntEnum):
    """The dispatch a step sends, to the capture named by its role before the step."""

    PREPARE = 0  # AddTableRequest(is_secondary=True) at the set's checkpoint
    COMMIT = 1  # AddTableRequest(is_secondary=False) at the set's checkpoint after the step
    REMOVE = 2  # RemoveTableRequest


@dataclass(frozen=True, slots=True)
class Step:
    """One row in the form ``poll`` runs; captures are named by their role before the step."""

    state: ReplicationSetState | None  # None: UNOWNED (ABSENT, or REMOVING while any remain)
    changes: tuple[tuple[Role, Role | None], ...]  # (role before, role after or None: leaves)
    send: Send | None
    to: Role | None  # whom ``send`` goes to
    advance: bool  # take the report's checkpoint
    raises: bool  # MultiplePrimaryError: two captures sink the table
    waiting: Step | None = None  # runs instead while an Undetermined capture holds the table

    @property
    def promotes(self) -> bool:
        """Whether the secondary becomes the primary."""
        return (Role.SECONDARY, Role.PRIMARY) in self.changes


# (set state, has a primary, has a secondary, reporter's role, reported table state)
StepKey = tuple[ReplicationSetState, bool, bool, Role, TableState]

_ROLE_OF_NAME = {"p": Role.PRIMARY, "s": Role.SECONDARY, "u": Role.UNDETERMINED}
_ROLE_OF_LETTER = {"P": Role.PRIMARY, "S": Role.SECONDARY, "U": Role.UNDETERMINED}
_SEND_OF_VERB = {"prepare": Send.PREPARE, "commit": Send.COMMIT, "remove": Send.REMOVE}
_SHAPE_BITS = {"ps": (True, True), "p": (True, False), "s": (False, True), "-": (False, False)}
_RAISING = Step(None, (), None, None, advance=False, raises=True)


def _changes(key: Key, roles_after: str) -> tuple[tuple[Role, Role | None], ...]:
    _, shape, reporter, _ = key
    present = {n for n in shape if n != "-"} | ({"u"} if reporter == "u" else set())
    after: dict[str, Role] = {}
    for token in roles_after.split():
        name, letter = token[:1], token[1:]
        if name not in present or letter not in _ROLE_OF_LETTER or name in after:
            raise TransitionTableError(f"row {key}: bad roles after {roles_after!r}")
        after[name] = _ROLE_OF_LETTER[letter]
    changes = []
    for name in sorted(present):  # 'p' before 's': the primary leaves before a promotion
        before, now = _ROLE_OF_NAME[name], after.get(name)
        if now != before:
            changes.append((before, now))
    return tuple(changes)


def _send(key: Key, dispatch: str | None) -> tuple[Send | None, Role | None]:
    if dispatch is None:
        return None, None
    verb, _, rest = dispatch.partition("(")
    name = rest.rstrip(")")
    present = (set(key[1]) - {"-"}) | {key[2]}
    if verb not in _SEND_OF_VERB or name not in present or rest != f"{name})":
        raise TransitionTableError(f"row {key}: bad dispatch {dispatch!r}")
    return _SEND_OF_VERB[verb], _ROLE_OF_NAME[name]


def _step(key: Key, row: Row | str, waiting: Row | None) -> Step:
    if row == RAISES:
        return _RAISING
    if not isinstance(row, tuple) or len(row) != 4 or row[3] not in (ADVANCE, HOLD):
        raise TransitionTableError(f"row {key}: bad value {row!r}")
    state, roles_after, dispatch, checkpoint = row
    if state != UNOWNED and not isinstance(state, ReplicationSetState):
        raise TransitionTableError(f"row {key}: bad next state {state!r}")
    send, to = _send(key, dispatch)
    return Step(
        state=None if state == UNOWNED else state,  # type: ignore[arg-type]
        changes=_changes(key, roles_after),
        send=send,
        to=to,
        advance=checkpoint == ADVANCE,
        raises=False,
        waiting=None if waiting is None else _waiting_step(key, waiting),
    )


def _waiting_step(key: Key, row: Row) -> Step:
    step = _step(key, row, None)
    if step.promotes or step.raises:
        raise TransitionTableError(f"WHILE_UNDETERMINED row {key} must not promote: {row!r}")
    return step


def _compile(table: dict[Key, Row | str], waiting: dict[Key, Row]) -> dict[StepKey, Step]:
    steps: dict[StepKey, Step] = {}
    for key, row in table.items():
        state, shape, reporter, reported = key
        if shape not in _SHAPES_OF_STATE.get(state, ()) or reporter not in set(shape) | {"u"}:
            raise TransitionTableError(f"row {key}: no such shape or reporter")
        step = _step(key, row, waiting.get(key))
        if step.promotes != (key in waiting):
            raise TransitionTableError(f"row {key}: promotes iff it has a WHILE_UNDETERMINED twin")
        steps[(state, *_SHAPE_BITS[shape], _ROLE_OF_NAME[reporter], reported)] = step
    if set(waiting) - set(table):
        raise TransitionTableError(f"WHILE_UNDETERMINED rows {set(waiting) - set(table)} unknown")
    return steps


_SHAPES_OF_STATE = {st: {sh for s, sh in SHAPES if s == st} for st, _ in SHAPES}
STEPS: dict[StepKey, Step] = _compile(TRANSITIONS, WHILE_UNDETERMINED)
"""The table in the form ``ReplicationSet.poll`` looks up, compiled once at import."""

"""ReplicationSet's transitions as data: one place to read (and check) what ``poll`` does.

Like h11's ``_state.py``. A key is (set state, shape, reporting capture, reported table
state); a value is (next set state, the captures' roles afterwards, the dispatch sent).
A *shape* is the set of captures a state can hold, named in :data:`SHAPES`: a capture is
named by its role in the shape (``p`` primary, ``s`` secondary, ``u`` Undetermined), and
a role after the step is written ``<name><P|S|U>`` (``sP``: the secondary was promoted).
``RAISES`` marks a report that means two captures sink the table
(:class:`~scheduler_core.errors.MultiplePrimaryError`). ABSENT holds no capture, so every
report there comes from outside the set and is ignored; a report from a capture outside
the set is ignored in every state.

``tests/unit/replication/test_transitions.py`` walks every (set state x capture role x
reported table state) through ``ReplicationSet.poll`` and compares it with this table, so
the table cannot drift from the code. Reading guide to the rules it encodes:

* A secondary's Absent re-sends its prepare (the add was lost, or it restarted); its
  Stopping or Stopped takes it out of the set.
* A primary that reports Stopping while a secondary prepares becomes Undetermined: it may
  still write, so nobody is promoted until it reports Stopped or Absent (tightening 1).
* Promotion sends the commit at the set's checkpoint, which is the primary's, or with no
  primary the Undetermined capture's final (Stopped) checkpoint.
* With no primary and no secondary left but an Undetermined capture, the set waits in
  REMOVING and goes ABSENT (to be re-added) once it stopped; only a removed table
  (``handle_remove_table``) ends up removed.
"""

from __future__ import annotations

from scheduler_core.model import ReplicationSetState, TableState

S = ReplicationSetState
ABSENT, PREPARING, PREPARED = TableState.ABSENT, TableState.PREPARING, TableState.PREPARED
REPLICATING, STOPPING, STOPPED = TableState.REPLICATING, TableState.STOPPING, TableState.STOPPED
PREPARE, COMMIT, REMOVING = S.PREPARE, S.COMMIT, S.REMOVING
RAISES = "raises MultiplePrimaryError"

# (set state, shape) -> how the shape arises.
SHAPES: dict[tuple[ReplicationSetState, str], str] = {
    (PREPARE, "add"): "handle_add_table(s)",
    (PREPARE, "move"): "p replicating, handle_move_table(s)",
    (
        PREPARE,
        "no_primary",
    ): "rebuilt from {u: Stopping, s: Preparing} (a move cut by an owner switch)",
    (COMMIT, "move"): "rebuilt from {p: Replicating, s: Prepared}",
    (COMMIT, "promoted"): "an add's second phase: s promoted, commit sent (named p)",
    (COMMIT, "no_primary"): "rebuilt from {s: Prepared}",
    (COMMIT, "primary_stopping"): "rebuilt from {u: Stopping, s: Prepared}",
    (S.REPLICATING, "steady"): "p replicating",
    (S.REPLICATING, "with_stopping"): "rebuilt from {p: Replicating, u: Stopping}",
    (REMOVING, "remove"): "p replicating, handle_remove_table()",
    (
        REMOVING,
        "remove_with_stopping",
    ): "rebuilt {p: Replicating, u: Stopping}, handle_remove_table()",
    (REMOVING, "unowned"): "rebuilt from {u: Stopping}: waits for u before re-adding",
}

Outcome = tuple[ReplicationSetState, str, str | None] | str

# fmt: off
TRANSITIONS: dict[tuple[ReplicationSetState, str, str, TableState], Outcome] = {
    # PREPARE, add: sS
    (PREPARE, 'add', 's', ABSENT): (PREPARE, 'sS', 'prepare(s)'),
    (PREPARE, 'add', 's', PREPARING): (PREPARE, 'sS', None),
    (PREPARE, 'add', 's', PREPARED): (COMMIT, 'sP', 'commit(s)'),
    (PREPARE, 'add', 's', REPLICATING): (PREPARE, 'sS', None),
    (PREPARE, 'add', 's', STOPPING): (S.ABSENT, '', None),
    (PREPARE, 'add', 's', STOPPED): (S.ABSENT, '', None),
    # PREPARE, move: pP sS
    (PREPARE, 'move', 'p', ABSENT): (PREPARE, 'sS', None),
    (PREPARE, 'move', 'p', PREPARING): (PREPARE, 'pP sS', None),
    (PREPARE, 'move', 'p', PREPARED): (PREPARE, 'pP sS', None),
    (PREPARE, 'move', 'p', REPLICATING): (PREPARE, 'pP sS', None),
    (PREPARE, 'move', 'p', STOPPING): (PREPARE, 'pU sS', None),
    (PREPARE, 'move', 'p', STOPPED): (PREPARE, 'sS', None),
    (PREPARE, 'move', 's', ABSENT): (PREPARE, 'pP sS', 'prepare(s)'),
    (PREPARE, 'move', 's', PREPARING): (PREPARE, 'pP sS', None),
    (PREPARE, 'move', 's', PREPARED): (COMMIT, 'pP sS', 'remove(p)'),
    (PREPARE, 'move', 's', REPLICATING): (PREPARE, 'pP sS', None),
    (PREPARE, 'move', 's', STOPPING): (S.REPLICATING, 'pP', None),
    (PREPARE, 'move', 's', STOPPED): (S.REPLICATING, 'pP', None),
    # PREPARE, no_primary: sS uU
    (PREPARE, 'no_primary', 's', ABSENT): (PREPARE, 'sS uU', 'prepare(s)'),
    (PREPARE, 'no_primary', 's', PREPARING): (PREPARE, 'sS uU', None),
    (PREPARE, 'no_primary', 's', PREPARED): (COMMIT, 'sS uU', None),
    (PREPARE, 'no_primary', 's', REPLICATING): (PREPARE, 'sS uU', None),
    (PREPARE, 'no_primary', 's', STOPPING): (REMOVING, 'uU', None),
    (PREPARE, 'no_primary', 's', STOPPED): (REMOVING, 'uU', None),
    (PREPARE, 'no_primary', 'u', ABSENT): (PREPARE, 'sS', None),
    (PREPARE, 'no_primary', 'u', PREPARING): (PREPARE, 'sS uU', 'remove(u)'),
    (PREPARE, 'no_primary', 'u', PREPARED): (PREPARE, 'sS uU', 'remove(u)'),
    (PREPARE, 'no_primary', 'u', REPLICATING): (PREPARE, 'sS uU', 'remove(u)'),
    (PREPARE, 'no_primary', 'u', STOPPING): (PREPARE, 'sS uU', None),
    (PREPARE, 'no_primary', 'u', STOPPED): (PREPARE, 'sS', None),
    # COMMIT, move: pP sS
    (COMMIT, 'move', 'p', ABSENT): (COMMIT, 'sP', 'commit(s)'),
    (COMMIT, 'move', 'p', PREPARING): (COMMIT, 'pP sS', None),
    (COMMIT, 'move', 'p', PREPARED): (COMMIT, 'pP sS', None),
    (COMMIT, 'move', 'p', REPLICATING): (COMMIT, 'pP sS', 'remove(p)'),
    (COMMIT, 'move', 'p', STOPPING): (COMMIT, 'pP sS', None),
    (COMMIT, 'move', 'p', STOPPED): (COMMIT, 'sP', 'commit(s)'),
    (COMMIT, 'move', 's', ABSENT): (COMMIT, 'pP', None),
    (COMMIT, 'move', 's', PREPARING): (COMMIT, 'pP sS', None),
    (COMMIT, 'move', 's', PREPARED): (COMMIT, 'pP sS', 'remove(p)'),
    (COMMIT, 'move', 's', REPLICATING): RAISES,
    (COMMIT, 'move', 's', STOPPING): (COMMIT, 'pP sS', None),
    (COMMIT, 'move', 's', STOPPED): (COMMIT, 'pP', None),
    # COMMIT, promoted: pP
    (COMMIT, 'promoted', 'p', ABSENT): (S.ABSENT, '', None),
    (COMMIT, 'promoted', 'p', PREPARING): (COMMIT, 'pP', None),
    (COMMIT, 'promoted', 'p', PREPARED): (COMMIT, 'pP', 'commit(p)'),
    (COMMIT, 'promoted', 'p', REPLICATING): (S.REPLICATING, 'pP', None),
    (COMMIT, 'promoted', 'p', STOPPING): (COMMIT, 'pP', None),
    (COMMIT, 'promoted', 'p', STOPPED): (S.ABSENT, '', None),
    # COMMIT, no_primary: sS
    (COMMIT, 'no_primary', 's', ABSENT): (S.ABSENT, '', None),
    (COMMIT, 'no_primary', 's', PREPARING): (COMMIT, 'sS', None),
    (COMMIT, 'no_primary', 's', PREPARED): (COMMIT, 'sP', 'commit(s)'),
    (COMMIT, 'no_primary', 's', REPLICATING): RAISES,
    (COMMIT, 'no_primary', 's', STOPPING): (COMMIT, 'sS', None),
    (COMMIT, 'no_primary', 's', STOPPED): (S.ABSENT, '', None),
    # COMMIT, primary_stopping: sS uU
    (COMMIT, 'primary_stopping', 's', ABSENT): (REMOVING, 'uU', None),
    (COMMIT, 'primary_stopping', 's', PREPARING): (COMMIT, 'sS uU', None),
    (COMMIT, 'primary_stopping', 's', PREPARED): (COMMIT, 'sS uU', None),
    (COMMIT, 'primary_stopping', 's', REPLICATING): RAISES,
    (COMMIT, 'primary_stopping', 's', STOPPING): (COMMIT, 'sS uU', None),
    (COMMIT, 'primary_stopping', 's', STOPPED): (REMOVING, 'uU', None),
    (COMMIT, 'primary_stopping', 'u', ABSENT): (COMMIT, 'sS', None),
    (COMMIT, 'primary_stopping', 'u', PREPARING): (COMMIT, 'sS uU', 'remove(u)'),
    (COMMIT, 'primary_stopping', 'u', PREPARED): (COMMIT, 'sS uU', 'remove(u)'),
    (COMMIT, 'primary_stopping', 'u', REPLICATING): (COMMIT, 'sS uU', 'remove(u)'),
    (COMMIT, 'primary_stopping', 'u', STOPPING): (COMMIT, 'sS uU', None),
    (COMMIT, 'primary_stopping', 'u', STOPPED): (COMMIT, 'sS', None),
    # REPLICATING, steady: pP
    (S.REPLICATING, 'steady', 'p', ABSENT): (S.ABSENT, '', None),
    (S.REPLICATING, 'steady', 'p', PREPARING): (S.REPLICATING, 'pP', None),
    (S.REPLICATING, 'steady', 'p', PREPARED): (S.REPLICATING, 'pP', None),
    (S.REPLICATING, 'steady', 'p', REPLICATING): (S.REPLICATING, 'pP', None),
    (S.REPLICATING, 'steady', 'p', STOPPING): (S.REPLICATING, 'pP', None),
    (S.REPLICATING, 'steady', 'p', STOPPED): (S.ABSENT, '', None),
    # REPLICATING, with_stopping: pP uU
    (S.REPLICATING, 'with_stopping', 'p', ABSENT): (REMOVING, 'uU', None),
    (S.REPLICATING, 'with_stopping', 'p', PREPARING): (S.REPLICATING, 'pP uU', None),
    (S.REPLICATING, 'with_stopping', 'p', PREPARED): (S.REPLICATING, 'pP uU', None),
    (S.REPLICATING, 'with_stopping', 'p', REPLICATING): (S.REPLICATING, 'pP uU', None),
    (S.REPLICATING, 'with_stopping', 'p', STOPPING): (S.REPLICATING, 'pP uU', None),
    (S.REPLICATING, 'with_stopping', 'p', STOPPED): (REMOVING, 'uU', None),
    (S.REPLICATING, 'with_stopping', 'u', ABSENT): (S.REPLICATING, 'pP', None),
    (S.REPLICATING, 'with_stopping', 'u', PREPARING): (S.REPLICATING, 'pP uU', 'remove(u)'),
    (S.REPLICATING, 'with_stopping', 'u', PREPARED): (S.REPLICATING, 'pP uU', 'remove(u)'),
    (S.REPLICATING, 'with_stopping', 'u', REPLICATING): RAISES,
    (S.REPLICATING, 'with_stopping', 'u', STOPPING): (S.REPLICATING, 'pP uU', None),
    (S.REPLICATING, 'with_stopping', 'u', STOPPED): (S.REPLICATING, 'pP', None),
    # REMOVING, remove: pP
    (REMOVING, 'remove', 'p', ABSENT): (REMOVING, '', None),
    (REMOVING, 'remove', 'p', PREPARING): (REMOVING, 'pP', 'remove(p)'),
    (REMOVING, 'remove', 'p', PREPARED): (REMOVING, 'pP', 'remove(p)'),
    (REMOVING, 'remove', 'p', REPLICATING): (REMOVING, 'pP', 'remove(p)'),
    (REMOVING, 'remove', 'p', STOPPING): (REMOVING, 'pP', None),
    (REMOVING, 'remove', 'p', STOPPED): (REMOVING, '', None),
    # REMOVING, remove_with_stopping: pP uU
    (REMOVING, 'remove_with_stopping', 'p', ABSENT): (REMOVING, 'uU', None),
    (REMOVING, 'remove_with_stopping', 'p', PREPARING): (REMOVING, 'pP uU', 'remove(p)'),
    (REMOVING, 'remove_with_stopping', 'p', PREPARED): (REMOVING, 'pP uU', 'remove(p)'),
    (REMOVING, 'remove_with_stopping', 'p', REPLICATING): (REMOVING, 'pP uU', 'remove(p)'),
    (REMOVING, 'remove_with_stopping', 'p', STOPPING): (REMOVING, 'pP uU', None),
    (REMOVING, 'remove_with_stopping', 'p', STOPPED): (REMOVING, 'uU', None),
    (REMOVING, 'remove_with_stopping', 'u', ABSENT): (REMOVING, 'pP', None),
    (REMOVING, 'remove_with_stopping', 'u', PREPARING): (REMOVING, 'pP uU', 'remove(u)'),
    (REMOVING, 'remove_with_stopping', 'u', PREPARED): (REMOVING, 'pP uU', 'remove(u)'),
    (REMOVING, 'remove_with_stopping', 'u', REPLICATING): (REMOVING, 'pP uU', 'remove(u)'),
    (REMOVING, 'remove_with_stopping', 'u', STOPPING): (REMOVING, 'pP uU', None),
    (REMOVING, 'remove_with_stopping', 'u', STOPPED): (REMOVING, 'pP', None),
    # REMOVING, unowned: uU
    (REMOVING, 'unowned', 'u', ABSENT): (S.ABSENT, '', None),
    (REMOVING, 'unowned', 'u', PREPARING): (REMOVING, 'uU', 'remove(u)'),
    (REMOVING, 'unowned', 'u', PREPARED): (REMOVING, 'uU', 'remove(u)'),
    (REMOVING, 'unowned', 'u', REPLICATING): (REMOVING, 'uU', 'remove(u)'),
    (REMOVING, 'unowned', 'u', STOPPING): (REMOVING, 'uU', None),
    (REMOVING, 'unowned', 'u', STOPPED): (S.ABSENT, '', None),
}
# fmt: on

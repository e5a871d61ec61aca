"""Every (set state x capture role x reported table state) against the transition table."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scheduler_core import Checkpoint, ReplicationSet, ReplicationSetState, TableState, TableStatus
from scheduler_core.errors import MultiplePrimaryError
from scheduler_core.messages import AddTableRequest
from scheduler_core.model import Role
from scheduler_core.transitions import RAISES, SHAPES, TRANSITIONS

S = ReplicationSetState
T = TableState
CP = Checkpoint.at(10)


def status(state: TableState, ts: int = 10) -> TableStatus:
    return TableStatus(1, state, Checkpoint.at(ts))


def rebuilt(**reports: TableState) -> ReplicationSet:
    return ReplicationSet.rebuild(1, CP, {c: status(s) for c, s in reports.items()})


def _then(rs: ReplicationSet, step: Callable[[ReplicationSet], object]) -> ReplicationSet:
    step(rs)
    return rs


BUILD: dict[tuple[ReplicationSetState, str], Callable[[], ReplicationSet]] = {
    (S.PREPARE, "add"): lambda: _then(ReplicationSet(1, CP), lambda r: r.handle_add_table("s")),
    (S.PREPARE, "move"): lambda: _then(
        rebuilt(p=T.REPLICATING), lambda r: r.handle_move_table("s")
    ),
    (S.PREPARE, "no_primary"): lambda: rebuilt(u=T.STOPPING, s=T.PREPARING),
    (S.COMMIT, "move"): lambda: rebuilt(p=T.REPLICATING, s=T.PREPARED),
    (S.COMMIT, "promoted"): lambda: ReplicationSet.committing(1, "p", CP),
    (S.COMMIT, "no_primary"): lambda: rebuilt(s=T.PREPARED),
    (S.COMMIT, "primary_stopping"): lambda: rebuilt(u=T.STOPPING, s=T.PREPARED),
    (S.REPLICATING, "steady"): lambda: rebuilt(p=T.REPLICATING),
    (S.REPLICATING, "with_stopping"): lambda: rebuilt(p=T.REPLICATING, u=T.STOPPING),
    (S.REMOVING, "remove"): lambda: _then(
        rebuilt(p=T.REPLICATING), ReplicationSet.handle_remove_table
    ),
    (S.REMOVING, "remove_with_stopping"): lambda: _then(
        rebuilt(p=T.REPLICATING, u=T.STOPPING), ReplicationSet.handle_remove_table
    ),
    (S.REMOVING, "unowned"): lambda: rebuilt(u=T.STOPPING),
}


def roles(rs: ReplicationSet) -> str:
    return " ".join(sorted(f"{c}{'PSU'[r]}" for c, r in rs.captures.items()))


def emitted(msgs: list) -> str | None:
    if not msgs:
        return None
    [m] = msgs
    if isinstance(m, AddTableRequest):
        return f"{'prepare' if m.is_secondary else 'commit'}({m.to})"
    return f"remove({m.to})"


def test_every_shape_is_built_in_its_state() -> None:
    assert set(BUILD) == set(SHAPES)
    for (state, _), build in BUILD.items():
        assert build().state == state


@pytest.mark.parametrize("key", list(TRANSITIONS), ids=[" ".join(map(str, k)) for k in TRANSITIONS])
def test_poll_follows_the_transition_table(key) -> None:
    state, shape, capture, reported = key
    rs = BUILD[(state, shape)]()
    expected = TRANSITIONS[key]
    if expected == RAISES:
        with pytest.raises(MultiplePrimaryError):
            rs.poll(status(reported, 20), capture)
        return
    msgs = rs.poll(status(reported, 20), capture)
    assert (rs.state, roles(rs), emitted(msgs)) == expected


def test_table_covers_every_state_role_and_reported_state() -> None:
    """Every (set state, role) the invariants allow, with every table state reported."""
    seen: set[tuple[ReplicationSetState, Role, TableState]] = set()
    for state, shape, capture, reported in TRANSITIONS:
        role = BUILD[(state, shape)]().captures[capture]
        seen.add((state, role, reported))
    allowed = {
        S.PREPARE: {Role.PRIMARY, Role.SECONDARY, Role.UNDETERMINED},
        S.COMMIT: {Role.PRIMARY, Role.SECONDARY, Role.UNDETERMINED},
        S.REPLICATING: {Role.PRIMARY, Role.UNDETERMINED},  # no secondary in REPLICATING
        S.REMOVING: {Role.PRIMARY, Role.UNDETERMINED},  # nothing is prepared for a removal
    }
    want = {(s, r, t) for s, rs in allowed.items() for r in rs for t in T}
    assert want - seen == set()


@pytest.mark.parametrize("reported", list(T))
def test_absent_set_ignores_every_report(reported: TableState) -> None:
    rs = ReplicationSet(1, CP)
    assert rs.poll(status(reported), "x") == [] and rs.state == S.ABSENT

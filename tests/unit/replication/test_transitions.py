"""The transition table ``ReplicationSet.poll`` runs: carried out as written, total, and safe.

``poll`` looks its rows up, so comparing the two proves only the interpreter. What would
catch a wrong row: every reachable set is explored from every rebuild and admin request
(the table is total, no row is dead), each step is checked against the protocol's safety
rules (one writer, a writer is forgotten only once it stopped, progress only from the
primary), and every reachable set reaches a resting state when captures do as told. The
scenario tests in ``test_replication_set.py`` pin the key rows by name.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from scheduler_core import Checkpoint, ReplicationSet, ReplicationSetState, TableState, TableStatus
from scheduler_core.errors import MultiplePrimaryError
from scheduler_core.messages import AddTableRequest, Dispatch, RemoveTableRequest
from scheduler_core.model import Role
from scheduler_core.transitions import (
    ADVANCE,
    RAISES,
    SHAPES,
    STEPS,
    TRANSITIONS,
    UNOWNED,
    WHILE_UNDETERMINED,
)

S = ReplicationSetState
T = TableState
CP = Checkpoint.at(10)
LETTER = {Role.PRIMARY: "P", Role.SECONDARY: "S", Role.UNDETERMINED: "U"}


def status(state: TableState, ts: int = 10) -> TableStatus:
    return TableStatus(1, state, Checkpoint.at(ts))


def rebuilt(**reports: TableState) -> ReplicationSet:
    return ReplicationSet.rebuild(1, CP, {c: status(s) for c, s in reports.items()})


def _then(rs: ReplicationSet, *steps: Callable[[ReplicationSet], object]) -> ReplicationSet:
    for step in steps:
        step(rs)
    return rs


def _remove(rs: ReplicationSet) -> object:
    return rs.handle_remove_table()


def _stopped(capture: str) -> Callable[[ReplicationSet], object]:
    return lambda rs: rs.poll(status(T.STOPPED), capture)


# (set state, shape, with an Undetermined capture "u") -> a set of that shape; captures
# are named by their role: "p", "s", "u".
BUILD: dict[tuple[ReplicationSetState, str, bool], Callable[[], ReplicationSet]] = {
    (S.PREPARE, "s", False): lambda: _then(
        ReplicationSet(1, CP), lambda r: r.handle_add_table("s")
    ),
    (S.PREPARE, "s", True): lambda: rebuilt(u=T.STOPPING, s=T.PREPARING),
    (S.PREPARE, "ps", False): lambda: _then(
        rebuilt(p=T.REPLICATING), lambda r: r.handle_move_table("s")
    ),
    (S.PREPARE, "ps", True): lambda: _then(
        rebuilt(p=T.REPLICATING, u=T.STOPPING), lambda r: r.handle_move_table("s")
    ),
    (S.COMMIT, "p", False): lambda: ReplicationSet.committing(1, "p", CP),
    (S.COMMIT, "p", True): lambda: _then(
        rebuilt(p=T.REPLICATING, s=T.PREPARED, u=T.STOPPING), _stopped("s")
    ),
    (S.COMMIT, "s", False): lambda: rebuilt(s=T.PREPARED),
    (S.COMMIT, "s", True): lambda: rebuilt(u=T.STOPPING, s=T.PREPARED),
    (S.COMMIT, "ps", False): lambda: rebuilt(p=T.REPLICATING, s=T.PREPARED),
    (S.COMMIT, "ps", True): lambda: rebuilt(p=T.REPLICATING, s=T.PREPARED, u=T.STOPPING),
    (S.REPLICATING, "p", False): lambda: rebuilt(p=T.REPLICATING),
    (S.REPLICATING, "p", True): lambda: rebuilt(p=T.REPLICATING, u=T.STOPPING),
    (S.REMOVING, "p", False): lambda: _then(rebuilt(p=T.REPLICATING), _remove),
    (S.REMOVING, "p", True): lambda: _then(rebuilt(p=T.REPLICATING, u=T.STOPPING), _remove),
    (S.REMOVING, "-", True): lambda: rebuilt(u=T.STOPPING),
}


def removing_then_unowned() -> ReplicationSet:
    """REMOVING with only an Undetermined capture left, the table being removed."""
    return _then(rebuilt(p=T.REPLICATING, u=T.STOPPING), _remove, _stopped("p"))


def roles(rs: ReplicationSet, names: set[str]) -> str:
    return " ".join(sorted(f"{c}{LETTER[r]}" for c, r in rs.captures.items() if c in names))


def emitted(msgs: list[Dispatch]) -> str | None:
    if not msgs:
        return None
    [m] = msgs
    if isinstance(m, AddTableRequest):
        return f"{'prepare' if m.is_secondary else 'commit'}({m.to})"
    return f"remove({m.to})"


def test_every_shape_is_built_in_its_state() -> None:
    assert {(state, shape) for state, shape, _ in BUILD} == set(SHAPES)
    for (state, shape, with_u), build in BUILD.items():
        rs = build()
        names = set(shape) - {"-"} | ({"u"} if with_u else set())
        assert (rs.state, set(rs.captures)) == (state, names)
        assert all(
            rs.captures[n] == {"p": Role.PRIMARY, "s": Role.SECONDARY}.get(n, Role.UNDETERMINED)
            for n in names
        )
    rs = removing_then_unowned()
    assert (rs.state, dict(rs.captures)) == (S.REMOVING, {"u": Role.UNDETERMINED})


def _cases() -> Iterator[tuple[tuple, bool, bool]]:
    """Every row, reported with and without an Undetermined capture besides the reporter."""
    for key in TRANSITIONS:
        state, shape, reporter, _ = key
        for with_u in (False, True):
            if (state, shape, with_u) in BUILD and (with_u or reporter != "u"):
                yield key, with_u, False
        if (state, shape) == (S.REMOVING, "-"):
            yield key, True, True


CASES = list(_cases())


@pytest.mark.parametrize(
    ("key", "with_u", "removing"),
    CASES,
    ids=[f"{' '.join(map(str, k))}{' +u' * w}{' removing' * r}" for k, w, r in CASES],
)
def test_poll_carries_out_the_row(key, with_u: bool, removing: bool) -> None:
    """``poll`` does what the row says: next state, roles, dispatch and checkpoint."""
    state, shape, reporter, reported = key
    rs = removing_then_unowned() if removing else BUILD[(state, shape, with_u)]()
    row = TRANSITIONS[key]
    if with_u and reporter != "u" and key in WHILE_UNDETERMINED:
        row = WHILE_UNDETERMINED[key]  # the bystander "u" may still write: no promotion
    if row == RAISES:
        with pytest.raises(MultiplePrimaryError):
            rs.poll(status(reported, 20), reporter)
        return
    next_state, roles_after, dispatch, checkpoint = row
    msgs = rs.poll(status(reported, 20), reporter)
    dropping = removing or (state, shape) == (S.REMOVING, "p")  # built by handle_remove_table
    if next_state == UNOWNED:  # Undetermined captures must stop; a removed table stays so
        next_state = S.REMOVING if rs.captures or dropping else S.ABSENT
    names = set(shape) | {reporter}
    assert (rs.state, roles(rs, names), emitted(msgs)) == (next_state, roles_after, dispatch)
    assert rs.removed == (dropping and not rs.captures)
    assert rs.checkpoint == (Checkpoint.at(20) if checkpoint == ADVANCE else CP)
    if with_u and reporter != "u":
        assert rs.captures["u"] == Role.UNDETERMINED  # a bystander never changes


@pytest.mark.parametrize("reported", list(T))
def test_absent_set_ignores_every_report(reported: TableState) -> None:
    rs = ReplicationSet(1, CP)
    assert rs.poll(status(reported), "x") == [] and rs.state == S.ABSENT


# --------------------------------------------------------------------------- exploration
CAPTURES = ("a", "b", "c")


@dataclass(frozen=True)
class Node:
    """A reachable set (and whether its table is being removed)."""

    rs: ReplicationSet
    removing: bool

    def key(self) -> tuple:
        return (self.rs.state, tuple(sorted(self.rs.captures.items())), self.removing)


def _starts() -> Iterator[Node]:
    """A fresh set, and every set rebuilt from any reports of the captures."""
    yield Node(ReplicationSet(1, CP), False)
    for states in itertools.product([None, *T], repeat=len(CAPTURES)):
        reports = {c: status(s) for c, s in zip(CAPTURES, states, strict=True) if s is not None}
        try:
            yield Node(ReplicationSet.rebuild(1, CP, reports), False)
        except MultiplePrimaryError:
            continue


@dataclass(frozen=True)
class Edge:
    """One input to a reachable set and what came of it."""

    before: Node
    after: Node
    via: str  # "poll", "shutdown" (a Stopped at the set's checkpoint), "add", "move", "remove"
    reporter: str | None
    reported: TableState | None
    out: list[Dispatch]

    def step_key(self) -> tuple | None:
        """The row this input ran, if it came from a capture of the set."""
        rs = self.before.rs
        role = rs.captures.get(self.reporter) if self.reporter is not None else None
        if role is None:
            return None
        return (rs.state, rs.primary is not None, rs.secondary is not None, role, self.reported)


def _ahead(rs: ReplicationSet, state: TableState) -> TableStatus:
    # Ahead of the set in both watermarks, so a step that takes it shows.
    return TableStatus(1, state, Checkpoint.at(rs.checkpoint.resolved_ts + 1))


Act = Callable[[ReplicationSet], list[Dispatch]]


def _inputs() -> Iterator[tuple[str, str | None, TableState | None, Act]]:
    for c in CAPTURES:
        yield "add", None, None, lambda rs, c=c: rs.handle_add_table(c)
        yield "move", None, None, lambda rs, c=c: rs.handle_move_table(c)
        yield "shutdown", c, T.STOPPED, lambda rs, c=c: rs.handle_capture_shutdown(c)[0]
        for t in T:
            yield "poll", c, t, lambda rs, c=c, t=t: rs.poll(_ahead(rs, t), c)
    yield "remove", None, None, lambda rs: rs.handle_remove_table()


def explore() -> tuple[dict[tuple, Node], list[Edge], set[tuple]]:
    """Every set reachable from every rebuild: the nodes, the edges, the rows that raised."""
    nodes = {n.key(): n for n in _starts()}
    todo, edges, raised = list(nodes.values()), [], set()
    while todo:
        node = todo.pop()
        for via, reporter, reported, act in _inputs():
            rs = copy.deepcopy(node.rs)
            try:
                out = act(rs)
            except MultiplePrimaryError:
                raised.add(Edge(node, node, via, reporter, reported, []).step_key())
                continue
            after = Node(rs, node.removing or (via == "remove" and bool(out)))
            edges.append(Edge(node, after, via, reporter, reported, out))
            if after.key() not in nodes:
                nodes[after.key()] = after
                todo.append(after)
    return nodes, edges, raised


@pytest.fixture(scope="module")
def explored() -> tuple[dict[tuple, Node], list[Edge], set[tuple]]:
    return explore()


def test_table_is_total_and_has_no_dead_row(explored) -> None:
    """Every reachable (state, shape, role, report) has a row, and every row is reachable."""
    _, edges, raised = explored  # a missing row raises ReplicationSetInvariantError
    hit = {e.step_key() for e in edges} - {None}
    assert hit | raised == set(STEPS)
    assert raised == {k for k, step in STEPS.items() if step.raises}


def test_every_promoting_row_runs_with_and_without_undetermined_captures(explored) -> None:
    _, edges, _ = explored
    promoting = {k for k, step in STEPS.items() if step.waiting is not None}
    ran = {(e.step_key(), e.before.rs.has_undetermined()) for e in edges}
    assert promoting
    assert {(k, u) for k in promoting for u in (False, True)} <= ran


def test_at_most_one_capture_may_write(explored) -> None:
    """A commit goes only to the primary; a new primary only while no other capture may
    still write (a commit re-sent to the primary it already is creates no writer)."""
    _, edges, _ = explored
    for e in edges:
        for m in e.out:
            if isinstance(m, AddTableRequest) and m.is_secondary:
                assert e.after.rs.captures.get(m.to) == Role.SECONDARY, e
            elif isinstance(m, AddTableRequest):
                assert e.after.rs.primary == m.to, e
                if e.before.rs.primary != m.to:
                    others = {r for c, r in e.after.rs.captures.items() if c != m.to}
                    assert not others & {Role.PRIMARY, Role.UNDETERMINED}, e


def test_a_capture_that_may_write_is_forgotten_once_it_stopped_and_only_then(explored) -> None:
    """A primary or Undetermined capture leaves the set on its Stopped or Absent report,
    and on nothing else (it may still be writing)."""
    _, edges, _ = explored
    for e in edges:
        for c, role in e.before.rs.captures.items():
            if role == Role.SECONDARY:
                continue
            stopped = e.reporter == c and e.reported in (T.STOPPED, T.ABSENT)
            assert (c not in e.after.rs.captures) == stopped, e


def test_a_capture_that_is_not_to_hold_the_table_is_told_to_stop(explored) -> None:
    """An Undetermined capture, or any capture of a set being removed, that reports it
    holds the table (Preparing, Prepared, Replicating) is told to stop, every time."""
    _, edges, _ = explored
    holds = (T.PREPARING, T.PREPARED, T.REPLICATING)
    for e in edges:
        role = e.before.rs.captures.get(e.reporter) if e.via == "poll" else None
        if role is None or e.reported not in holds:
            continue
        if role == Role.UNDETERMINED or e.before.rs.state == S.REMOVING:
            assert e.out == [RemoveTableRequest(e.reporter, 1)], e


def test_checkpoint_comes_only_from_the_primary_or_a_final_stop(explored) -> None:
    """The set takes a report's checkpoint only from its primary (Replicating, Stopping,
    Stopped), or with no primary an Undetermined capture's Stopped; the primary's
    Replicating and Stopped, and that Stopped, are always taken."""
    _, edges, _ = explored
    for e in edges:
        if e.via != "poll" or e.reporter not in e.before.rs.captures:
            continue
        took = e.after.rs.checkpoint != e.before.rs.checkpoint
        role = e.before.rs.captures[e.reporter]
        if role == Role.PRIMARY:
            if e.reported in (T.REPLICATING, T.STOPPED):
                assert took, e
            assert not took or e.reported in (T.REPLICATING, T.STOPPING, T.STOPPED), e
        elif role == Role.UNDETERMINED:
            final = e.reported == T.STOPPED and e.before.rs.primary is None
            assert took == final, e  # where the next primary starts
        else:
            assert not took, e


def test_removing_only_stops_captures(explored) -> None:
    """A removed table's set never prepares or commits, and ends empty, never re-added."""
    _, edges, _ = explored
    for e in edges:
        if e.before.removing:
            assert all(isinstance(m, RemoveTableRequest) for m in e.out), e
            assert e.after.rs.state == S.REMOVING, e


# --------------------------------------------------------------------------- liveness
_WORLD_OF_ROLE = {
    (S.PREPARE, Role.SECONDARY): T.PREPARING,
    (S.COMMIT, Role.SECONDARY): T.PREPARED,
}


def _world(rs: ReplicationSet) -> dict[str, TableState]:
    """What the captures of a set hold, as its roles imply."""
    base = {Role.PRIMARY: T.REPLICATING, Role.SECONDARY: T.PREPARING, Role.UNDETERMINED: T.STOPPING}
    world = {c: _WORLD_OF_ROLE.get((rs.state, r), base[r]) for c, r in rs.captures.items()}
    if rs.state == S.COMMIT and rs.primary is not None and not rs.has_undetermined():
        # Promoted and told to commit, which may have been lost. (With an Undetermined
        # capture nobody is promoted: such a primary was rebuilt from a Replicating one.)
        world[rs.primary] = T.PREPARED
    return world


def _obey(world: dict[str, TableState], msgs: list[Dispatch]) -> None:
    for m in msgs:
        if isinstance(m, RemoveTableRequest):
            world[m.to] = T.STOPPING if world.get(m.to) == T.REPLICATING else T.STOPPED
        elif m.is_secondary:
            world[m.to] = T.PREPARING
        else:
            writers = {
                c for c, t in world.items() if t in (T.REPLICATING, T.STOPPING) and c != m.to
            }
            assert not writers, f"commit to {m.to} while {writers} may write"
            world[m.to] = T.REPLICATING


def _advance(world: dict[str, TableState]) -> None:
    after = {T.PREPARING: T.PREPARED, T.STOPPING: T.STOPPED, T.STOPPED: T.ABSENT}
    for c, t in world.items():
        world[c] = after.get(t, t)


def _destination(node: Node) -> tuple[ReplicationSetState, str | None, bool]:
    """Where a set ends when its captures do as told: (state, primary, removed)."""
    rs = node.rs
    if node.removing:
        return S.REMOVING, None, True
    if rs.secondary is not None:  # an add or a move completes
        return S.REPLICATING, rs.secondary, False
    if rs.primary is not None:
        return S.REPLICATING, rs.primary, False
    return S.ABSENT, None, False  # nobody left to sink it: the manager re-adds it


def _at(rs: ReplicationSet) -> tuple[ReplicationSetState, str | None, bool]:
    return rs.state, rs.primary, rs.removed


def test_every_reachable_set_comes_to_rest_when_captures_do_as_told(explored) -> None:
    """Captures obey every dispatch, then report, each round: the set completes its add or
    move, its removal, or goes ABSENT when nobody is left to sink the table, within a few
    rounds, with no Undetermined capture left; no commit while another may write."""
    nodes, _, _ = explored
    for node in nodes.values():
        rs, want = copy.deepcopy(node.rs), _destination(node)
        world = _world(rs)
        for _ in range(6):
            for c in sorted(world):
                _obey(world, rs.poll(TableStatus(1, world[c], rs.checkpoint), c))
            _advance(world)
        assert (_at(rs), rs.has_undetermined()) == (want, False), (node.rs, rs, world)

"""Scale out under load (issue 17): a capture added while the changefeed is busy gets its
share of tables within a few owner ticks, with owner, agents and sinks of the simulator,
every validator checked on every step.

The periodic balance is set to a minute (6000 simulated ticks), so only the round that a
join sets off can give the new capture its share. With the old rule (a round only on a
tick where every table replicates and no task runs) a running move or adds in flight held
it back; CREATE TABLE DDLs alone do not, as each waits at its global barrier until the
tables before it replicate, which leaves quiet ticks between them (the DDL scenario
catches a balance that ignores the join instead).
"""

from __future__ import annotations

import random

from scheduler_core.coordinator import CoordinatorConfig
from scheduler_core.model import TableState
from scheduler_core.sim.simulator import SimConfig, Simulator

WITHIN = 8  # owner ticks from the join until the new capture holds its share of tables
PREPARE_TICKS = 10  # a table being added stays non-replicating this long


def busy_cluster(**kw) -> Simulator:
    config = SimConfig(
        captures=2,
        tables=10,
        prepare_ticks=PREPARE_TICKS,
        stop_ticks=2,
        exact_handoff=True,
        coordinator=CoordinatorConfig(balance_interval_ms=60_000),
        **kw,
    )
    sim = Simulator(11, config)
    for _ in range(30):
        sim.step()
    assert sim.converged()
    return sim


def held(sim: Simulator, cid: str) -> set[int]:
    """Tables the capture itself holds (any state but Absent / Stopped), as fs.held reads."""
    batch = sim.captures[cid].executor.statuses()
    live = (batch.states != int(TableState.ABSENT)) & (batch.states != int(TableState.STOPPED))
    return {int(t) for t in batch.table_ids[live]}


def share(sim: Simulator) -> int:
    """The fewest tables an even spread gives a capture."""
    assert sim.owner is not None
    return len(sim.owner.current_tables) // len(sim.alive())


def spread(sim: Simulator) -> list[int]:
    owner = sim.owner
    assert owner is not None
    return sorted(owner.replications.table_counts(sorted(sim.captures)).values())


def ticks_until_it_holds_its_share(sim: Simulator, cid: str, load) -> int | None:
    """Steps the world, ``load`` before each step; the step from which the capture held
    at least its share of tables (less one: a table may be on its way)."""
    for n in range(1, WITHIN + 1):
        load(sim, n)
        sim.step()
        if len(held(sim, cid)) >= share(sim) - 1:
            return n
    return None


def settle(sim: Simulator) -> None:
    assert sim.quiesce(200) > 0
    for _ in range(20):  # the rounds after a moving one, until even
        sim.step()


def test_new_capture_gets_tables_while_ddls_keep_adding_tables() -> None:
    sim = busy_cluster()

    def creates(sim: Simulator, n: int) -> None:
        if n % 5 == 0:  # a CREATE TABLE every 5 ticks: some table is always being added
            sim.create_table_ddl()

    for n in range(12):
        creates(sim, n)
        sim.step()
    assert sim.owner is not None and not sim.owner.replications.all_replicating()
    new = sim.add_capture()
    took = ticks_until_it_holds_its_share(sim, new, creates)
    assert took is not None, f"{new} held {held(sim, new)}, {WITHIN} ticks after it joined"
    settle(sim)
    counts = spread(sim)
    assert counts[-1] - counts[0] <= 1, counts


def test_new_capture_gets_tables_while_a_move_is_running() -> None:
    sim = busy_cluster()
    rng = random.Random(3)

    def moves(sim: Simulator, n: int) -> None:
        owner = sim.owner
        assert owner is not None
        if not owner.replications.running_tasks:  # keep one admin move in flight
            tid = rng.choice(sorted(sim.tables))
            src = owner.replications.view(tid).primary
            owner.move_table(tid, "capture-1" if src == "capture-0" else "capture-0")

    for n in range(4):
        moves(sim, n)
        sim.step()
    assert sim.owner is not None and sim.owner.replications.running_tasks
    new = sim.add_capture()
    took = ticks_until_it_holds_its_share(sim, new, moves)
    assert took is not None, f"{new} held {held(sim, new)}, {WITHIN} ticks after it joined"
    settle(sim)
    counts = spread(sim)
    assert counts[-1] - counts[0] <= 1, counts


def test_new_capture_gets_tables_while_other_tables_are_being_added() -> None:
    sim = busy_cluster()
    owner = sim.owner
    assert owner is not None
    before = {t: owner.replications.view(t).primary for t in sorted(sim.tables)}
    added = [sim.add_table() for _ in range(4)]
    for _ in range(3):
        sim.step()
    # The adds are out, on the two old captures, and will prepare for a while yet.
    assert {owner.replications.view(t).state.name for t in added} == {"PREPARE"}
    new = sim.add_capture()
    took = ticks_until_it_holds_its_share(sim, new, lambda sim, n: None)
    assert took is not None, f"{new} held {held(sim, new)}, {WITHIN} ticks after it joined"
    settle(sim)
    owner = sim.owner
    after = {t: owner.replications.view(t).primary for t in sorted(sim.tables)}
    assert spread(sim) == [4, 5, 5]
    # No needless moves: the tables placed before moved only to the new capture, no more
    # of them than it needed (the adds in flight counted where they were going).
    moved = [t for t, c in before.items() if after[t] != c]
    assert all(after[t] == new for t in moved) and len(moved) <= 5, (moved, after)

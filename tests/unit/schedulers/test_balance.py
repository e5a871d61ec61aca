"""Balance scheduler scenarios: a lopsided cluster, above all a capture that just joined,
gets its share under load (issue 17's scale out), one owner tick at a time."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler_core import Checkpoint, TableState, TableStatus
from scheduler_core.captures import CaptureState, CaptureStatus
from scheduler_core.errors import ConfigError
from scheduler_core.messages import TableStatusBatch
from scheduler_core.replication_manager import ReplicationManager
from scheduler_core.schedule_tasks import AddTableTask, MoveTableTask
from scheduler_core.schedulers import BalanceScheduler, ScheduleContext, unit_cost

CP = Checkpoint.at(100)
T0 = 5_000_000  # the owner's clock at the first tick (ms)
MINUTE = 60_000


def replicating(placement: dict[str, list[int]], *, max_tasks: int = 10) -> ReplicationManager:
    """A replication manager where every listed table replicates on its capture."""
    rm = ReplicationManager(max_task_concurrency=max_tasks)
    reports = {
        c: TableStatusBatch.of([TableStatus(t, TableState.REPLICATING, CP) for t in tids])
        for c, tids in placement.items()
        if tids
    }
    rm.rebuild(reports, CP)
    return rm


def context(
    rm: ReplicationManager,
    captures: list[str],
    now_ms: int | None,
    *,
    stopping: tuple[str, ...] = (),
    draining: str | None = None,
    drained: frozenset[str] = frozenset(),
) -> ScheduleContext:
    caps = {
        c: CaptureStatus(
            c,
            f"{c}-r",
            CaptureState.STOPPING if c in stopping else CaptureState.INITIALIZED,
            f"{c}-e",
        )
        for c in captures
    }
    current = np.asarray(sorted(rm.table_ids.tolist()), np.int64)
    return ScheduleContext(
        100, current, {}, caps, rm, now_ms=now_ms, draining=draining, drained=drained
    )


def balance(max_moves: int = 10, interval_ms: int = MINUTE) -> BalanceScheduler:
    return BalanceScheduler(rng=random.Random(0), interval_ms=interval_ms, max_moves=max_moves)


def moves(tasks: list) -> list[MoveTableTask]:
    assert all(isinstance(t, MoveTableTask) for t in tasks), tasks
    return tasks


def landing(rm: ReplicationManager, tasks: list[MoveTableTask], captures: list[str]) -> list[int]:
    """Table counts per capture once the planned moves and every task in flight are done."""
    loads = rm.landing_loads(captures, unit_cost)
    for t in tasks:
        src = rm.view(t.table_id).primary
        loads[src] -= 1
        loads[t.dest_capture_id] += 1
    return sorted(int(v) for v in loads.values())


# --------------------------------------------------------------------------- when a round runs
def test_new_capture_gets_tables_at_once_without_waiting_for_the_interval() -> None:
    rm = replicating({"a": [1, 2, 3, 4], "b": [5, 6, 7, 8]})
    bal = balance()
    assert bal.schedule(context(rm, ["a", "b"], T0)) == []  # even: nothing to move
    tasks = moves(bal.schedule(context(rm, ["a", "b", "c"], T0 + 5_000)))
    assert len(tasks) == 2 and {t.dest_capture_id for t in tasks} == {"c"}
    assert landing(rm, tasks, ["a", "b", "c"]) == [2, 3, 3]


def test_balance_waits_for_its_interval_when_the_captures_are_the_same() -> None:
    bal = balance()
    assert bal.schedule(context(replicating({"a": [1, 2], "b": [3, 4]}), ["a", "b"], T0)) == []
    lopsided = replicating({"a": [1, 2, 3, 4, 5, 6], "b": []})
    assert bal.schedule(context(lopsided, ["a", "b"], T0 + MINUTE - 1)) == []
    tasks = moves(bal.schedule(context(lopsided, ["a", "b"], T0 + MINUTE)))
    assert len(tasks) == 3 and {t.dest_capture_id for t in tasks} == {"b"}


def test_balance_goes_on_after_a_round_that_moved_until_the_load_is_even() -> None:
    bal = balance(max_moves=2)
    assert len(bal.schedule(context(replicating({"a": list(range(1, 9))}), ["a", "b"], T0))) == 2
    # The two moves landed: the next tick looks again, not a minute later.
    after = replicating({"a": list(range(1, 7)), "b": [7, 8]})
    assert len(bal.schedule(context(after, ["a", "b"], T0 + 1))) == 2
    even = replicating({"a": [1, 2, 3, 4], "b": [5, 6, 7, 8]})
    assert bal.schedule(context(even, ["a", "b"], T0 + 2)) == []  # even: the rounds stop
    lopsided = replicating({"a": list(range(1, 9)), "b": []})
    assert bal.schedule(context(lopsided, ["a", "b"], T0 + 3)) == []  # back to the interval


def test_without_a_clock_only_a_capture_change_or_a_moving_round_balances() -> None:
    bal = balance()
    assert bal.schedule(context(replicating({"a": [1, 2], "b": [3, 4]}), ["a", "b"], None)) == []
    lopsided = replicating({"a": [1, 2, 3, 4], "b": []})
    assert bal.schedule(context(lopsided, ["a", "b"], None)) == []
    assert len(bal.schedule(context(lopsided, ["a", "b", "c"], None))) == 2


def test_balanced_cluster_plans_no_moves() -> None:
    rm = replicating({"a": [1, 2], "b": [3, 4], "c": [5]})
    assert balance().schedule(context(rm, ["a", "b", "c"], T0)) == []


# --------------------------------------------------------------------------- under load
def test_new_capture_gets_tables_while_other_tables_are_being_added() -> None:
    rm = replicating({"a": [1, 2, 3, 4, 5, 6]})
    rm.handle_tasks([AddTableTask(7, "a", 100), AddTableTask(8, "a", 100)])  # a DDL's creates
    assert not rm.all_replicating()
    tasks = moves(balance().schedule(context(rm, ["a", "b"], T0)))
    assert len(tasks) == 4 and {t.dest_capture_id for t in tasks} == {"b"}
    assert {t.table_id for t in tasks} <= {1, 2, 3, 4, 5, 6}  # only replicating tables move
    assert landing(rm, tasks, ["a", "b"]) == [4, 4]


def test_tables_being_added_to_the_new_capture_count_there_so_none_moves_needlessly() -> None:
    rm = replicating({"a": [1, 2, 3, 4, 5, 6]})
    rm.handle_tasks([AddTableTask(7, "b", 100), AddTableTask(8, "b", 100)])
    tasks = moves(balance().schedule(context(rm, ["a", "b"], T0)))
    assert len(tasks) == 2  # not 3: tables 7 and 8 are on their way to b
    assert landing(rm, tasks, ["a", "b"]) == [4, 4]


def test_new_capture_gets_tables_while_a_move_is_running() -> None:
    rm = replicating({"a": list(range(1, 9)), "b": [9, 10]})
    rm.handle_tasks([MoveTableTask(9, "a")])  # an admin's move, in flight
    assert list(rm.running_tasks) == [9]
    tasks = moves(balance().schedule(context(rm, ["a", "b", "c"], T0)))
    assert 9 not in {t.table_id for t in tasks}
    assert {rm.view(t.table_id).primary for t in tasks} == {"a"}  # 9 counts on a already
    assert landing(rm, tasks, ["a", "b", "c"]) == [3, 3, 4]


def test_balance_moves_no_more_than_the_free_task_slots_and_waits_when_none_is_free() -> None:
    rm = replicating({"a": list(range(1, 21)), "b": [21]}, max_tasks=4)
    rm.handle_tasks([MoveTableTask(1, "b"), MoveTableTask(2, "b"), MoveTableTask(3, "b")])
    bal = balance(max_moves=4)
    assert len(bal.schedule(context(rm, ["a", "b"], T0))) == 1
    rm.handle_tasks([MoveTableTask(4, "b")])
    full = context(rm, ["a", "b", "c"], T0 + 1)
    assert bal.schedule(full) == [] and bal.due(full)  # still due: it runs once a slot frees


def test_a_source_whose_tables_are_all_in_flight_is_skipped_for_the_next() -> None:
    rm = replicating({"a": [1], "b": [7, 8, 9, 10, 11]})
    rm.handle_tasks([AddTableTask(t, "a", 100) for t in (2, 3, 4, 5, 6)])
    tasks = moves(balance().schedule(context(rm, ["a", "b", "c"], T0)))
    assert {t.dest_capture_id for t in tasks} == {"c"}
    assert sorted(rm.view(t.table_id).primary for t in tasks) == ["a", "b", "b"]


def test_balance_waits_while_a_capture_is_drained_or_stopping() -> None:
    rm = replicating({"a": [1, 2, 3, 4], "b": [], "c": []})
    bal = balance()
    assert bal.schedule(context(rm, ["a", "b", "c"], T0, draining="c")) == []
    assert bal.schedule(context(rm, ["a", "b", "c"], T0, stopping=("c",))) == []
    tasks = moves(bal.schedule(context(rm, ["a", "b", "c"], T0 + 1)))  # still due, now it runs
    assert landing(rm, tasks, ["a", "b", "c"]) == [1, 1, 2]


def test_a_drained_capture_gets_no_table_back_until_it_is_removed() -> None:
    """Its drain done, the emptied capture is not balanced onto again: the user drains it to
    remove it (a balance handing it tables back would never let the drain be seen done)."""
    rm = replicating({"a": [1, 2, 3, 4], "b": [5, 6, 7, 8], "c": []})
    bal = balance()
    assert bal.schedule(context(rm, ["a", "b", "c"], T0, drained=frozenset({"c"}))) == []
    tasks = moves(bal.schedule(context(rm, ["a", "b", "c"], T0 + 1)))  # forgotten: a newcomer
    assert {t.dest_capture_id for t in tasks} == {"c"}


def test_balance_config_errors() -> None:
    with pytest.raises(ConfigError, match="interval_ms"):
        BalanceScheduler(rng=random.Random(0), interval_ms=-1)
    with pytest.raises(ConfigError, match="max_moves"):
        BalanceScheduler(rng=random.Random(0), max_moves=0)


def test_new_capture_joining_while_every_table_is_still_being_added_is_balanced_once_they_replicate() -> (
    None
):
    # The soak's scale_out seed 102: a capture joined while the other's nine tables were all
    # being re-added; the round found nothing movable, and the capture sat idle.
    adding = replicating({})
    adding.handle_tasks([AddTableTask(t, "a", 100) for t in range(1, 7)])
    bal = balance()
    first = context(adding, ["a", "b"], T0)
    assert bal.schedule(first) == [] and bal.due(first)  # uneven, nothing movable yet: due
    settled = replicating({"a": list(range(1, 7))})
    tasks = moves(bal.schedule(context(settled, ["a", "b"], T0 + 5_000)))
    assert len(tasks) == 3 and {t.dest_capture_id for t in tasks} == {"b"}

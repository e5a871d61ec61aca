"""When a following capture run's ticks of its own slow down (``IDLE_TICK_S``): only a tick on
new data that found nothing to do makes a changefeed idle; any tick that finds it busy makes
it busy again."""

from __future__ import annotations

from cdc_dagster.defs.capture.job import idle_after
from cdc_dagster.runtime import TableProgress
from cdc_dagster.runtime.lanes import DATA, OWNER


def _table(state: str, checkpoint: int, resolved: int, rows: int = 0, table_id: int = 1):
    return TableProgress("cf", table_id, state, "capture-1", checkpoint, resolved, resolved, rows)


CAUGHT_UP = [_table("replicating", 100, 100, rows=7), _table("replicating", 90, 90, table_id=2)]


def test_a_data_tick_that_sank_nothing_and_left_nothing_makes_it_idle() -> None:
    assert idle_after(DATA, CAUGHT_UP, before=7, idle=False)
    assert idle_after(DATA, [], before=0, idle=False)  # no table on this capture


def test_a_tick_that_sank_rows_or_left_rows_unsunk_makes_it_busy_whatever_its_kind() -> None:
    sank = [_table("replicating", 100, 100, rows=9)]
    gathering = [_table("replicating", 50, 100, rows=7)]  # a backlog: staged, not yet sunk
    for why in (DATA, OWNER):
        assert not idle_after(why, sank, before=7, idle=True)
        assert not idle_after(why, gathering, before=7, idle=True)


def test_a_table_on_its_way_in_keeps_it_busy() -> None:
    """After `changefeed resume` the owner adds the tables back: while one is preparing or
    prepared it catches up with the backlog, and its next data must not wait 3 s."""
    for state in ("preparing", "prepared"):
        on_its_way = [_table(state, 100, 100), _table("replicating", 90, 90, table_id=2)]
        assert not idle_after(DATA, on_its_way, before=0, idle=True)
        assert not idle_after(OWNER, on_its_way, before=0, idle=True)


def test_a_tick_on_the_owners_messages_never_makes_it_idle() -> None:
    """It only keeps what the last data tick decided when it finds nothing to do (the drain:
    a data tick before the tables were added back found none, and held the backlog's last
    rows for the idle interval while the owner's ticks added them and they caught up)."""
    assert not idle_after(OWNER, CAUGHT_UP, before=7, idle=False)
    assert idle_after(OWNER, CAUGHT_UP, before=7, idle=True)
    assert not idle_after(OWNER, [], before=0, idle=False)

"""Changefeed checkpoint calculation: min over current tables, stopped by gaps, capped by barriers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.checkpoint import advance_checkpoint, barrier_cap
from scheduler_core.errors import InvalidMessageError
from scheduler_core.messages import Barrier
from scheduler_core.model import Checkpoint, TableState
from scheduler_core.ts import MAX_TS

R = int(TableState.REPLICATING)
ZERO = Checkpoint.at(0)
NO_BARRIER = Barrier()


def calc(
    rows: list[tuple[int, int, int, int]],
    *,
    barrier: Barrier = NO_BARRIER,
    count: int | None = None,
    previous: Checkpoint = ZERO,
) -> Checkpoint | None:
    """Rows are (table_id, state, checkpoint_ts, resolved_ts)."""
    cols = np.array(rows, dtype=np.int64).reshape(-1, 4).T
    n = len(rows) if count is None else count
    return advance_checkpoint(cols[0], cols[1], cols[2], cols[3], barrier, n, previous)


THREE = [(1, R, 300, 500), (2, R, 200, 600), (3, R, 400, 450)]


@pytest.mark.parametrize(
    ("rows", "kwargs", "expected"),
    [
        pytest.param(THREE, {}, Checkpoint(200, 450), id="min_over_tables"),
        pytest.param(THREE[:2], {"count": 3}, None, id="missing_table_stops_it"),
        pytest.param(
            THREE, {"barrier": Barrier(250)}, Checkpoint(200, 450), id="global_barrier_above_min"
        ),
        pytest.param(
            THREE, {"barrier": Barrier(150)}, Checkpoint(150, 450), id="capped_by_global_barrier"
        ),
        pytest.param(
            THREE,
            {"barrier": Barrier(MAX_TS, {3: 180})},
            Checkpoint(180, 450),
            id="capped_by_min_table_barrier",
        ),
        pytest.param(
            THREE,
            {"barrier": Barrier(170, {3: 180})},
            Checkpoint(170, 450),
            id="capped_by_lower_of_both_barriers",
        ),
        pytest.param(
            [(1, R, 500, 500), (2, R, 500, 600), (3, R, 450, 450)],
            {"barrier": Barrier(300)},
            Checkpoint(300, 450),
            id="resolved_is_not_capped_by_barrier",
        ),
        pytest.param(
            [(1, R, 500, 500), (2, R, 300, 300)],
            {},
            Checkpoint(300, 300),
            id="checkpoint_at_most_resolved",
        ),
        pytest.param(
            THREE,
            {"previous": Checkpoint(350, 700)},
            Checkpoint(350, 700),
            id="never_regresses",
        ),
        pytest.param(
            THREE,
            {"previous": Checkpoint(100, 700)},
            Checkpoint(200, 700),
            id="each_component_never_regresses",
        ),
        pytest.param([], {}, None, id="empty_changefeed_unbounded"),
        pytest.param(
            [], {"barrier": Barrier(300)}, Checkpoint(300, 300), id="empty_moves_to_barrier"
        ),
        pytest.param(
            [],
            {"barrier": Barrier(300), "previous": Checkpoint(350, 400)},
            Checkpoint(350, 400),
            id="empty_never_regresses",
        ),
    ],
)
def test_advance_checkpoint(
    rows: list[tuple[int, int, int, int]], kwargs: dict, expected: Checkpoint | None
) -> None:
    assert calc(rows, **kwargs) == expected


@pytest.mark.parametrize(
    "state", [s for s in TableState if s != TableState.REPLICATING], ids=lambda s: s.name
)
def test_table_not_replicating_stops_it(state: TableState) -> None:
    rows = [*THREE[:2], (3, int(state), 400, 450)]
    assert calc(rows) is None


@pytest.mark.parametrize(
    ("rows", "count", "match"),
    [
        pytest.param(THREE, 2, "3 table rows for 2 current tables", id="more_rows_than_tables"),
        pytest.param(THREE, -1, "current_table_count", id="negative_count"),
    ],
)
def test_bad_input_raises(rows: list[tuple[int, int, int, int]], count: int, match: str) -> None:
    with pytest.raises(InvalidMessageError, match=match):
        calc(rows, count=count)


def test_columns_of_different_lengths_raise() -> None:
    ids = np.arange(3, dtype=np.int64)
    with pytest.raises(InvalidMessageError, match="same length"):
        advance_checkpoint(ids, ids[:2], ids, ids, Barrier(), 3, ZERO)


def test_barrier_cap_is_min_of_global_and_table_barriers() -> None:
    assert barrier_cap(Barrier()) == MAX_TS
    assert barrier_cap(Barrier(500, {1: 300, 2: 400})) == 300


N = 1_000_000


def million_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    ids = rng.permutation(N).astype(np.int64)
    states = np.full(N, R, dtype=np.int64)
    checkpoints = rng.integers(10_000, 20_000, N, dtype=np.int64)
    resolved = checkpoints + rng.integers(0, 5_000, N, dtype=np.int64)
    checkpoints[777_777] = 5_000  # the known slowest table
    checkpoints[123], resolved[123] = 9_000, 9_999  # the known lowest resolved
    return ids, states, checkpoints, resolved


def test_million_tables_min_over_all() -> None:
    ids, states, checkpoints, resolved = million_tables()
    result = advance_checkpoint(ids, states, checkpoints, resolved, Barrier(), N, ZERO)
    assert result == Checkpoint(5_000, 9_999)


def test_million_tables_one_not_replicating_stops_it() -> None:
    ids, states, checkpoints, resolved = million_tables()
    states[N - 1] = int(TableState.PREPARED)
    assert advance_checkpoint(ids, states, checkpoints, resolved, Barrier(), N, ZERO) is None


def test_million_tables_one_missing_stops_it() -> None:
    ids, states, checkpoints, resolved = million_tables()
    cols = (ids[1:], states[1:], checkpoints[1:], resolved[1:])
    assert advance_checkpoint(*cols, Barrier(), N, ZERO) is None


row = st.tuples(st.integers(0, 10_000), st.integers(0, 10_000))  # (checkpoint, resolved - it)
NOT_REPLICATING = [int(s) for s in TableState if s != TableState.REPLICATING]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    rows=st.lists(row, min_size=1, max_size=40),
    stalled=st.none() | st.tuples(st.integers(0, 39), st.sampled_from(NOT_REPLICATING)),
    global_barrier=st.integers(0, 30_000),
    table_barrier=st.none() | st.integers(0, 30_000),
    previous_ts=st.integers(0, 20_000),
    previous_lag=st.integers(0, 1_000),
)
def test_property_never_exceeds_a_replicating_table_and_never_regresses(
    rows: list[tuple[int, int]],
    stalled: tuple[int, int] | None,
    global_barrier: int,
    table_barrier: int | None,
    previous_ts: int,
    previous_lag: int,
) -> None:
    states = np.full(len(rows), R, dtype=np.int64)
    if stalled is not None:
        states[stalled[0] % len(rows)] = stalled[1]
    checkpoints = np.array([c for c, _ in rows], dtype=np.int64)
    resolved = checkpoints + np.array([d for _, d in rows], dtype=np.int64)
    ids = np.arange(len(rows), dtype=np.int64)
    barriers = {} if table_barrier is None else {0: table_barrier}
    barrier = Barrier(global_barrier, barriers)
    previous = Checkpoint(previous_ts, previous_ts + previous_lag)

    result = advance_checkpoint(ids, states, checkpoints, resolved, barrier, len(rows), previous)

    if stalled is not None:
        assert result is None
        return
    assert result is not None
    assert result.checkpoint_ts >= previous.checkpoint_ts
    assert result.resolved_ts >= previous.resolved_ts
    assert result.checkpoint_ts <= result.resolved_ts
    # Above the previous checkpoint only as far as every table and every barrier allow.
    if result.checkpoint_ts > previous.checkpoint_ts:
        assert (result.checkpoint_ts <= checkpoints).all()
        assert result.checkpoint_ts <= barrier_cap(barrier)

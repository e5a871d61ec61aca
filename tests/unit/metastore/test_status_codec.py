"""The per-capture task status encoding: exact round trips, compact, strict on bad bytes."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from cdc_dagster.metastore.errors import CorruptValueError, InvalidArgumentError
from cdc_dagster.metastore.status_codec import TaskStatus, decode, encode, sorted_batch
from scheduler_core.messages import Liveness, TableStatusBatch
from scheduler_core.model import TableState
from scheduler_core.ts import MAX_TS, compose

NOW = compose(1_763_770_000_000)


def _batch(ids, states, ckpt, res) -> TableStatusBatch:
    return TableStatusBatch(np.asarray(ids), np.asarray(states), np.asarray(ckpt), np.asarray(res))


def _random_status(seed: int, n: int) -> TaskStatus:
    rng = np.random.default_rng(seed)
    ids = rng.choice(10 * n + 1, size=n, replace=False)
    ckpt = NOW + rng.integers(0, 5_000 << 18, size=n)
    res = ckpt + rng.integers(0, 2_000 << 18, size=n)
    states = rng.integers(0, len(TableState), size=n)
    liveness = Liveness(int(rng.integers(0, len(Liveness))))
    return TaskStatus(
        int(rng.integers(0, 2**40)),
        int(rng.integers(0, 2**60)),
        liveness,
        _batch(ids, states, ckpt, res),
    )


@pytest.mark.parametrize(
    "status",
    [
        TaskStatus(0, 0, Liveness.ALIVE, _batch([], [], [], [])),
        TaskStatus(3, 9, Liveness.STOPPING, _batch([42], [TableState.PREPARING], [NOW], [NOW + 1])),
        TaskStatus(
            2**64 - 1,
            2**64 - 1,
            Liveness.ALIVE,
            _batch([0, 2**62], [0, 5], [0, MAX_TS - 1], [MAX_TS, MAX_TS]),
        ),
        TaskStatus(1, 1, Liveness.ALIVE, _batch(range(6), list(TableState), [NOW] * 6, [NOW] * 6)),
    ],
    ids=["empty", "one-table", "extremes", "every-state"],
)
def test_edge_cases_round_trip_exactly(status: TaskStatus) -> None:
    assert decode(encode(status)) == status


@pytest.mark.parametrize("seed", range(20))
def test_seeded_random_statuses_round_trip_in_table_id_order(seed: int) -> None:
    status = _random_status(seed, n=1 + seed * 137)
    decoded = decode(encode(status))
    assert decoded.tables == sorted_batch(status.tables)
    assert (decoded.owner_rev, decoded.changefeed_epoch, decoded.liveness) == (
        status.owner_rev,
        status.changefeed_epoch,
        status.liveness,
    )


def test_rows_applied_round_trip_with_their_tables_in_table_id_order() -> None:
    tables = _batch([9, 2, 5], [3, 1, 3], [30, 10, 20], [31, 11, 21])
    status = TaskStatus(4, 2, Liveness.ALIVE, tables, np.array([10_000_000, 0, 7]))
    decoded = decode(encode(status))
    assert decoded.tables == _batch([2, 5, 9], [1, 3, 3], [10, 20, 30], [11, 21, 31])
    assert decoded.rows_applied.tolist() == [0, 7, 10_000_000]
    assert decoded.rows_by_table() == {5: 7, 9: 10_000_000}
    assert decoded == TaskStatus(4, 2, Liveness.ALIVE, decoded.tables, [0, 7, 10_000_000])
    assert decoded != TaskStatus(4, 2, Liveness.ALIVE, decoded.tables, [0, 8, 10_000_000])


@pytest.mark.parametrize("seed", range(5))
def test_seeded_random_rows_applied_round_trip(seed: int) -> None:
    status = _random_status(seed, n=1 + seed * 997)
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 2**40, len(status.tables)) * rng.integers(0, 2, len(status.tables))
    status = TaskStatus(status.owner_rev, status.changefeed_epoch, status.liveness,
                        status.tables, rows)  # fmt: skip
    decoded = decode(encode(status))
    order = np.argsort(status.tables.table_ids)
    assert decoded.tables == sorted_batch(status.tables)
    assert np.array_equal(decoded.rows_applied, rows[order])


def test_a_status_built_without_rows_has_zero_rows_and_bad_rows_are_refused() -> None:
    tables = _batch([1, 2], [3, 3], [5, 6], [7, 8])
    status = TaskStatus(1, 1, Liveness.ALIVE, tables)
    assert status.rows_applied.tolist() == [0, 0] and status.rows_by_table() == {}
    assert decode(encode(status)) == status
    for bad in ([1], [1, -1], [[1, 2]], [1.5, 2.0]):
        with pytest.raises(InvalidArgumentError, match="rows_applied"):
            TaskStatus(1, 1, Liveness.ALIVE, tables, np.asarray(bad))
    mine = np.array([3, 4])
    TaskStatus(1, 1, Liveness.ALIVE, tables, mine)
    assert mine.flags.writeable  # the caller's array is left as it was


# Written by the version-1 codec (the release before rows_applied) for tables 7, 3, 12
# (states 3, 3, 1; checkpoints NOW, NOW + 5, NOW; resolved NOW + 9), owner_rev 5, epoch 2.
VERSION_1_VALUE = bytes.fromhex(
    "545301000300000005000000000000000200000000000000789c636466616566666460646060e8ea5c9cc5c6"
    "0a64307242394036003b560471"
)


def test_a_version_1_value_from_the_last_release_decodes_with_0_rows() -> None:
    decoded = decode(VERSION_1_VALUE)
    assert (decoded.owner_rev, decoded.changefeed_epoch, decoded.liveness) == (
        5,
        2,
        Liveness.ALIVE,
    )
    assert decoded.tables == _batch(
        [3, 7, 12], [3, 3, 1], [NOW + 5, NOW, NOW], [NOW + 9, NOW + 9, NOW + 9]
    )
    assert decoded.rows_applied.tolist() == [0, 0, 0]
    assert encode(decoded)[2] == 2  # written back as the current version


def test_unsorted_input_decodes_sorted_by_table_id() -> None:
    status = TaskStatus(
        1, 1, Liveness.ALIVE, _batch([9, 2, 5], [3, 1, 2], [30, 10, 20], [31, 11, 21])
    )
    assert decode(encode(status)).tables == _batch([2, 5, 9], [1, 2, 3], [10, 20, 30], [11, 21, 31])


def _capture_of(n: int, seed: int, marks: int | None) -> TaskStatus:
    """n tables 8 ids apart; checkpoints drawn from ``marks`` resolved-ts values (None: all distinct)."""
    rng = np.random.default_rng(seed)
    if marks is None:
        ckpt = NOW + rng.integers(0, 5_000 << 18, size=n)
        res = ckpt + rng.integers(0, 2_000 << 18, size=n)
    else:
        values = (
            NOW
            + np.sort(rng.integers(0, 5_000, marks)) * (1 << 18)
            + rng.integers(0, 1 << 18, marks)
        )
        ckpt = rng.choice(values, n)
        res = np.maximum(ckpt, rng.choice(values, n))
    return TaskStatus(1, 1, Liveness.ALIVE, _batch(np.arange(n) * 8 + 3, np.full(n, 3), ckpt, res))


def test_tables_sharing_a_hundred_resolved_marks_cost_under_2_5_bytes_each() -> None:
    status = _capture_of(12_500, seed=7, marks=100)
    assert decode(encode(status)) == status
    assert len(encode(status)) < 2.5 * 12_500


def test_tables_with_all_distinct_checkpoints_still_cost_under_10_bytes_each() -> None:
    status = _capture_of(12_500, seed=8, marks=None)
    assert decode(encode(status)) == status
    assert len(encode(status)) < 10 * 12_500


def test_rows_applied_of_twelve_thousand_busy_tables_cost_under_6_bytes_each() -> None:
    """Counters that differ table by table (a capture's busy tables) add a few bytes per
    table; all-zero counters (idle, or a capture of the last release) add nothing."""
    status = _capture_of(12_500, seed=7, marks=100)
    rows = np.random.default_rng(3).integers(0, 10**6, 12_500)
    busy = TaskStatus(1, 1, Liveness.ALIVE, status.tables, rows)
    assert decode(encode(busy)) == busy
    assert len(encode(busy)) < 6 * 12_500
    idle = TaskStatus(1, 1, Liveness.ALIVE, status.tables, np.zeros(12_500, np.int64))
    assert len(encode(idle)) == len(encode(status))


def _header(n: int, version: int = 1) -> bytes:
    return struct.pack("<2sBBIQQ", b"TS", version, 0, n, 1, 1)


def _offset_column(base: int, *offsets: int) -> bytes:
    return (
        bytes([0, 8])
        + struct.pack("<Q", base)
        + np.asarray(offsets, "<u8").view(np.uint8).reshape(-1, 8).T.tobytes()
    )


_TWO_ROWS = bytes([1, 1, 1]) + bytes([3, 3])  # ids 1, 2 (width 1, deltas 1 1), both replicating


def _corrupt_cases() -> dict[str, bytes]:
    good = encode(TaskStatus(1, 1, Liveness.ALIVE, _batch([1, 2], [3, 3], [5, 6], [7, 8])))
    body = zlib.decompress(good[24:])
    ok_columns = _offset_column(5, 0, 1) + _offset_column(7, 0, 1)
    dict_k1_index_1 = (
        bytes([1]) + struct.pack("<I", 1) + bytes([1]) + struct.pack("<Q", 5) + bytes([0, 1, 0, 1])
    )
    return {
        "empty": b"",
        "short header": good[:10],
        "bad magic": b"XX" + good[2:],
        "future version": good[:2] + bytes([3]) + good[3:],
        "version 0": good[:2] + bytes([0]) + good[3:],
        "a version 2 value read as version 1 (trailing rows column)": good[:2]
        + bytes([1])
        + good[3:],
        "not zlib": good[:24] + b"garbage",
        "truncated body": good[:-3],
        "count too high": _header(3) + good[24:],
        "bad width": good[:24] + zlib.compress(bytes([3]) + body[1:]),
        "trailing bytes": good[:24] + zlib.compress(body + b"\0"),
        "control: hand-built body decodes": _header(2) + zlib.compress(_TWO_ROWS + ok_columns),
        "checkpoint above resolved": _header(2)
        + zlib.compress(_TWO_ROWS + _offset_column(9, 0, 1) + _offset_column(7, 0, 1)),
        "base beyond 2^63": _header(2)
        + zlib.compress(_TWO_ROWS + _offset_column(2**63, 0, 1) + _offset_column(7, 0, 1)),
        "dictionary index out of range": _header(2)
        + zlib.compress(_TWO_ROWS + dict_k1_index_1 + _offset_column(7, 0, 1)),
        "unknown column mode": _header(2) + zlib.compress(_TWO_ROWS + bytes([2]) + ok_columns[1:]),
        "version 2 without its rows column": _header(2, 2) + zlib.compress(_TWO_ROWS + ok_columns),
        "negative rows": _header(2, 2)
        + zlib.compress(_TWO_ROWS + ok_columns + _offset_column(2**62, 0, 2**62)),
    }


@pytest.mark.parametrize("case", [c for c in _corrupt_cases() if not c.startswith("control")])
def test_corrupt_bytes_raise_corrupt_value_error(case: str) -> None:
    with pytest.raises(CorruptValueError):
        decode(_corrupt_cases()[case])


def test_hand_built_body_used_by_the_corrupt_cases_is_itself_valid() -> None:
    decoded = decode(_corrupt_cases()["control: hand-built body decodes"])
    assert decoded.tables == _batch([1, 2], [3, 3], [5, 6], [7, 8])
    with_rows = _corrupt_cases()["version 2 without its rows column"][:24] + zlib.compress(
        _TWO_ROWS + _offset_column(5, 0, 1) + _offset_column(7, 0, 1) + _offset_column(0, 4, 9)
    )
    assert decode(with_rows).rows_applied.tolist() == [4, 9]

"""The owner tick as the sensor runs it: decoding the captures' reports is part of it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cdc_dagster.metastore.status_codec import TaskStatus, decode, encode
from scheduler_core import messages
from scheduler_core.errors import InvalidMessageError
from scheduler_core.messages import Liveness, TableStatusBatch


def _status(n: int) -> TaskStatus:
    ids = np.arange(1, 3 * n, 3, dtype=np.int64)[:n]
    ts = np.full(n, 1 << 40, np.int64)
    return TaskStatus(7, 1, Liveness.ALIVE, TableStatusBatch(ids, np.full(n, 3), ts, ts))


def test_decoding_a_report_does_not_hash_its_sorted_table_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    value = encode(_status(10_000))

    def no_hash(*args: object, **kwargs: object) -> None:
        raise AssertionError("np.unique (a hash pass per report) on already sorted ids")

    monkeypatch.setattr(messages.np, "unique", no_hash)
    assert len(decode(value).tables) == 10_000


@pytest.mark.parametrize("ids", [[1, 1, 2], [3, 1, 3]], ids=["sorted", "unsorted"])
def test_a_table_reported_twice_is_still_refused(ids: list[int]) -> None:
    n = len(ids)
    with pytest.raises(InvalidMessageError, match="twice"):
        TableStatusBatch(ids, [3] * n, [1] * n, [1] * n)


def test_the_bench_reports_the_owner_tick_with_decode_in_its_machine_line(load_bench: Any) -> None:
    bench = load_bench("scheduler_bench")

    result, _ = bench.run_size(1_000, 8)

    assert result.owner_tick_p50_ms >= result.steady_p50_ms > 0
    assert result.paced_ticks >= 1_000 // 50
    line = result.machine_line()
    assert f"owner_tick_p50_ms={result.owner_tick_p50_ms:.3f}" in line
    assert "paced_initial_ticks=" in line

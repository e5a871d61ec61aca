"""A capture run that follows warms its bulk workers and itself, its workers sized by the
captures registered (their runs share the machine's cores)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cdc_dagster.defs.capture import job as capture_job
from cdc_dagster.metastore.errors import EtcdUnavailableError
from cdc_dagster.pipeline import background


class _Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, msg: str, *args: Any) -> None:
        self.warnings.append(msg % args)


def _context(seconds: float) -> Any:
    return SimpleNamespace(run_config={"ops": {"follow": {"config": {"seconds": seconds}}}},
                           log=_Log())  # fmt: skip


def _cdc(desired: Any, bulk_tick_rows: int = 50_000) -> Any:
    def captures_desired() -> dict[str, int]:
        if isinstance(desired, Exception):
            raise desired
        return desired

    ms = SimpleNamespace(captures=SimpleNamespace(desired=captures_desired))
    return SimpleNamespace(
        settings=lambda: SimpleNamespace(bulk_tick_rows=bulk_tick_rows), metastore=lambda: ms
    )


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    got: list[tuple[Any, ...]] = []
    monkeypatch.setattr(background, "_captures", 1)
    monkeypatch.setattr(background, "share", lambda n: got.append(("share", n)))
    monkeypatch.setattr(background, "warm", lambda workers=True: got.append(("warm", workers)))
    monkeypatch.setattr(background, "warm_when_idle",
                        lambda max_wait_s, idle_cores=1.0, workers=True:
                        got.append(("when_idle", workers)))  # fmt: skip
    return got


def test_its_workers_are_shared_by_the_captures_registered(calls: list[tuple[Any, ...]]) -> None:
    capture_job._warm_bulk_workers(_context(300), _cdc({"capture-1": 60, "capture-2": 60}))
    assert calls == [("share", 2), ("when_idle", True)]
    calls.clear()
    capture_job._warm_bulk_workers(_context(300), _cdc({"capture-1": 60}), now=True)
    assert calls == [("warm", True)]  # (counted as it began)


def test_etcd_away_warns_and_the_workers_are_as_for_one(calls: list[tuple[Any, ...]]) -> None:
    ctx = _context(300)
    capture_job._warm_bulk_workers(ctx, _cdc(EtcdUnavailableError("etcd down")))
    assert calls == [("when_idle", True)]
    assert ctx.log.warnings == ["captures not counted (etcd down): bulk workers as for one"]


def test_without_bulk_phases_it_still_warms_its_own_merge(calls: list[tuple[Any, ...]]) -> None:
    capture_job._warm_bulk_workers(_context(300), _cdc({"a": 1}, bulk_tick_rows=0))
    assert calls == [("when_idle", False)]


def test_a_one_tick_run_warms_nothing(calls: list[tuple[Any, ...]]) -> None:
    capture_job._warm_bulk_workers(_context(0), _cdc({"a": 1}))
    assert calls == []

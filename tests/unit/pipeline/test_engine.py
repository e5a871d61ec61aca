"""``spark_session``: a local JVM that exits as it starts gets one more try; nothing else is
retried."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from cdc_dagster.pipeline import engine


def _failing(monkeypatch: pytest.MonkeyPatch, errors: list[Exception]) -> list[int]:
    """``getOrCreate`` raising ``errors`` one per call, then returning a sentinel; the calls."""
    calls: list[int] = []

    def get_or_create(self: Any) -> Any:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return "session"

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", get_or_create)
    monkeypatch.setattr(engine, "GATEWAY_RETRY_S", 0.0)
    return calls


def _exited() -> PySparkRuntimeError:
    return PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})


def test_a_local_jvm_that_exited_as_it_started_is_started_once_more(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = _failing(monkeypatch, [_exited()])
    assert engine.spark_session("local[1]") == "session"
    assert len(calls) == 2
    assert "exited as it started" in caplog.text


def test_a_second_exit_and_other_errors_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _failing(monkeypatch, [_exited(), _exited()])
    with pytest.raises(PySparkRuntimeError, match="JAVA_GATEWAY_EXITED"):
        engine.spark_session("local[1]")
    assert len(calls) == 2
    calls = _failing(monkeypatch, [ValueError("not the JVM"), _exited()])
    with pytest.raises(ValueError, match="not the JVM"):
        engine.spark_session("local[1]")
    assert len(calls) == 1

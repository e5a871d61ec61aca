"""The Delta sink's warm-up: one scratch MERGE per process, never an error."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest
from deltalake.exceptions import DeltaError

from cdc_dagster.sinks import delta


@pytest.fixture(autouse=True)
def _not_warmed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(delta, "_WARMED_PID", 0)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its scratch table goes here


def test_it_merges_once_per_process_and_leaves_nothing_behind(tmp_path: Path) -> None:
    assert delta.warm_up() is True
    assert os.getpid() == delta._WARMED_PID
    assert delta.warm_up() is False  # once per process
    assert list(tmp_path.iterdir()) == []  # the scratch table is gone


@pytest.mark.parametrize("codec", sorted(delta._CODECS))
def test_every_codec_of_the_sink_warms(codec: str) -> None:
    assert delta.warm_up(codec) is True


def test_a_failure_is_a_warning_and_the_first_real_merge_pays_instead(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise DeltaError("disk full")

    monkeypatch.setattr(delta, "write_deltalake", refuse)
    with caplog.at_level(logging.WARNING, logger=delta.__name__):
        assert delta.warm_up() is False
    assert "the Delta warm-up MERGE failed (disk full)" in caplog.text

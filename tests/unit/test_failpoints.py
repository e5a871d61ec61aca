"""Failpoints: the variable's grammar, each action, counts (in one process and across
processes), and that every named place is hit somewhere in the code."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdc_dagster import failpoints
from cdc_dagster.failpoints import Action, Failpoint, FailpointConfigError, FailpointError

ROOT = Path(failpoints.__file__).resolve().parent


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    monkeypatch.delenv(failpoints.STATE_ENV, raising=False)
    failpoints.reload()


def test_parse_splits_terms_and_reads_counts_and_arguments() -> None:
    points = failpoints.parse(
        "sink.after_write=crash; capture.prepare=error(disk gone);"
        "puller.after_changelog_write=2*delay(2.5);owner.before_write=off;"
    )
    assert points == {
        "sink.after_write": Failpoint("sink.after_write", Action.CRASH),
        "capture.prepare": Failpoint("capture.prepare", Action.ERROR, "disk gone"),
        "puller.after_changelog_write": Failpoint(
            "puller.after_changelog_write", Action.DELAY, "2.5", 2
        ),
        "owner.before_write": Failpoint("owner.before_write", Action.OFF),
    }
    assert failpoints.parse("") == {} and failpoints.parse(" ; ") == {}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("sink.after_writ=crash", "unknown failpoint 'sink.after_writ'"),
        ("sink.after_write=explode", "unknown action 'explode'"),
        ("sink.after_write", "is not name=[count*]action"),
        ("sink.after_write=0*crash", "count must be >= 1"),
        ("sink.after_write=delay(soon)", "delay(soon) needs seconds"),
        ("sink.after_write=delay(-1)", "delay must be >= 0"),
        ("sink.after_write=crash;sink.after_write=off", "configured twice"),
        ("capture.prepare=error(a;b)", "is not name=[count*]action"),  # ';' splits terms
    ],
)
def test_bad_terms_are_refused_with_the_reason(text: str, fragment: str) -> None:
    with pytest.raises(FailpointConfigError) as info:
        failpoints.parse(text)
    assert fragment in str(info.value)


def test_unset_variable_makes_every_hit_a_no_op() -> None:
    for name in failpoints.POINTS:
        failpoints.hit(name)


def test_error_raises_with_the_message() -> None:
    with failpoints.configured("capture.prepare=error(disk gone)"):
        with pytest.raises(FailpointError, match="disk gone"):
            failpoints.hit("capture.prepare")
        failpoints.hit("sink.after_write")  # another place is untouched


def test_delay_sleeps_then_goes_on() -> None:
    with failpoints.configured("owner.before_write=delay(0.3)"):
        start = time.monotonic()
        failpoints.hit("owner.before_write")
        assert time.monotonic() - start >= 0.3


def test_off_does_nothing() -> None:
    with failpoints.configured("sink.after_write=off"):
        failpoints.hit("sink.after_write")


def test_count_fires_the_first_hits_only() -> None:
    with failpoints.configured("capture.prepare=2*error(boom)"):
        for _ in range(2):
            with pytest.raises(FailpointError):
                failpoints.hit("capture.prepare")
        failpoints.hit("capture.prepare")  # the third hit passes


def test_configured_restores_the_variable() -> None:
    with failpoints.configured("sink.after_write=error(x)"):
        assert os.environ[failpoints.ENV] == "sink.after_write=error(x)"
    assert failpoints.ENV not in os.environ
    failpoints.hit("sink.after_write")


def _hit_in_subprocess(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "from cdc_dagster import failpoints; failpoints.hit('sink.after_write'); print('passed')"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_crash_exits_at_once_with_its_own_code() -> None:
    proc = _hit_in_subprocess({failpoints.ENV: "sink.after_write=crash"})
    assert proc.returncode == failpoints.CRASH_EXIT_CODE
    assert "passed" not in proc.stdout
    assert "failpoint sink.after_write: crash" in proc.stderr


def test_count_is_shared_by_processes_with_a_state_dir(tmp_path: Path) -> None:
    env = {failpoints.ENV: "sink.after_write=1*crash", failpoints.STATE_ENV: str(tmp_path)}
    codes = [_hit_in_subprocess(env).returncode for _ in range(3)]
    assert codes == [failpoints.CRASH_EXIT_CODE, 0, 0]
    assert [p.name for p in tmp_path.iterdir()] == ["sink.after_write.1"]


def test_a_bad_variable_fails_the_first_hit_loudly() -> None:
    proc = _hit_in_subprocess({failpoints.ENV: "sink.after_write=crsh"})
    assert proc.returncode == 1 and "unknown action 'crsh'" in proc.stderr


def _hits_in_code() -> dict[str, list[str]]:
    """Failpoint name -> the modules that hit it (calls ``failpoints.hit(failpoints.X)``)."""
    found: dict[str, list[str]] = {}
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "hit"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "failpoints"
            ):
                (arg,) = node.args
                assert isinstance(arg, ast.Attribute), f"{path}: name a failpoints constant"
                name = getattr(failpoints, arg.attr)
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_failpoint_is_hit_at_exactly_one_place() -> None:
    hits = _hits_in_code()
    assert sorted(hits) == sorted(failpoints.POINTS)
    assert all(len(where) == 1 for where in hits.values()), hits
    assert hits == {
        "sink.after_write": ["runtime/capture.py"],
        "capture.prepare": ["runtime/capture.py"],
        "ddl.after_apply": ["runtime/owner.py"],
        "puller.after_changelog_write": ["mysql/puller.py"],
        "owner.before_write": ["runtime/owner.py"],
    }

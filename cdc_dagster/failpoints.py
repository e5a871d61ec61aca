"""Failpoints: named places where a test injects an error, a delay or a crash.

Driven by one environment variable, read once per process on the first :func:`hit`::

    CDC_DAGSTER_FAILPOINTS="sink.after_write=crash;capture.prepare=error(disk gone);
                            puller.after_changelog_write=1*delay(2.5)"

Each term is ``name=[count*]action``; actions (the grammar of pingcap/failpoint, shortened):

- ``off``            nothing (a term to switch a point off without deleting it)
- ``error(message)`` raise :class:`FailpointError` with ``message``
- ``delay(seconds)`` sleep that long, then go on
- ``crash``          ``os._exit(CRASH_EXIT_CODE)`` (no cleanup, no flush: a kill -9 with a
                     code of its own, so a test tells an injected crash from a real one)

``count*`` fires the first ``count`` hits only. Counts are per process, unless
``CDC_DAGSTER_FAILPOINTS_STATE`` names a directory: then every process sharing it shares the
count (each firing creates ``<name>.<n>`` there exclusively), so ``1*crash`` kills exactly
one capture run of a whole Dagster deployment, not one per run process.

When the variable is unset, :func:`hit` costs one dict lookup. The places are :data:`POINTS`;
a name in the variable that is not one of them is refused, so a typo cannot silently test
nothing.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

ENV = "CDC_DAGSTER_FAILPOINTS"
STATE_ENV = "CDC_DAGSTER_FAILPOINTS_STATE"
CRASH_EXIT_CODE = 86  # what an injected crash exits with (not a signal's 128+n)

SINK_AFTER_WRITE = "sink.after_write"
CAPTURE_PREPARE = "capture.prepare"
DDL_AFTER_APPLY = "ddl.after_apply"
PULLER_AFTER_CHANGELOG_WRITE = "puller.after_changelog_write"
OWNER_BEFORE_WRITE = "owner.before_write"

POINTS: Mapping[str, str] = {
    SINK_AFTER_WRITE: "capture commit: the sink wrote the batch, the checkpoint is not reported",
    CAPTURE_PREPARE: "capture prepare: pulled into staging, the state is not persisted",
    DDL_AFTER_APPLY: "a DDL applied at the sink, its applied marker not yet written",
    PULLER_AFTER_CHANGELOG_WRITE: "binlog puller: change-log files written, position not saved",
    OWNER_BEFORE_WRITE: "owner tick: decided, its owner-guarded etcd write not yet done",
}


class FailpointError(RuntimeError):
    """The error an ``error(...)`` failpoint raises."""


class FailpointConfigError(ValueError):
    """The failpoint variable does not parse (the message names the term and why)."""


class Action(Enum):
    """What a failpoint does when it fires."""

    OFF = "off"  # nothing
    ERROR = "error"  # raise FailpointError(arg)
    DELAY = "delay"  # sleep float(arg) seconds
    CRASH = "crash"  # os._exit(CRASH_EXIT_CODE)


@dataclass(frozen=True, slots=True)
class Failpoint:
    """One configured failpoint."""

    name: str
    action: Action
    arg: str = ""
    count: int | None = None  # fire this many times at most (None: every hit)

    def __post_init__(self) -> None:
        if self.name not in POINTS:
            raise FailpointConfigError(
                f"unknown failpoint {self.name!r}; known: {', '.join(sorted(POINTS))}"
            )
        if self.count is not None and self.count < 1:
            raise FailpointConfigError(f"failpoint {self.name}: count must be >= 1")
        if self.action is Action.DELAY:
            try:
                seconds = float(self.arg)
            except ValueError:
                raise FailpointConfigError(
                    f"failpoint {self.name}: delay({self.arg}) needs seconds, e.g. delay(2.5)"
                ) from None
            if not seconds >= 0:
                raise FailpointConfigError(f"failpoint {self.name}: delay must be >= 0")


_TERM = re.compile(r"^(?:(?P<count>\d+)\*)?(?P<action>[a-z]+)(?:\((?P<arg>.*)\))?$", re.S)


def parse(text: str) -> dict[str, Failpoint]:
    """``name=[n*]action[(arg)];...`` -> failpoints by name (FailpointConfigError if bad)."""
    points: dict[str, Failpoint] = {}
    for term in (t.strip() for t in text.split(";")):
        if not term:
            continue
        name, eq, spec = (s.strip() for s in term.partition("="))
        match = _TERM.match(spec)
        if not eq or not name or match is None:
            raise FailpointConfigError(
                f"failpoint term {term!r} is not name=[count*]action[(arg)], "
                "e.g. sink.after_write=1*crash"
            )
        try:
            action = Action(match["action"])
        except ValueError:
            known = ", ".join(a.value for a in Action)
            raise FailpointConfigError(
                f"failpoint {name}: unknown action {match['action']!r}; known: {known}"
            ) from None
        if name in points:
            raise FailpointConfigError(f"failpoint {name} is configured twice")
        count = int(match["count"]) if match["count"] else None
        points[name] = Failpoint(name, action, match["arg"] or "", count)
    return points


# The parsed variable (None until the first hit): an explicit, rebuildable cache.
_points: dict[str, Failpoint] | None = None
_fired: dict[str, int] = {}


def _load() -> dict[str, Failpoint]:
    global _points
    _points = parse(os.environ.get(ENV, ""))
    _fired.clear()
    return _points


def reload() -> None:
    """Read the variable again (a test that changed it in this process)."""
    _load()


def hit(name: str) -> None:
    """The failpoint ``name``: nothing unless the variable configures it."""
    point = (_points if _points is not None else _load()).get(name)
    if point is not None:
        _fire(point)


def _fire(point: Failpoint) -> None:
    if point.action is Action.OFF or not _take(point):
        return
    if point.action is Action.ERROR:
        raise FailpointError(point.arg or f"failpoint {point.name} fired")
    if point.action is Action.DELAY:
        time.sleep(float(point.arg))
        return
    sys.stderr.write(f"failpoint {point.name}: crash (exit {CRASH_EXIT_CODE})\n")
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)


def _take(point: Failpoint) -> bool:
    """Whether this hit fires (and counts it, across processes if a state dir is set)."""
    if point.count is None:
        return True
    state = os.environ.get(STATE_ENV)
    if not state:
        fired = _fired.get(point.name, 0)
        _fired[point.name] = fired + 1
        return fired < point.count
    Path(state).mkdir(parents=True, exist_ok=True)
    for n in range(1, point.count + 1):
        try:
            os.close(os.open(Path(state) / f"{point.name}.{n}", os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            continue
    return False


@contextmanager
def configured(text: str) -> Iterator[None]:
    """Set the variable to ``text`` in this process for a ``with`` block (tests)."""
    before = os.environ.get(ENV)
    os.environ[ENV] = text
    try:
        reload()
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
        reload()


__all__ = [
    "CRASH_EXIT_CODE",
    "ENV",
    "POINTS",
    "STATE_ENV",
    "Action",
    "Failpoint",
    "FailpointConfigError",
    "FailpointError",
    "configured",
    "hit",
    "parse",
    "reload",
]

"""Supervision: parts that die are restarted with capped exponential backoff; none stops the rest.

A :class:`Part` says how to launch one process (or thread) and when it is ready; its
:class:`Handle` says whether it still runs, how it ended, and how to signal it. The
:class:`Supervisor` starts the parts (or adopts ones still running from an earlier
supervisor), then :meth:`Supervisor.step` polls them: a part that ended is logged with
its exit code and restart count, and launched again after :class:`Backoff` says so. A
part that stayed up ``Backoff.stable_s`` starts its count of failures in a row afresh.
Shutdown signals every part at once and waits for all together (SIGKILL after a grace).

Parts keep their ports across restarts (the caller launches them on kept ports), so a
restarted part is found where it was and strands no other.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from cdc_dagster.services.procs import (
    Service,
    ServiceError,
    Stoppable,
    Target,
    group_members,
    start_ticks,
    stop_all,
)

Say = Callable[[str], None]

# What a failed relaunch may raise: it is logged and retried after the next backoff.
LAUNCH_ERRORS = (OSError, RuntimeError, subprocess.SubprocessError)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Restart delay after the n-th failure in a row: ``initial_s * factor**(n-1)``, capped."""

    initial_s: float = 1.0
    factor: float = 2.0
    max_s: float = 30.0
    stable_s: float = 60.0  # up this long: the next failure counts as the first again

    def __post_init__(self) -> None:
        if not (0 < self.initial_s <= self.max_s and self.factor >= 1 and self.stable_s > 0):
            raise ValueError(f"bad backoff {self}: need 0 < initial <= max, factor >= 1")

    def delay(self, failures: int) -> float:
        """Seconds to wait before restarting after ``failures`` failures in a row (>= 1)."""
        return min(self.max_s, self.initial_s * self.factor ** max(0, failures - 1))


class Handle(Protocol):
    """One launched (or adopted) part."""

    pid: int

    def exit_note(self) -> str | None:
        """None while the part runs; else how it ended (``exit code 1``, ``killed by SIGKILL``)."""
        ...

    def target(self) -> Stoppable:
        """What to signal to stop it all (its process group, or the process)."""
        ...

    def close(self) -> None:
        """Release what is left of it once it ended (reap the process, close files)."""
        ...


def describe_exit(code: int) -> str:
    """``exit code 0`` / ``exit code 137 (128+SIGKILL)`` / ``killed by SIGKILL (exit code -9)``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name} (exit code {code})"
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"exit code {code} (128+{signal.Signals(code - 128).name})"
    return f"exit code {code}"


@dataclass(slots=True)
class Part:
    """How to run one part of the stack."""

    name: str
    launch: Callable[[], Handle]
    ready: Callable[[Handle], bool] = lambda handle: True
    address: str = ""
    log: str = ""
    start_timeout_s: float = 180.0
    # Called with the dead handle before a relaunch (e.g. kill what is left of its group).
    before_restart: Callable[[Handle], None] | None = None
    # Called each time the part becomes ready (first start and every restart; not when
    # adopted running): work that needs it up, started without blocking the supervisor.
    on_ready: Callable[[Handle], None] | None = None


class PartState(Enum):
    """Where a part is, as the supervisor sees it."""

    STARTING = "starting"  # launched, not ready yet
    RUNNING = "running"  # ready
    BACKOFF = "restarting"  # ended; relaunched at ``due``
    STOPPED = "stopped"  # the supervisor stopped it


@dataclass(slots=True)
class Slot:
    """The supervisor's record of one part."""

    part: Part
    handle: Handle | None = None
    state: PartState = PartState.STOPPED
    restarts: int = 0  # relaunches after a failure, in all
    failures: int = 0  # failures in a row (reset after a stable run)
    since: float = 0.0  # when it was (re)launched
    due: float = 0.0  # BACKOFF: when to relaunch
    adopted: bool = False


@dataclass
class Supervisor:
    """Keeps its parts running (see the module docstring)."""

    say: Say
    backoff: Backoff = field(default_factory=Backoff)
    on_change: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.monotonic
    slots: dict[str, Slot] = field(default_factory=dict)
    stopping: threading.Event = field(default_factory=threading.Event)  # set: step no more
    leftovers: list[Service] = field(default_factory=list)  # processes of dead parts' groups

    def add(self, part: Part) -> None:
        """Supervise ``part`` too (launched by the next :meth:`start`, unless adopted)."""
        if part.name in self.slots:
            raise ValueError(f"part {part.name!r} is supervised already")
        self.slots[part.name] = Slot(part)

    # ------------------------------------------------------------------ start
    def adopt(self, name: str, handle: Handle) -> None:
        """Take over a part that still runs (started by an earlier supervisor)."""
        slot = self.slots[name]
        slot.handle, slot.state, slot.since, slot.adopted = (
            handle,
            PartState.RUNNING,
            self.clock(),
            True,
        )

    def start(self, stop: threading.Event) -> None:
        """Launch every part not adopted and wait until all are ready.

        Raises ServiceError if one ends or is not ready in its time (a first start that
        fails is a configuration problem to report, not to retry for ever); returns early,
        with parts still starting, if ``stop`` is set.
        """
        for slot in self.slots.values():
            if slot.handle is None:
                self._launch(slot)
        while not stop.is_set():
            waiting = [s for s in self.slots.values() if s.state is PartState.STARTING]
            if not waiting:
                return
            for slot in waiting:
                self._check_first_start(slot)
            stop.wait(0.2)

    def _check_first_start(self, slot: Slot) -> None:
        assert slot.handle is not None
        ended = slot.handle.exit_note()
        if ended is not None:
            raise ServiceError(
                f"{slot.part.name} ended before it was ready ({ended}); see {slot.part.log}"
            )
        if slot.part.ready(slot.handle):
            self._ready(slot)
        elif self.clock() - slot.since > slot.part.start_timeout_s:
            raise ServiceError(
                f"{slot.part.name} was not ready within {slot.part.start_timeout_s:.0f}s; "
                f"see {slot.part.log}"
            )

    def _launch(self, slot: Slot) -> None:
        slot.handle = slot.part.launch()
        slot.state, slot.since, slot.adopted = PartState.STARTING, self.clock(), False
        self.on_change()

    def _ready(self, slot: Slot) -> None:
        slot.state = PartState.RUNNING
        if slot.part.on_ready is not None and not slot.adopted:
            slot.part.on_ready(slot.handle)  # type: ignore[arg-type]
        if slot.restarts:
            where = f" at {slot.part.address}" if slot.part.address else ""
            self.say(
                f"{slot.part.name} is back{where} (pid {slot.handle.pid}, restart {slot.restarts})"
            )  # type: ignore[union-attr]
        self.on_change()

    # ------------------------------------------------------------------ supervise
    def step(self) -> None:
        """Poll every part once: note deaths, relaunch those due, mark the ready ones."""
        now = self.clock()
        for slot in self.slots.values():
            if self.stopping.is_set():
                return  # a part ending now is being stopped, not failing
            if slot.state in (PartState.STARTING, PartState.RUNNING):
                self._poll(slot, now)
            elif slot.state is PartState.BACKOFF and now >= slot.due:
                self._relaunch(slot)

    def _poll(self, slot: Slot, now: float) -> None:
        assert slot.handle is not None
        ended = slot.handle.exit_note()
        if ended is not None:
            self._died(slot, now, ended)
        elif slot.state is PartState.STARTING:
            if slot.part.ready(slot.handle):
                self._ready(slot)
            elif now - slot.since > slot.part.start_timeout_s:
                self.say(
                    f"{slot.part.name} (pid {slot.handle.pid}) was not ready within "
                    f"{slot.part.start_timeout_s:.0f}s; killing it (see {slot.part.log})"
                )
                slot.handle.target().send(signal.SIGKILL)

    def _died(self, slot: Slot, now: float, ended: str) -> None:
        assert slot.handle is not None
        up_s = now - slot.since
        if slot.state is PartState.RUNNING and up_s >= self.backoff.stable_s:
            slot.failures = 0
        slot.failures += 1
        slot.restarts += 1
        delay = self.backoff.delay(slot.failures)
        slot.state, slot.due = PartState.BACKOFF, now + delay
        self.say(
            f"{slot.part.name} (pid {slot.handle.pid}) ended: {ended}, after {up_s:.0f}s; "
            f"restart {slot.restarts} in {delay:.0f}s ({slot.failures} in a row)"
        )
        self.on_change()

    def _relaunch(self, slot: Slot) -> None:
        assert slot.handle is not None
        old = slot.handle
        if slot.part.before_restart is not None:
            slot.part.before_restart(old)
        self._keep_leftovers(slot.part.name, old)
        old.close()
        try:
            self._launch(slot)
        except LAUNCH_ERRORS as exc:
            slot.failures += 1
            delay = self.backoff.delay(slot.failures)
            slot.state, slot.due = PartState.BACKOFF, self.clock() + delay
            self.say(
                f"{slot.part.name}: restart {slot.restarts} failed ({exc}); again in {delay:.0f}s"
            )
            self.on_change()
            return
        self.say(f"{slot.part.name}: restart {slot.restarts} launched (pid {slot.handle.pid})")  # type: ignore[union-attr]

    def _keep_leftovers(self, name: str, old: Handle) -> None:
        """What still runs of a dead part's group (a killed code server's run workers go on
        and finish): noted, so that shutdown (and ``server stop``) stops them too."""
        target = old.target()
        pgid = getattr(target, "pgid", 0)
        if not pgid:
            return
        known = {s.pid for s in self.leftovers}
        for pid in group_members(pgid):
            if pid not in known:
                self.leftovers.append(Service(f"{name} (left over)", pid, started=start_ticks(pid)))

    def run(self, stop: threading.Event, interval_s: float = 0.5) -> None:
        """Step every ``interval_s`` until ``stop`` is set."""
        self.stopping = stop
        while not stop.wait(interval_s):
            self.step()

    # ------------------------------------------------------------------ stop
    def shutdown(self, grace_s: float = 2.0) -> None:
        """Stop every part at once (SIGTERM, SIGKILL after ``grace_s``) and release them."""
        self.stopping.set()
        named = [(n, s.handle.target()) for n, s in self.slots.items() if s.handle is not None]
        named += [(s.name, Target(s.pid)) for s in self.leftovers if s.alive()]
        killed = stop_all([t for _, t in named], grace_s=grace_s)
        if killed:
            names = ", ".join(n for n, t in named if any(t is k for k in killed))
            self.say(f"SIGKILLed after {grace_s:.1f}s: {names}")
        self.leftovers.clear()
        for slot in self.slots.values():
            if slot.handle is not None:
                slot.handle.close()
            slot.state = PartState.STOPPED
        self.on_change()


# ---------------------------------------------------------------------------- handles
@dataclass
class ProcessHandle:
    """A part this supervisor launched: a child leading its own process group."""

    proc: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        """The child's pid (= its process group)."""
        return self.proc.pid

    def exit_note(self) -> str | None:
        """How the child ended (None while it runs)."""
        code = self.proc.poll()
        return None if code is None else describe_exit(code)

    def target(self) -> Target:
        """Its whole process group."""
        return Target(self.proc.pid, self.proc.pid)

    def close(self) -> None:
        """Reap it."""
        self.proc.poll()


@dataclass
class AdoptedHandle:
    """A part an earlier supervisor launched, still running: not our child (no exit code)."""

    service: Service

    @property
    def pid(self) -> int:
        """Its pid."""
        return self.service.pid

    def exit_note(self) -> str | None:
        """None while it runs; its exit code is its parent's, not ours."""
        if self.service.alive():
            return None
        return "gone (exit code unknown: an earlier supervisor started it)"

    def target(self) -> Target:
        """Its process group, as recorded."""
        return Target(self.service.pid, self.service.pgid)

    def close(self) -> None:
        """Nothing to release."""

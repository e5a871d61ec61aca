"""How an etcd server process is started and probed: free ports, flags, health, log tail.

Shared by the private etcd (:mod:`cdc_dagster.metastore.private_etcd`) and the test
servers of :mod:`cdc_dagster.testing.etcd`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from cdc_dagster.metastore.etcd_binary import EtcdBinary

_log = logging.getLogger(__name__)

__all__ = ["EtcdTuning", "etcd_args", "free_ports", "is_healthy", "log_tail"]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on right now."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def is_healthy(client_url: str, timeout_s: float = 1.0) -> bool:
    """True if the etcd at ``client_url`` answers ``/health`` with health true."""
    try:
        with urllib.request.urlopen(f"{client_url}/health", timeout=timeout_s) as resp:
            return json.loads(resp.read()).get("health") == "true"
    except (OSError, ValueError, urllib.error.URLError):
        return False


@dataclass(frozen=True, slots=True)
class EtcdTuning:
    """Server flags; ``for_tests()`` makes leases expire quickly and skips fsync (etcd >= 3.5)."""

    heartbeat_ms: int = 100
    election_timeout_ms: int = 1000
    unsafe_no_fsync: bool = False
    max_request_bytes: int = 10 * 1024 * 1024

    @staticmethod
    def for_tests() -> EtcdTuning:
        """Short election timeout (so 1 s lease TTLs are allowed) and no fsync."""
        return EtcdTuning(heartbeat_ms=50, election_timeout_ms=500, unsafe_no_fsync=True)


def etcd_args(
    binary: EtcdBinary,
    data_dir: Path,
    client_port: int,
    peer_port: int,
    tuning: EtcdTuning,
    name: str = "cdc-dagster",
) -> list[str]:
    """The command line of one loopback member."""
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    args = [
        str(binary.path),
        f"--name={name}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={name}={peer}",
        "--initial-cluster-state=new",
        f"--heartbeat-interval={tuning.heartbeat_ms}",
        f"--election-timeout={tuning.election_timeout_ms}",
        f"--max-request-bytes={tuning.max_request_bytes}",
        "--auto-compaction-mode=revision",
        "--auto-compaction-retention=10000",
        "--logger=zap",
        "--log-level=warn",
    ]
    if tuning.unsafe_no_fsync and binary.supports_unsafe_no_fsync():
        args.append("--unsafe-no-fsync")
    return args


def log_tail(path: Path, lines: int = 10) -> str:
    """The last lines of a log file, or ``(no log)``."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"

"""An etcd member owned by this process, for tests: one member on free loopback ports.

It stops when this process exits, whichever thread started it (a watchdog process reads a
pipe only this process holds, and stops the server when the pipe closes). The private etcd
that several processes share is :mod:`cdc_dagster.metastore.private_etcd`.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Self

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

__all__ = ["EmbeddedEtcd", "EtcdTuning"]


class EmbeddedEtcd:
    """One etcd member on free loopback ports, its data and log under ``base_dir``.

    Owned by this process: it stops on :meth:`stop` or when this process exits (from any
    thread). ``restart`` keeps the ports, so connected clients reconnect by themselves.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        binary: str | os.PathLike[str] | None = None,
        tuning: EtcdTuning | None = None,
        name: str = "cdc-dagster",
        tls: tuple[Path, Path] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.base_dir = Path(base_dir)
        self.tls = tls  # (certificate, key) PEM files: serve clients over https
        self.extra_args = extra_args  # more server flags (e.g. --auth-token-ttl=1 in tests)
        self.binary = choose_etcd_binary(binary)
        self.tuning = tuning or EtcdTuning()
        self.name = name
        self.client_port = 0
        self.peer_port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def client_url(self) -> str:
        """``http://127.0.0.1:PORT`` (``https://`` with TLS)."""
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

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

    def start(self, timeout_s: float = 30.0) -> Self:
        """Start the server (on the same ports as before if it ran already) and wait until healthy."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if not self.client_port:
            self.client_port, self.peer_port = free_ports(2)
        args = etcd_args(
            self.binary,
            self.base_dir / "data",
            self.client_port,
            self.peer_port,
            self.tuning,
            self.name,
        )
        if self.tls is not None:
            https = f"https://127.0.0.1:{self.client_port}"
            args = [a for a in args if "client-urls" not in a]
            args += [
                f"--listen-client-urls={https}",
                f"--advertise-client-urls={https}",
                f"--cert-file={self.tls[0]}",
                f"--key-file={self.tls[1]}",
            ]
        args += list(self.extra_args)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the server
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # Stops the server when this process's end of the pipe closes (process exit).
        self._watchdog = subprocess.Popen(
            ["/bin/sh", "-c", f"read _; kill -TERM {self._proc.pid} 2>/dev/null"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait_healthy(timeout_s)
        _log.info("etcd %s running at %s", self._proc.pid, self.client_url)
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop()
                raise EtcdStartError(
                    f"etcd ({self.binary.path}) exited with code {code} before it was "
                    f"healthy; last log lines:\n{log_tail(self.log_path)}\n"
                    f"check {self.log_path} (another etcd on {self.base_dir / 'data'}?)"
                )
            if self._healthy():
                return
            time.sleep(0.05)
        self.stop()
        raise EtcdStartError(
            f"etcd at {self.client_url} was not healthy within {timeout_s:.0f}s; "
            f"last log lines:\n{log_tail(self.log_path)}"
        )

    def _healthy(self) -> bool:
        if self.tls is None:
            return is_healthy(self.client_url, timeout_s=0.5)
        context = ssl.create_default_context(cafile=str(self.tls[0]))
        try:
            with urllib.request.urlopen(
                f"{self.client_url}/health", timeout=0.5, context=context
            ) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server cleanly (SIGTERM, then SIGKILL after ``timeout_s``)."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()
            if watchdog.stdin is not None:
                watchdog.stdin.close()
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _log.warning("etcd %s ignored SIGTERM for %.0fs; killing it", proc.pid, timeout_s)
                proc.kill()
                proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def restart(self, timeout_s: float = 30.0) -> None:
        """Stop and start again on the same ports and data (clients reconnect by themselves)."""
        self.stop()
        self.start(timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

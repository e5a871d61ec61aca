"""Private MariaDB and PostgreSQL servers in a temp dir on a free loopback port.

Used by the tests and the benchmark; never touches 3306/5432 or a system service.
Binaries: ``$CDC_MARIADBD`` / ``mariadbd`` on PATH / ``/usr/sbin/mariadbd`` (plus
``mariadb-install-db`` beside it on PATH), and ``$CDC_PG_BIN`` / the newest
``/usr/lib/postgresql/<v>/bin`` for PostgreSQL (Debian's ``mariadb-server`` and
``postgresql`` packages). PostgreSQL refuses root, so as root it runs as the
``postgres`` system user via ``runuser``.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class EmbeddedServerError(RuntimeError):
    """A private server could not be found, initialised or started (message says which)."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (never 3306 or 5432)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in (3306, 5432):
            return port


def _wait_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmbeddedServerError(f"{what} exited with {proc.returncode}: {_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise EmbeddedServerError(f"{what} did not listen on port {port} in {timeout}s: {_tail(log)}")


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-2000:]
    except OSError:
        return "(no log)"


def find_mariadbd() -> str:
    """The mariadbd binary ($CDC_MARIADBD, PATH, /usr/sbin)."""
    for cand in (os.environ.get("CDC_MARIADBD"), shutil.which("mariadbd"), "/usr/sbin/mariadbd"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise EmbeddedServerError(
        "mariadbd not found: install Debian's mariadb-server (apt-get install mariadb-server) "
        "or set CDC_MARIADBD"
    )


class _PrivateServer:
    """What a private test server's process has in common: stop (``_ask_to_stop``, then
    a kill past 30 s), restart, clean up its socket dir."""

    proc: subprocess.Popen | None
    _sockdir: Path

    def start(self) -> None:
        raise NotImplementedError

    def _ask_to_stop(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._ask_to_stop()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._sockdir, ignore_errors=True)


class PrivateMariaDB(_PrivateServer):
    """A MariaDB with a row binlog (FULL image and metadata) in ``base_dir``."""

    def __init__(self, base_dir: str | Path, server_id: int = 1, port: int | None = None) -> None:
        self.base = Path(base_dir)
        self.datadir = self.base / "data"
        self.server_id = server_id
        self.port = port or free_port()
        # Unix socket paths are limited to ~107 bytes: keep it in a short dir.
        self._sockdir = Path(tempfile.mkdtemp(prefix="my", dir="/tmp"))
        self.socket = str(self._sockdir / "s")
        self.proc: subprocess.Popen | None = None
        self.log = self.base / "mariadbd.log"

    def init(self) -> None:
        mariadbd = find_mariadbd()
        install = shutil.which("mariadb-install-db") or str(
            Path(mariadbd).parent.parent / "bin" / "mariadb-install-db"
        )
        self.base.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(
            [install, "--no-defaults", f"--datadir={self.datadir}", "--user=root",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if res.returncode != 0:
            raise EmbeddedServerError(f"mariadb-install-db failed: {res.stderr[-2000:]}")

    def start(self) -> None:
        if not (self.datadir / "mysql").exists():
            self.init()
        args = [
            find_mariadbd(), "--no-defaults", f"--datadir={self.datadir}", "--user=root",
            f"--port={self.port}", "--bind-address=127.0.0.1", f"--socket={self.socket}",
            f"--pid-file={self.base / 'mariadbd.pid'}", f"--log-error={self.log}",
            f"--log-bin={self.datadir / 'binlog'}", f"--server-id={self.server_id}",
            "--binlog-format=ROW", "--binlog-row-image=FULL", "--binlog-row-metadata=FULL",
            "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=48M", "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci", "--max-connections=200",
            "--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0",
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.proc, "mariadbd", self.log, 60)
        self._bootstrap_users()

    def _bootstrap_users(self) -> None:
        import pymysql

        conn = pymysql.connect(unix_socket=self.socket, user="root", autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'")
                cur.execute("GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
        finally:
            conn.close()

    def uri(self, user: str = "root", password: str = "", query: str = "") -> str:
        cred = f"{user}:{password}@" if password else f"{user}@"
        return f"mysql://{cred}127.0.0.1:{self.port}/{('?' + query) if query else ''}"

    def connect(self, **kw):
        import pymysql

        kw.setdefault("autocommit", True)
        return pymysql.connect(host="127.0.0.1", port=self.port, user="root", **kw)

    def _ask_to_stop(self) -> None:
        assert self.proc is not None
        self.proc.terminate()


def find_pg_bin() -> Path:
    """PostgreSQL's bin dir ($CDC_PG_BIN or the newest /usr/lib/postgresql/<v>/bin)."""
    env = os.environ.get("CDC_PG_BIN")
    if env and (Path(env) / "initdb").exists():
        return Path(env)
    cands = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if cands:
        return Path(cands[-1]).parent
    which = shutil.which("initdb")
    if which:
        return Path(which).parent
    raise EmbeddedServerError(
        "PostgreSQL's initdb not found: install Debian's postgresql (apt-get install "
        "postgresql) or set CDC_PG_BIN to its bin dir"
    )


class PrivatePostgres(_PrivateServer):
    """A PostgreSQL in ``base_dir`` (run as the ``postgres`` user when we are root)."""

    def __init__(self, base_dir: str | Path, port: int | None = None) -> None:
        self.base = Path(base_dir)
        self.port = port or free_port()
        self._sockdir = Path(tempfile.mkdtemp(prefix="pg", dir="/tmp"))
        # The data beside the socket, in a directory of its own under /tmp, not under
        # ``base_dir``: the server runs as ``postgres`` and must reach it, and a test
        # session that starts later makes its /tmp/pytest-of-<user> private again (mode
        # 0700), which took a running server's data away from it (a PANIC mid-test).
        self.datadir = self._sockdir / "pgdata"
        self.log = self.base / "postgres.log"
        self.bin = find_pg_bin()
        self.proc: subprocess.Popen | None = None
        self._mode = "fast"

    def _as_pg(self, args: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            shutil.chown(path, "postgres", "postgres")

    def init(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self._chown(self._sockdir)  # mkdtemp's 0700: the postgres user's own
        cmd = [str(self.bin / "initdb"), "-D", str(self.datadir), "-U", "postgres",
               "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"]  # fmt: skip
        res = subprocess.run(self._as_pg(cmd), capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise EmbeddedServerError(f"initdb failed: {res.stderr[-2000:]}")

    def start(self) -> None:
        if not (self.datadir / "PG_VERSION").exists():
            self.init()
        self._chown(self._sockdir)
        log = open(self.log, "ab")  # noqa: SIM115 - owned by the child
        self._chown(self.log)
        cmd = [str(self.bin / "postgres"), "-D", str(self.datadir), "-p", str(self.port),
               "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self._sockdir}",
               "-c", "fsync=off", "-c", "max_connections=100",
               "-c", "shared_buffers=64MB"]  # fmt: skip
        # fsync off (no OS crash here; a commit's WAL still reaches the OS before it is
        # acknowledged), synchronous_commit on: with it off an immediate stop loses commits
        # already acknowledged, which the fault matrix's PostgreSQL restart then reports as
        # a gap at the sink (SinkGapError) - a lost commit, not the replicator's
        self.proc = subprocess.Popen(self._as_pg(cmd), stdout=log, stderr=log)
        log.close()
        _wait_port(self.port, self.proc, "postgres", self.log, 60)
        deadline = time.monotonic() + 30
        while True:
            try:
                import psycopg

                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def uri(self, dbname: str = "postgres", user: str = "postgres", password: str = "") -> str:
        cred = f"{user}:{password}@" if password else f"{user}@"
        return f"postgresql://{cred}127.0.0.1:{self.port}/{dbname}"

    def stop(self, mode: str = "fast") -> None:
        """Stop it with ``pg_ctl stop -m mode`` (smart, fast, immediate)."""
        self._mode = mode
        super().stop()

    def _ask_to_stop(self) -> None:
        subprocess.run(
            self._as_pg([str(self.bin / "pg_ctl"), "-D", str(self.datadir), "-m", self._mode,
                         "-w", "stop"]),
            capture_output=True, check=False,
        )  # fmt: skip

"""MySQL/MariaDB connections and the start-up checks: ``check_upstream`` verifies the binlog
settings and privileges and says exactly what to change. URIs: :mod:`cdc_dagster.upstream.uri`.
"""

from __future__ import annotations

import re
import ssl
import threading
from dataclasses import dataclass
from typing import Any

import pymysql

from cdc_dagster.secrets import redact_uri
from cdc_dagster.upstream.uri import UpstreamConfig, UpstreamError

_TLS_LOCK = threading.Lock()
_PREFERRED_TLS: ssl.SSLContext | None = None


class Connection(pymysql.connections.Connection):
    """pymysql's connection, with one TLS context a process for connections given no TLS
    option: pymysql then prefers TLS (used where the server offers it) and made a default
    context for each connection, reading the system's CA bundle (~17 ms of CPU each: a fifth
    of a 100-table changefeed's create here, and every chunk reader's and planner's
    connection). The context pymysql makes is made once and shared (an ``SSLContext`` serves
    any number of connections); explicit TLS options get their own, as before."""

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if sslp:
            return super()._create_ssl_ctx(sslp)  # type: ignore[no-any-return]
        global _PREFERRED_TLS
        with _TLS_LOCK:
            if _PREFERRED_TLS is None:
                _PREFERRED_TLS = super()._create_ssl_ctx(sslp)
            return _PREFERRED_TLS


def connect(cfg: UpstreamConfig, **kw: Any) -> pymysql.connections.Connection:
    """A pymysql connection to the upstream (autocommit, utf8mb4); UpstreamError if refused."""
    args = cfg.connect_kwargs()
    try:
        return Connection(**args, autocommit=True, charset="utf8mb4", **kw)
    except pymysql.MySQLError as exc:
        msg = str(exc)
        if args["password"]:
            msg = msg.replace(args["password"], "***")
        raise UpstreamError(f"cannot connect to {redact_uri(cfg.uri)}: {msg}") from None


@dataclass(frozen=True, slots=True)
class ServerInfo:
    version: str
    is_mariadb: bool


def required_settings(version: str) -> dict[str, str]:
    """The global variables the puller needs, and their values, on this server version."""
    is_mariadb = "mariadb" in version.lower()
    mv = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    want = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL"}
    if (is_mariadb and mv >= (10, 5)) or (not is_mariadb and mv >= (8, 0)):
        want["binlog_row_metadata"] = "FULL"
    return want


def upstream_problems(version: str, settings: dict[str, str], grants: str) -> list[str]:
    """What is wrong with a server for the puller, each with what to change (pure)."""
    is_mariadb = "mariadb" in version.lower()
    mv = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    problems = []
    if not is_mariadb and mv < (8, 0):
        problems.append(
            f"MySQL {version} is too old: use MySQL 8.0 or later (binlog_row_metadata=FULL "
            "puts column names in the binlog)"
        )
    for var, value in required_settings(version).items():
        got = str(settings.get(var, "unset")).upper()
        got = {"1": "ON", "0": "OFF"}.get(got, got)
        if got != value:
            how = (
                "start the server with --log-bin (binary logging is off)"
                if var == "log_bin"
                else f"SET GLOBAL {var}={value} and put {var}={value} under [mysqld] "
                "in the server's config (sessions opened before keep the old value)"
            )
            problems.append(f"{var} is {got}, need {value}: {how}")
    grants = grants.upper()
    if "ALL PRIVILEGES ON *.*" not in grants:
        needs = ["REPLICATION SLAVE", "SELECT"]
        if not is_mariadb:  # the snapshot's brief FLUSH TABLES WITH READ LOCK
            needs.append("RELOAD")
        binlog = "BINLOG MONITOR" if is_mariadb and mv >= (10, 5) else "REPLICATION CLIENT"
        missing = [n for n in needs if n not in grants]
        if binlog not in grants and "REPLICATION CLIENT" not in grants and "SUPER" not in grants:
            missing.append(binlog)
        if missing:
            problems.append(
                f"the user lacks {', '.join(missing)}: GRANT {', '.join(missing)} ON *.* "
                "TO the puller's user"
            )
    return problems


def check_upstream(conn) -> ServerInfo:
    """Binlog settings and privileges the puller needs; raises UpstreamError naming each fix."""
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        version = cur.fetchone()[0]
        settings = {}
        for var in required_settings(version):
            cur.execute(f"SELECT @@GLOBAL.{var}")
            settings[var] = str(cur.fetchone()[0])
        cur.execute("SHOW GRANTS")
        grants = " ".join(r[0] for r in cur.fetchall())
    problems = upstream_problems(version, settings, grants)
    if problems:
        raise UpstreamError("upstream not ready for the binlog puller: " + "; ".join(problems))
    return ServerInfo(version, "mariadb" in version.lower())

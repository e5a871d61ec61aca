"""Upstream URIs (``mysql://user:${PW}@host:port/?server-id=4242``) and the start-up checks.

``${VAR}`` references are resolved from the environment of the process that connects; a
literal password is never printed (``redact``). ``check_upstream`` verifies the binlog
settings and privileges and says exactly what to change.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

import pymysql

from cdc_dagster.secrets import SecretReferenceError, redact_uri, resolve_uri


class UpstreamError(Exception):
    """The upstream URI, settings or privileges are wrong (the message says what to change)."""


redact = redact_uri


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """A parsed upstream URI (credentials still as written: resolve with ``connect_kwargs``)."""

    uri: str
    host: str
    port: int
    user: str
    password: str | None
    server_id: int
    force_replicate: bool = False
    changelog: str = ""  # where this changefeed's change log lives (set by changefeed create)

    @property
    def key(self) -> str:
        """``host:port/server-id``: one puller at a time per key (the run tag ``cdc/upstream``);
        two binlog clients with one server id on one server would disconnect each other."""
        return f"{self.host}:{self.port}/{self.server_id}"

    def __repr__(self) -> str:
        return f"UpstreamConfig({redact(self.uri)!r})"

    def connect_kwargs(self) -> dict[str, Any]:
        """pymysql arguments, ``${ENV}`` resolved now (from this process's environment)."""
        try:
            parts = urllib.parse.urlsplit(resolve_uri(self.uri, os.environ))
        except SecretReferenceError as exc:
            raise UpstreamError(f"{exc} (the upstream URI, where the puller runs)") from None
        un = urllib.parse.unquote
        return {
            "host": un(parts.hostname or ""),
            "port": self.port,
            "user": un(parts.username or ""),
            "password": un(parts.password) if parts.password is not None else "",
        }


def parse_uri(uri: str) -> UpstreamConfig:
    """Parse ``mysql://user[:password]@host[:port]/?server-id=N[&force-replicate=true]``
    ``[&changelog=/abs/path]``."""
    parts = urllib.parse.urlsplit(uri)
    shown = redact(uri)
    if parts.scheme not in ("mysql", "mariadb"):
        raise UpstreamError(f"upstream URI {shown!r}: scheme must be mysql:// or mariadb://")
    if not parts.hostname or not parts.username:
        raise UpstreamError(f"upstream URI {shown!r}: need user@host")
    try:
        port = parts.port or 3306
    except ValueError:
        raise UpstreamError(f"upstream URI {shown!r}: the port is not a number") from None
    q = dict(urllib.parse.parse_qsl(parts.query))
    unknown = set(q) - {"server-id", "force-replicate", "changelog"}
    if unknown:
        raise UpstreamError(f"upstream URI {shown!r}: unknown options {sorted(unknown)}")
    sid = q.get("server-id", "4242")
    if not sid.isdigit() or not 1 <= int(sid) < 2**32:
        raise UpstreamError(
            f"upstream URI {shown!r}: server-id must be an integer in 1..4294967295, unique "
            "among the upstream's replicas"
        )
    un = urllib.parse.unquote
    return UpstreamConfig(
        uri=uri,
        host=un(parts.hostname),
        port=port,
        user=un(parts.username),
        password=un(parts.password) if parts.password is not None else None,
        server_id=int(sid),
        force_replicate=q.get("force-replicate", "false").lower() in ("1", "true", "yes"),
        changelog=q.get("changelog", ""),
    )


def is_mysql_uri(uri: str) -> bool:
    """Whether ``uri`` names a MySQL/MariaDB upstream (``mysql://`` or ``mariadb://``)."""
    return urllib.parse.urlsplit(uri).scheme in ("mysql", "mariadb")


def with_changelog(uri: str, root: str) -> str:
    """``uri`` with its ``changelog=`` option set to the absolute path ``root``."""
    if not os.path.isabs(root):
        raise UpstreamError(f"change-log root {root!r} must be an absolute path")
    parts = urllib.parse.urlsplit(uri)
    q = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "changelog"]
    query = urllib.parse.urlencode([*q, ("changelog", root)], safe="/")
    return urllib.parse.urlunsplit(parts._replace(query=query))


def changelog_root(uri: str) -> str:
    """The change-log root a ``mysql://`` changefeed's puller writes and its captures read."""
    cfg = parse_uri(uri)
    if not cfg.changelog or not os.path.isabs(cfg.changelog):
        raise UpstreamError(
            f"upstream URI {redact(uri)!r} names no change log (changelog=/abs/path): create "
            "the changefeed with `cdc-dagster changefeed create`, which sets it"
        )
    return cfg.changelog


def connect(cfg: UpstreamConfig, **kw: Any) -> pymysql.connections.Connection:
    """A pymysql connection to the upstream (autocommit, utf8mb4); UpstreamError if refused."""
    args = cfg.connect_kwargs()
    try:
        return pymysql.connect(**args, autocommit=True, charset="utf8mb4", **kw)
    except pymysql.MySQLError as exc:
        msg = str(exc)
        if args["password"]:
            msg = msg.replace(args["password"], "***")
        raise UpstreamError(f"cannot connect to {redact(cfg.uri)}: {msg}") from None


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

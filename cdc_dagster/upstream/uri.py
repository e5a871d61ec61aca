"""Upstream URIs, the one place that knows them: ``changelog:///abs/path`` (a change log
another producer writes, such as the embedded generator) and
``mysql://user:${PW}@host:port/?server-id=4242`` (``mariadb://`` too; a binlog puller writes
the changefeed's change log at its ``changelog=`` option).

``${VAR}`` references are resolved from the environment of the process that connects; a
literal password is never printed.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from typing import Any

from cdc_dagster.secrets import SecretReferenceError, redact_uri, resolve_uri

MYSQL_SCHEMES = ("mysql", "mariadb")


class UpstreamError(ValueError):
    """The upstream URI, settings or privileges are wrong (the message says what to change)."""


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
        return f"UpstreamConfig({redact_uri(self.uri)!r})"

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
    shown = redact_uri(uri)
    if parts.scheme not in MYSQL_SCHEMES:
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
    return urllib.parse.urlsplit(uri).scheme in MYSQL_SCHEMES


def with_changelog(uri: str, root: str) -> str:
    """``uri`` with its ``changelog=`` option set to the absolute path ``root``."""
    if not os.path.isabs(root):
        raise UpstreamError(f"change-log root {root!r} must be an absolute path")
    parts = urllib.parse.urlsplit(uri)
    q = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "changelog"]
    query = urllib.parse.urlencode([*q, ("changelog", root)], safe="/")
    return urllib.parse.urlunsplit(parts._replace(query=query))


def changelog_path(uri: str) -> str:
    """The change log a changefeed's captures read: ``changelog:///abs/path`` (a producer such as
    the embedded generator writes it) -> ``/abs/path``; ``mysql://...&changelog=/abs/path`` ->
    the root its binlog puller writes."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme in MYSQL_SCHEMES:
        cfg = parse_uri(uri)
        if not cfg.changelog or not os.path.isabs(cfg.changelog):
            raise UpstreamError(
                f"upstream URI {redact_uri(uri)!r} names no change log (changelog=/abs/path): "
                "create the changefeed with `cdc-dagster changefeed create`, which sets it"
            )
        return cfg.changelog
    if parts.scheme != "changelog" or parts.netloc or not parts.path.startswith("/"):
        raise UpstreamError(
            f"upstream URI {redact_uri(uri)!r}: expected changelog:///absolute/path or "
            "mysql://user:${PW}@host:port/?server-id=N"
        )
    return urllib.parse.unquote(parts.path)


def changelog_uri(root: str | os.PathLike[str]) -> str:
    """The upstream URI of a change log another producer writes (inverse of changelog_path)."""
    return "changelog://" + urllib.parse.quote(os.fspath(root))

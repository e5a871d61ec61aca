"""Sink URIs, the one place that knows them: which schemes exist, what a valid one looks
like, where a Delta root is, and the sink a URI opens (so a Spark task or a fresh process
can rebuild its sink from the URI alone).

Schemes: ``delta:///abs/path`` (Delta Lake tables under a local root; ``?compression=``
zstd (the default), snappy, lz4 or uncompressed for the Parquet files it writes;
``?vacuum_retention_hours=`` how long replaced files are kept, or ``off``: ``delta_vacuum``;
``?syncpoint_retention_hours=`` how long syncpoints are kept, or ``off``:
``delta_syncpoint_file``) and
``postgresql://user:${PW}@host:port/db`` (``postgres://`` too). Test doubles register their
own scheme with :func:`register_sink_scheme` (``cdc_dagster.testing.fake_runtime``'s
``file:///abs/path``); production code never does.
"""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cdc_dagster.secrets import SecretReferenceError, redact_uri, references
from cdc_dagster.sinks.base import Sink, SinkError

MAX_SINK_URI_CHARS = 2048


class InvalidSinkUriError(SinkError, ValueError):
    """A sink URI that names no usable downstream (the message says what is wrong)."""


class UnknownSinkSchemeError(InvalidSinkUriError):
    """A sink URI whose scheme no sink implements."""


@dataclass(frozen=True, slots=True)
class SinkScheme:
    """One kind of downstream: how its URI is checked and how it is opened."""

    names: tuple[str, ...]  # URI schemes (lower case)
    example: str
    check: Callable[[str, urllib.parse.SplitResult], None]  # raises InvalidSinkUriError
    open: Callable[[str], Sink]
    probe: Callable[[str], None] | None = None  # reach it before a changefeed uses it


class SinkUnreachableError(InvalidSinkUriError):
    """A sink URI that is well formed, but whose downstream cannot be used as it is."""


def _check_path(uri: str, parts: urllib.parse.SplitResult) -> None:
    scheme = parts.scheme.lower()
    if parts.netloc or not parts.path.startswith("/") or not parts.path.strip("/"):
        raise InvalidSinkUriError(
            f"sink URI {redact_uri(uri)!r}: no directory given as an absolute path; expected "
            f"{scheme}:///absolute/path (three slashes), e.g. {scheme}:///data/lake"
        )


DELTA_COMPRESSIONS = ("zstd", "snappy", "lz4", "uncompressed")
DELTA_OPTIONS = ("compression", "vacuum_retention_hours", "syncpoint_retention_hours")
OFF = "off"


@dataclass(frozen=True, slots=True)
class DeltaOptions:
    """What a Delta URI's query asks for; None where it names nothing (the sink's default)."""

    compression: str | None = None  # ?compression=zstd|snappy|lz4|uncompressed
    vacuum_retention_hours: int | Literal["off"] | None = None  # ?vacuum_retention_hours=N|off
    syncpoint_retention_hours: int | Literal["off"] | None = None  # ?syncpoint_retention_hours=


def delta_options(uri: str) -> DeltaOptions:
    """The options of a Delta URI's query; ``InvalidSinkUriError`` for an unknown option,
    a repeated one or a bad value."""
    shown = redact_uri(uri)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(uri).query, keep_blank_values=True)
    unknown = sorted(set(query) - set(DELTA_OPTIONS))
    if unknown:
        raise InvalidSinkUriError(
            f"sink URI {shown!r}: unknown option(s) {unknown}; a Delta URI takes only "
            f"compression={'|'.join(DELTA_COMPRESSIONS)}, vacuum_retention_hours=N|off and "
            "syncpoint_retention_hours=N|off, e.g. delta:///data/lake?compression=snappy"
        )
    for name, values in query.items():
        if len(values) != 1:
            raise InvalidSinkUriError(f"sink URI {shown!r}: {name} given {len(values)} times")
    compression = query.get("compression", [None])[0]
    if compression is not None and compression.lower() not in DELTA_COMPRESSIONS:
        raise InvalidSinkUriError(
            f"sink URI {shown!r}: compression={compression!r} is not one of "
            f"{', '.join(DELTA_COMPRESSIONS)}"
        )
    return DeltaOptions(
        compression=compression.lower() if compression is not None else None,
        vacuum_retention_hours=_hours(query, "vacuum_retention_hours", shown),
        syncpoint_retention_hours=_hours(query, "syncpoint_retention_hours", shown),
    )


def _hours(query: dict[str, list[str]], name: str, shown: str) -> int | Literal["off"] | None:
    """A whole number of hours (0 or more), ``off``, or None when the URI does not say."""
    raw = query.get(name, [None])[0]
    if raw is None:
        return None
    if raw.lower() == OFF:
        return OFF
    if not (raw.isdigit() and len(raw) <= 6):
        raise InvalidSinkUriError(
            f"sink URI {shown!r}: {name}={raw!r} is not a whole number of hours (0 or more) "
            f"or off, e.g. {name}=24"
        )
    return int(raw)


def _check_delta(uri: str, parts: urllib.parse.SplitResult) -> None:
    _check_path(uri, parts)
    delta_options(uri)


def _check_postgres(uri: str, parts: urllib.parse.SplitResult) -> None:
    shown = redact_uri(uri)
    try:
        port = parts.port
    except ValueError as exc:
        raise InvalidSinkUriError(f"sink URI {shown!r} has a bad port: {exc}") from exc
    if not parts.hostname:
        raise InvalidSinkUriError(
            f"sink URI {shown!r} names no host; e.g. postgres://user@db-host:5432/warehouse"
        )
    if not parts.path.strip("/"):
        raise InvalidSinkUriError(
            f"sink URI {shown!r} names no database; add it as the path, e.g. "
            f"postgres://{parts.hostname}:{port or 5432}/warehouse"
        )


def _probe_delta(uri: str) -> None:
    """The root (or, if it does not exist yet, its nearest existing parent) is a directory
    this process may write in: a probe file is written there and removed. Nothing is left."""
    root = Path(delta_root(uri))
    existing = next((p for p in (root, *root.parents) if p.exists()), Path("/"))
    if not existing.is_dir():
        raise SinkUnreachableError(
            f"sink {uri}: {existing} is not a directory; the Delta root must be one (or be "
            "created inside one)"
        )
    probe = existing / f".cdc-dagster-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise SinkUnreachableError(
            f"sink {uri}: cannot write in {existing} ({exc.strerror}); give a Delta root this "
            "user may write, or fix the permissions"
        ) from None


def _open_delta(uri: str) -> Sink:
    from cdc_dagster.sinks.delta import DEFAULT_COMPRESSION, DeltaSink  # deltalake: lazily
    from cdc_dagster.sinks.delta_syncpoint_file import DEFAULT_SYNCPOINT_RETENTION_HOURS
    from cdc_dagster.sinks.delta_vacuum import DEFAULT_RETENTION_HOURS

    opts = delta_options(uri)
    return DeltaSink(
        delta_root(uri),
        compression=opts.compression or DEFAULT_COMPRESSION,
        vacuum_retention_hours=_or(opts.vacuum_retention_hours, DEFAULT_RETENTION_HOURS),
        syncpoint_retention_hours=_or(
            opts.syncpoint_retention_hours, DEFAULT_SYNCPOINT_RETENTION_HOURS
        ),
    )


def _or(hours: int | Literal["off"] | None, default: int) -> int | None:
    """The sink's setting of an hours option: None for off, the default when not given."""
    return None if hours == OFF else default if hours is None else int(hours)


def _open_postgres(uri: str) -> Sink:
    from cdc_dagster.sinks.postgres import PostgresSink  # psycopg: likewise

    return PostgresSink(uri)


def _probe_postgres(uri: str) -> None:
    from cdc_dagster.sinks.postgres import probe  # psycopg: likewise

    try:
        probe(uri)
    except SinkError as exc:
        raise SinkUnreachableError(str(exc)) from None


_SCHEMES: dict[str, SinkScheme] = {}


def register_sink_scheme(scheme: SinkScheme) -> None:
    """Make ``scheme`` known (test doubles; the production schemes are registered below)."""
    for name in scheme.names:
        _SCHEMES[name] = scheme


register_sink_scheme(
    SinkScheme(("delta",), "delta:///data/lake", _check_delta, _open_delta, _probe_delta)
)
register_sink_scheme(
    SinkScheme(
        ("postgresql", "postgres"),
        "postgresql://writer:${PG_PW}@db:5432/analytics",
        _check_postgres,
        _open_postgres,
        _probe_postgres,
    )
)


def scheme_of(uri: str) -> str:
    """The URI's scheme, lower case ("" for none)."""
    return urllib.parse.urlsplit(uri).scheme.lower() if ":" in uri else ""


def validate_sink_uri(uri: str) -> str:
    """Return ``uri`` if a sink implements its scheme and it names a target.

    A password may be a ``${ENV_VAR}`` reference (stored as written, resolved by the process
    that connects); messages show the URI redacted.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise InvalidSinkUriError(f"sink URI {redact_uri(uri)!r} is empty; e.g. delta:///data/lake")
    shown = redact_uri(uri)
    if len(uri) > MAX_SINK_URI_CHARS:
        raise InvalidSinkUriError(
            f"sink URI {shown[:60]!r}... has {len(uri)} characters; at most "
            f"{MAX_SINK_URI_CHARS} are allowed"
        )
    if any(c in uri for c in "\r\n\0"):
        raise InvalidSinkUriError(f"sink URI {shown!r} contains a line break or NUL")
    try:
        references(uri)
    except SecretReferenceError as exc:
        raise InvalidSinkUriError(str(exc)) from exc
    scheme = scheme_of(uri)
    kind = _SCHEMES.get(scheme)
    if kind is None:
        what = f"scheme {scheme!r}" if scheme else "no scheme"
        supported = ", ".join(s.example for s in dict.fromkeys(_SCHEMES.values()))
        raise UnknownSinkSchemeError(f"sink URI {shown!r} has {what}; supported: {supported}")
    kind.check(uri, urllib.parse.urlsplit(uri))
    return uri


def probe_sink(uri: str) -> str:
    """Check ``uri`` and reach its downstream (before a changefeed is created on it):
    InvalidSinkUriError / SinkUnreachableError with one line saying what is wrong."""
    validate_sink_uri(uri)
    probe = _SCHEMES[scheme_of(uri)].probe
    if probe is not None:
        probe(uri)
    return uri


def open_sink(uri: str) -> Sink:
    """The sink ``uri`` names (``InvalidSinkUriError`` if it names none)."""
    validate_sink_uri(uri)
    return _SCHEMES[scheme_of(uri)].open(uri)


def is_delta(uri: str) -> bool:
    """Whether the URI names a Delta Lake root."""
    return scheme_of(uri) == "delta"


def is_postgres(uri: str) -> bool:
    """Whether the URI names a PostgreSQL database."""
    return scheme_of(uri) in ("postgresql", "postgres")


def delta_root(uri_or_path: str) -> str:
    """``delta:///abs/root`` (percent-encoded or not), or ``/abs/root`` -> ``/abs/root``."""
    if not is_delta(uri_or_path):
        if uri_or_path.startswith("/"):
            return uri_or_path
        raise InvalidSinkUriError(
            f"{redact_uri(uri_or_path)!r} is not a Delta root: expected delta:///absolute/path"
        )
    parts = urllib.parse.urlsplit(uri_or_path)
    _check_path(uri_or_path, parts)
    return urllib.parse.unquote(parts.path)


def delta_uri(root: str) -> str:
    """The sink URI of a Delta root (inverse of :func:`delta_root`)."""
    return "delta://" + urllib.parse.quote(root)

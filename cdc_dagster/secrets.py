"""Secrets in URIs: ``${ENV_VAR}`` references, resolved only where a connection is made.

A sink URI is stored in etcd as written, e.g. ``postgres://etl:${PG_PASSWORD}@db/wh``; the
process that connects (a capture's sink) calls :func:`resolve_uri` with its own
environment. Anything that shows a URI (errors, ``repr``, logs, the CLI) shows
:func:`redact_uri` of it, which hides a literal password but keeps a reference visible
(it names no secret). :func:`redact_text` does the same for free text such as a corrupt
value's excerpt.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping

REDACTED = "***"
_REF = re.compile(r"\$\{([^}]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# user:password@ after a scheme, in any text (JSON excerpts, messages).
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s\"']*:)(?P<pw>[^\s\"'/?#]*)@")
_SECRET_PARAMS = re.compile(
    r"(?P<head>[?&](?:password|passwd|pwd|secret|token|access_key|secret_key|sas)=)"
    r"(?P<value>[^&#\s\"']*)",
    re.IGNORECASE,
)


class SecretReferenceError(ValueError):
    """A ``${...}`` reference is malformed, or names a variable the environment lacks."""


def references(uri: str) -> list[str]:
    """The environment variable names ``uri`` refers to; SecretReferenceError if malformed."""
    names = []
    for match in _REF.finditer(uri):
        if not _NAME.fullmatch(match[1]):
            raise SecretReferenceError(
                f"URI {redact_uri(uri)!r} has a malformed reference ${{{match[1]}}}: write "
                "${NAME} with NAME of letters, digits and '_' (e.g. ${PG_PASSWORD})"
            )
        names.append(match[1])
    if "${" in _REF.sub("", uri):
        raise SecretReferenceError(
            f"URI {redact_uri(uri)!r} has an unclosed '${{': write ${{NAME}} (e.g. ${{PG_PASSWORD}})"
        )
    return names


def _is_reference(text: str) -> bool:
    return _REF.fullmatch(text) is not None


def resolve_uri(uri: str, environ: Mapping[str, str]) -> str:
    """``uri`` with each ``${NAME}`` replaced by ``environ[NAME]`` (percent-encoded in userinfo).

    Raises SecretReferenceError naming the missing variables (never their values).
    """
    names = references(uri)
    missing = sorted({n for n in names if n not in environ})
    if missing:
        raise SecretReferenceError(
            f"URI {redact_uri(uri)!r} refers to {', '.join(missing)}, which this process's "
            "environment does not set: export it in the environment of the process that "
            "connects (with `cdc-dagster server start`, before starting it: its runs inherit it)"
        )
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return _REF.sub(lambda m: environ[m[1]], uri)
    netloc_end = len(rest)
    for stop in "/?#":
        index = rest.find(stop)
        if index != -1:
            netloc_end = min(netloc_end, index)
    netloc, tail = rest[:netloc_end], rest[netloc_end:]
    userinfo, at, hostport = netloc.rpartition("@")
    userinfo = _REF.sub(lambda m: urllib.parse.quote(environ[m[1]], safe=""), userinfo)
    hostport = _REF.sub(lambda m: environ[m[1]], hostport)
    tail = _REF.sub(lambda m: environ[m[1]], tail)
    return f"{scheme}://{userinfo}{at}{hostport}{tail}"


def redact_uri(uri: str) -> str:
    """``uri`` with a literal password (in userinfo or a secret query parameter) shown as ***.

    References such as ``${PG_PASSWORD}`` stay: they name a variable, not a secret.
    """
    if not isinstance(uri, str):
        return repr(uri)
    return redact_text(uri)


def redact_text(text: str) -> str:
    """Every ``scheme://user:password@`` and secret query parameter in ``text``, redacted."""

    def userinfo(match: re.Match[str]) -> str:
        pw = match["pw"]
        return match[0] if not pw or _is_reference(pw) else f"{match['head']}{REDACTED}@"

    def param(match: re.Match[str]) -> str:
        value = match["value"]
        return match[0] if not value or _is_reference(value) else match["head"] + REDACTED

    return _SECRET_PARAMS.sub(param, _USERINFO.sub(userinfo, text))


def redact_bytes(data: bytes) -> str:
    """A printable, redacted excerpt of raw bytes (for corrupt-value messages)."""
    return redact_text(repr(data))

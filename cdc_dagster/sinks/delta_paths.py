"""Path components for Delta tables: upstream identifiers made safe for delta-rs (reversibly).

delta-rs turns a local path into a ``file://`` URL and back: a ``%`` in a path is decoded
(``a%2Fb`` opens ``a/b``), ``[``/``{`` make it panic, and ``file_uris()`` percent-encodes
spaces and non-ASCII. So a database or table name becomes a path component over the
alphabet ``[A-Za-z0-9_.-]`` plus ``~``: every other UTF-8 byte (and ``~`` itself) is written
``~XX`` (two upper-case hex digits), as is a leading ``.`` or ``_`` (no hidden names, no
clash with ``_cdc_dagster`` or ``_delta_log``). ``decode_component`` reverses it exactly.
A component whose encoding exceeds 200 bytes keeps its first bytes and ends in
``~~<sha256[:16]>`` (not reversible from the path; the table's Delta metadata keeps the
real names).
"""

from __future__ import annotations

import hashlib
import os
import urllib.parse

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
MAX_COMPONENT_BYTES = 200
META_DIR = "_cdc_dagster"


def encode_component(name: str) -> str:
    """The path component for one identifier (see the module docstring)."""
    if not name:
        raise ValueError("an empty identifier has no path component")
    out: list[str] = []
    for i, byte in enumerate(name.encode("utf-8")):
        if byte in _SAFE and not (i == 0 and byte in b"._"):
            out.append(chr(byte))
        else:
            out.append(f"~{byte:02X}")
    encoded = "".join(out)
    if len(encoded) <= MAX_COMPONENT_BYTES:
        return encoded
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]
    head = encoded[: MAX_COMPONENT_BYTES - 18]
    cut = head.rfind("~", len(head) - 2)  # never split an escape
    if cut != -1:
        head = head[:cut]
    return f"{head}~~{digest}"


def decode_component(component: str) -> str:
    """The identifier of a path component made by ``encode_component`` (not a hashed one)."""
    if "~~" in component:
        raise ValueError(f"{component!r} is a hashed long name: read the table's metadata")
    raw = bytearray()
    i = 0
    while i < len(component):
        ch = component[i]
        if ch == "~":
            raw.append(int(component[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.append(ord(ch))
            i += 1
    return raw.decode("utf-8")


def table_location(database: str, table: str) -> str:
    """``<database>/<table>`` relative to the sink root, each part encoded."""
    return f"{encode_component(database)}/{encode_component(table)}"


def table_path(root: str, database: str, table: str) -> str:
    """The absolute directory of the Delta table for ``database.table``."""
    return os.path.join(root, encode_component(database), encode_component(table))


def local_path(uri: str) -> str:
    """A local path from a ``file_uris()`` entry (delta-rs percent-encodes some)."""
    if uri.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlparse(uri).path)
    if "%" in uri:
        return urllib.parse.unquote(uri)  # our paths never hold a literal '%'
    return uri

"""Owner messages <-> JSON-able dicts: how dispatches travel in a Dagster run's config.

``encode(msgs)`` gives a list of plain dicts (str keys, ints, bools, lists); ``decode``
inverts it exactly, and raises :class:`WireError` (naming the field) on anything it did
not write. Columns (heartbeat table ids, the columnar ``AddTableBatch``) stay lists of
ints, so a burst of 10k adds is four lists, not 10k objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scheduler_core.errors import InvalidMessageError
from scheduler_core.messages import (
    AddTableBatch,
    AddTableRequest,
    Barrier,
    Dispatch,
    DispatchTableRequest,
    Header,
    Heartbeat,
    OwnerMessage,
    RemoveTableRequest,
)
from scheduler_core.model import Checkpoint

WIRE_VERSION = 1


class WireError(ValueError):
    """A run-config value is not an owner message this build wrote (the message says where)."""


def encode_header(h: Header) -> dict[str, Any]:
    """A header as a dict."""
    return {
        "owner_rev": h.owner_rev,
        "capture_epoch": h.capture_epoch,
        "changefeed_epoch": h.changefeed_epoch,
        "seq": h.seq,
    }


def encode_barrier(b: Barrier) -> dict[str, Any]:
    """A barrier as a dict (table ids as str keys: JSON objects have str keys)."""
    return {
        "global_barrier_ts": b.global_barrier_ts,
        "table_barriers": {str(t): ts for t, ts in sorted(b.table_barriers.items())},
        **({"open_until_ts": b.open_until_ts} if b.open_until_ts else {}),
    }


def encode_dispatch(d: Dispatch) -> dict[str, Any]:
    if isinstance(d, AddTableRequest):
        return {
            "op": "add",
            "table_id": d.table_id,
            "is_secondary": d.is_secondary,
            "checkpoint_ts": d.checkpoint.checkpoint_ts,
            "resolved_ts": d.checkpoint.resolved_ts,
        }
    return {"op": "remove", "table_id": d.table_id}


def encode_message(msg: OwnerMessage) -> dict[str, Any]:
    """One owner message as a JSON-able dict."""
    base = {"v": WIRE_VERSION, "header": encode_header(msg.header), "sender": msg.sender}
    base["to"] = msg.to
    if isinstance(msg, Heartbeat):
        return {
            **base,
            "type": "heartbeat",
            "table_ids": msg.table_ids.tolist(),
            "is_stopping": msg.is_stopping,
            "barrier": encode_barrier(msg.barrier),
        }
    if isinstance(msg, DispatchTableRequest):
        adds = None
        if msg.adds is not None:
            a = msg.adds
            adds = {
                "table_ids": a.table_ids.tolist(),
                "is_secondary": a.is_secondary.tolist(),
                "checkpoint_ts": a.checkpoint_ts.tolist(),
                "resolved_ts": a.resolved_ts.tolist(),
            }
        return {
            **base,
            "type": "dispatch",
            "requests": [encode_dispatch(d) for d in msg.requests],
            "adds": adds,
        }
    raise WireError(f"not an owner message: {type(msg).__name__}")


def encode(msgs: Iterable[OwnerMessage]) -> list[dict[str, Any]]:
    """Owner messages as a list of JSON-able dicts (run config)."""
    return [encode_message(m) for m in msgs]


# ---------------------------------------------------------------------------- decode
def _field(obj: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, Mapping):
        raise WireError(f"{where}: expected an object, got {type(obj).__name__}")
    if name not in obj:
        raise WireError(f"{where}: missing field {name!r}")
    value = obj[name]
    if kind is int and (type(value) is not int):
        raise WireError(f"{where}.{name}: expected an int, got {value!r}")
    if kind is bool and type(value) is not bool:
        raise WireError(f"{where}.{name}: expected a bool, got {value!r}")
    if not isinstance(value, kind):
        raise WireError(f"{where}.{name}: expected {kind}, got {type(value).__name__}")
    return value


def _int_list(obj: Mapping[str, Any], name: str, where: str) -> list[int]:
    values = _field(obj, name, list, where)
    if any(type(v) is not int for v in values):
        raise WireError(f"{where}.{name}: expected a list of ints")
    return values


def decode_header(obj: Any, where: str = "header") -> Header:
    """Inverse of :func:`encode_header`."""
    return Header(
        _field(obj, "owner_rev", int, where),
        _field(obj, "capture_epoch", str, where),
        _field(obj, "changefeed_epoch", int, where),
        _field(obj, "seq", int, where),
    )


def decode_barrier(obj: Any, where: str = "barrier") -> Barrier:
    """Inverse of :func:`encode_barrier`."""
    table = _field(obj, "table_barriers", Mapping, where)
    try:
        barriers = {int(t): ts for t, ts in table.items()}
    except ValueError as exc:
        raise WireError(f"{where}.table_barriers: a key is not a table id: {exc}") from exc
    if any(type(ts) is not int for ts in barriers.values()):
        raise WireError(f"{where}.table_barriers: values must be int TSs")
    open_until = obj.get("open_until_ts", 0) if isinstance(obj, Mapping) else 0
    if type(open_until) is not int:
        raise WireError(f"{where}.open_until_ts: must be an int TS, got {open_until!r}")
    return Barrier(_field(obj, "global_barrier_ts", int, where), barriers, open_until)


def decode_dispatch(obj: Any, to: str, where: str) -> Dispatch:
    op = _field(obj, "op", str, where)
    table_id = _field(obj, "table_id", int, where)
    if op == "remove":
        return RemoveTableRequest(to, table_id)
    if op != "add":
        raise WireError(f"{where}.op: expected 'add' or 'remove', got {op!r}")
    checkpoint = Checkpoint(
        _field(obj, "checkpoint_ts", int, where), _field(obj, "resolved_ts", int, where)
    )
    return AddTableRequest(to, table_id, _field(obj, "is_secondary", bool, where), checkpoint)


def decode_message(obj: Any, where: str = "message") -> OwnerMessage:
    """Inverse of :func:`encode_message`; WireError on anything malformed."""
    try:
        return _decode_message(obj, where)
    except InvalidMessageError as exc:
        raise WireError(f"{where}: {exc}") from exc


def _decode_message(obj: Any, where: str) -> OwnerMessage:
    version = _field(obj, "v", int, where)
    if version != WIRE_VERSION:
        raise WireError(f"{where}: wire version {version}, this build reads {WIRE_VERSION}")
    kind = _field(obj, "type", str, where)
    header = decode_header(_field(obj, "header", Mapping, where), f"{where}.header")
    sender = _field(obj, "sender", str, where)
    to = _field(obj, "to", str, where)
    if kind == "heartbeat":
        return Heartbeat(
            header,
            sender,
            to,
            _int_list(obj, "table_ids", where),
            _field(obj, "is_stopping", bool, where),
            decode_barrier(_field(obj, "barrier", Mapping, where), f"{where}.barrier"),
        )
    if kind != "dispatch":
        raise WireError(f"{where}.type: expected 'heartbeat' or 'dispatch', got {kind!r}")
    reqs = _field(obj, "requests", list, where)
    requests = tuple(decode_dispatch(r, to, f"{where}.requests[{i}]") for i, r in enumerate(reqs))
    adds_obj = obj.get("adds")
    adds = None
    if adds_obj is not None:
        w = f"{where}.adds"
        adds = AddTableBatch(
            *(_int_list(adds_obj, n, w) for n in ("table_ids", "is_secondary")),
            *(_int_list(adds_obj, n, w) for n in ("checkpoint_ts", "resolved_ts")),
        )
    return DispatchTableRequest(header, sender, to, requests, adds)


def decode(obj: Any) -> list[OwnerMessage]:
    """A run config's message list back to owner messages (WireError if malformed)."""
    if not isinstance(obj, Sequence) or isinstance(obj, str | bytes):
        raise WireError(f"owner messages must be a list, got {type(obj).__name__}")
    return [decode_message(m, f"messages[{i}]") for i, m in enumerate(obj)]


__all__ = [
    "WireError",
    "decode",
    "decode_barrier",
    "decode_dispatch",
    "decode_header",
    "decode_message",
    "encode",
    "encode_barrier",
    "encode_dispatch",
    "encode_header",
    "encode_message",
]

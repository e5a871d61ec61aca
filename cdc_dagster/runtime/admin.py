"""Admin requests (move table, drain capture, rebalance) as etcd keys the owner applies.

The coordinator lives in the owner's process, and admin jobs run in others, so a request
is a key ``admin/<changefeed>/<id>``: ``request_*`` validate and write it (a bad request
raises :class:`AdminError` and writes nothing); the owner reads them each tick and applies
them to its Coordinator. A move is deleted once handed over; a drain stays until the
capture holds no table of the changefeed, so an owner switch mid-drain carries it on.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from cdc_dagster.metastore import Metastore, OwnerSession
from cdc_dagster.metastore.client import Delete
from scheduler_core.coordinator import Coordinator
from scheduler_core.errors import ConfigError

log = logging.getLogger(__name__)

Request = tuple[str, dict[str, Any]]  # (key, body)


class AdminError(ValueError):
    """An admin request that cannot be carried out; nothing was written."""


def _prefix(ms: Metastore) -> str:
    return f"{ms.layout.prefix}admin/"


def _submit(ms: Metastore, changefeed_id: str, body: dict[str, Any]) -> str:
    ms.changefeeds.get(changefeed_id)  # ChangefeedNotFoundError names the id
    key = f"{_prefix(ms)}{changefeed_id}/{uuid.uuid4().hex[:12]}"
    ms.client.put(key, json.dumps(body).encode())
    return key


def _alive(ms: Metastore) -> list[str]:
    return sorted(c.capture_id for c in ms.captures.list_alive())


def request_move_table(ms: Metastore, changefeed_id: str, table_id: int, capture_id: str) -> str:
    """Ask the owner to move ``table_id`` to ``capture_id``; returns the request key."""
    if capture_id not in _alive(ms):
        raise AdminError(f"cannot move table {table_id} to {capture_id!r}: not an alive capture")
    return _submit(ms, changefeed_id, {"op": "move_table", "table_id": table_id, "to": capture_id})


def request_drain_capture(ms: Metastore, changefeed_id: str, capture_id: str) -> str:
    """Ask the owner to move every table of the changefeed off ``capture_id``."""
    alive = _alive(ms)
    if capture_id not in alive:
        raise AdminError(f"cannot drain {capture_id!r}: not an alive capture {alive}")
    if len(alive) < 2:
        raise AdminError(f"cannot drain {capture_id!r}: it is the last capture; add one first")
    return _submit(ms, changefeed_id, {"op": "drain_capture", "capture_id": capture_id})


def request_rebalance(ms: Metastore, changefeed_id: str) -> str:
    """Ask the owner to rebalance the changefeed's tables once all replicate."""
    return _submit(ms, changefeed_id, {"op": "rebalance"})


def pending_requests(ms: Metastore) -> dict[str, list[Request]]:
    """Requests not yet applied (or drains not yet done), by changefeed."""
    out: dict[str, list[Request]] = {}
    prefix = _prefix(ms)
    for kv in ms.client.get_prefix(prefix).kvs:
        cf_id = kv.key[len(prefix) :].split("/", 1)[0]
        try:
            out.setdefault(cf_id, []).append((kv.key, json.loads(kv.value)))
        except ValueError:
            log.error("admin request %s is not JSON; deleting it", kv.key)
            ms.client.delete(kv.key)
    return out


def apply_requests(
    session: OwnerSession, coord: Coordinator, requests: Sequence[Request]
) -> list[str]:
    """Hand requests to the coordinator (after its tick); returns one line per refused one."""
    errors: list[str] = []
    done: list[str] = []
    for key, body in requests:
        op = body.get("op")
        try:
            if op == "move_table":
                coord.move_table(int(body["table_id"]), str(body["to"]))
                done.append(key)
            elif op == "rebalance":
                coord.request_rebalance()
                done.append(key)
            elif op == "drain_capture":
                if _drain(coord, str(body["capture_id"])):
                    done.append(key)
            else:
                raise ConfigError(f"unknown admin op {op!r}")
        except (ConfigError, KeyError, ValueError) as exc:
            errors.append(f"admin request {body}: {exc}")
            done.append(key)
    if done:
        session.txn([], [Delete(k) for k in done])
    return errors


def _drain(coord: Coordinator, capture_id: str) -> bool:
    """Start or follow a drain; True once the capture holds none of the changefeed's tables."""
    if capture_id not in coord.captures.captures:
        return True  # gone: nothing left to drain
    if coord.drain.target == capture_id:
        return False
    if coord.replications.table_counts([capture_id])[capture_id] == 0:
        return True
    if coord.drain.target is None:
        coord.drain_capture(capture_id)
    return False

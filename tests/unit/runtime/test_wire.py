"""Owner messages survive the trip through run config exactly; malformed input is a WireError."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cdc_dagster.runtime.wire import WireError, decode, encode
from scheduler_core.messages import (
    AddTableBatch,
    AddTableRequest,
    Barrier,
    DispatchTableRequest,
    Header,
    Heartbeat,
    RemoveTableRequest,
)
from scheduler_core.model import Checkpoint
from scheduler_core.ts import MAX_TS


def _msgs() -> list:
    h = Header(7, "abc.7", 3, seq=11)
    hb = Heartbeat(h, "owner", "cap-1", np.array([3, 1, 2]), True, Barrier(99, {1: 50, 2: 60}))
    adds = AddTableBatch([5, 6], [1, 0], [10, 20], [15, 25])
    reqs = (AddTableRequest("cap-1", 4, False, Checkpoint(1, 2)), RemoveTableRequest("cap-1", 9))
    return [hb, DispatchTableRequest(h, "owner", "cap-1", reqs, adds), Heartbeat(h, "o", "c", [])]


def _fields(m: object) -> dict:
    out = {}
    for name in type(m).__slots__:  # type: ignore[attr-defined]
        v = getattr(m, name)
        out[name] = v.tolist() if isinstance(v, np.ndarray) else v
    return out


def test_round_trip_is_exact_through_json() -> None:
    msgs = _msgs()
    back = decode(json.loads(json.dumps(encode(msgs))))
    assert [type(m) for m in back] == [type(m) for m in msgs]
    assert [_fields(m) for m in back] == [_fields(m) for m in msgs]


def test_default_barrier_keeps_max_ts() -> None:
    hb = Heartbeat(Header(1, "", 0), "o", "c", [])
    assert decode(encode([hb]))[0].barrier.global_barrier_ts == MAX_TS


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda d: d.pop("header"), "header"),
        (lambda d: d.__setitem__("type", "gossip"), "type"),
        (lambda d: d.__setitem__("v", 2), "wire version"),
        (lambda d: d["header"].__setitem__("owner_rev", "7"), "owner_rev"),
        (lambda d: d["header"].__setitem__("owner_rev", -1), "owner_rev"),
        (lambda d: d.__setitem__("table_ids", [1, "x"]), "table_ids"),
        (lambda d: d["barrier"]["table_barriers"].__setitem__("t", 5), "table_barriers"),
    ],
)
def test_malformed_heartbeat_is_a_wire_error(mutate, where) -> None:  # type: ignore[no-untyped-def]
    obj = encode(_msgs())[0]
    mutate(obj)
    with pytest.raises(WireError, match=where):
        decode([obj])


def test_malformed_dispatch_is_a_wire_error() -> None:
    obj = encode(_msgs())[1]
    obj["requests"][0]["op"] = "steal"
    with pytest.raises(WireError, match="op"):
        decode([obj])
    obj = encode(_msgs())[1]
    obj["adds"]["checkpoint_ts"] = [30, 20]  # above resolved
    with pytest.raises(WireError, match="AddTableBatch"):
        decode([obj])
    with pytest.raises(WireError, match="list"):
        decode({"not": "a list"})

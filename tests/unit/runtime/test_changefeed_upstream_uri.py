"""ChangefeedInfo.upstream_uri is additive: a record written before it existed reads as ""."""

from __future__ import annotations

import json

from cdc_dagster.metastore.changefeeds import ChangefeedInfo, _decode_record, encode_record
from cdc_dagster.metastore.client import KeyValue


def _kv(value: bytes) -> KeyValue:
    return KeyValue("/k", value, 1, 1, 1, 0)


def test_upstream_uri_round_trips_and_defaults_to_empty() -> None:
    info = ChangefeedInfo("cf", "delta:///lake", ("*.*",), 1 << 40, upstream_uri="changelog:///x")
    back, _ = _decode_record(ChangefeedInfo, _kv(encode_record(info, "w")))
    assert back == info
    raw = json.loads(encode_record(info, "w"))
    del raw["upstream_uri"]  # as written by an older build
    old, _ = _decode_record(ChangefeedInfo, _kv(json.dumps(raw).encode()))
    assert old.upstream_uri == ""

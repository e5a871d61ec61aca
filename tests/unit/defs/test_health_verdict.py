"""The changefeed health check's evaluation survives Dagster's serialization (the owner
sensor's result crosses gRPC from the code server to the daemon)."""

import dagster as dg
from dagster_shared.serdes import serialize_value

from cdc_dagster.defs.changefeeds.health import verdict
from cdc_dagster.metastore.changefeeds import ChangefeedState


def test_a_verdict_given_the_state_enum_serializes_as_its_text():
    key = dg.AssetKey(["changefeed", "shop"])
    evaluation = verdict(key, ChangefeedState.WARNING, "no captures", {"lag_seconds": 1.5})
    assert '"warning"' in serialize_value(evaluation)  # a raw enum raised SerializationError
    assert evaluation.metadata["state"].value == "warning" and not evaluation.passed

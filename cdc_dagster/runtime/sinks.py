"""The sink for a URI, including the runtime's fake downstream (``file:///abs/path``)."""

from __future__ import annotations

from typing import Any

from cdc_dagster.sinks.uri import sink_for_uri


def open_sink(uri: str) -> Any:
    """``file:///path`` -> the fake downstream's sink (tests); anything else -> ``sink_for_uri``."""
    if uri.startswith("file://"):
        from cdc_dagster.testing.fake_runtime import FakeSink

        return FakeSink(uri[len("file://") :])
    return sink_for_uri(uri)

"""Find ``sink_for_uri`` wherever the sinks package defines it (docs/dataplane.md section 3)."""

from __future__ import annotations

import importlib

from cdc_dagster.sinks.base import Sink

_MODULES = (
    "cdc_dagster.sinks.base",
    "cdc_dagster.sinks",
    "cdc_dagster.sinks.uri",
    "cdc_dagster.sinks.delta",
)


def sink_for_uri(uri: str) -> Sink:
    """The sink for ``uri`` (``delta:///abs/path``, ``postgresql://...``)."""
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        factory = getattr(module, "sink_for_uri", None)
        if factory is not None:
            return factory(uri)
    raise ImportError(
        f"no sink_for_uri in {list(_MODULES)}: the sinks package does not offer {uri!r} yet"
    )

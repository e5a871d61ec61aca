"""``sink_for_uri``: a sink from its URI, so a Spark task or a fresh process can rebuild it."""

from __future__ import annotations

import urllib.parse

from cdc_dagster.sinks.base import Sink, SinkError


def sink_for_uri(uri: str) -> Sink:
    """``delta:///abs/path`` -> DeltaSink; ``postgresql://...`` -> PostgresSink."""
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if scheme == "delta":
        parts = urllib.parse.urlparse(uri)
        if parts.netloc or not parts.path.startswith("/"):
            raise SinkError(
                f"Delta sink URI {uri!r}: expected delta:///absolute/path (three slashes)"
            )
        from cdc_dagster.sinks.delta import DeltaSink

        return DeltaSink(urllib.parse.unquote(parts.path))
    if scheme in ("postgresql", "postgres"):
        from cdc_dagster.sinks.postgres import PostgresSink  # type: ignore[import-not-found]

        return PostgresSink(uri)
    raise SinkError(
        f"unknown sink URI scheme {scheme!r} in {uri.split('@')[-1]!r}: "
        "use delta:///abs/path or postgresql://..."
    )

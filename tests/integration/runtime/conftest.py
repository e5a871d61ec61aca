"""Runtime fixtures: a change log upstream, a fake downstream, a driver on the session etcd."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from upstream_helpers import Upstream

from cdc_dagster.metastore import Metastore
from cdc_dagster.runtime.driver import Driver
from cdc_dagster.runtime.fake import FileDownstream


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    """Four tables created two minutes ago, resolved one second after."""
    return Upstream(tmp_path / "changelog", tables=4)


@pytest.fixture
def sink_uri(tmp_path: Path) -> str:
    """A fake downstream (``file://``)."""
    return f"file://{tmp_path / 'downstream'}"


@pytest.fixture
def make_driver(
    tmp_path: Path, metastore: Metastore, upstream: Upstream, sink_uri: str
) -> Iterator[Callable[..., Driver]]:
    """Build drivers on this test's cluster (same state dir, so a second one continues)."""

    def make(**kw: Any) -> Driver:
        kw.setdefault("captures", 2)
        kw.setdefault("start_ts", upstream.start_ts)
        return Driver(tmp_path / "state", upstream.root, sink_uri, metastore=metastore, **kw)

    yield make


def check_downstream(sink_uri: str) -> dict[int, list[dict[str, Any]]]:
    """No double write: per table, accepted writes are contiguous, increasing, tokens non-decreasing."""
    ds = FileDownstream(sink_uri[len("file://") :])
    by_table: dict[int, list[dict[str, Any]]] = {}
    for w in ds.writes():
        by_table.setdefault(w["table_id"], []).append(w)
    for tid, writes in by_table.items():
        for a, b in itertools.pairwise(writes):
            assert b["start_ts"] == a["end_ts"], (tid, a, b)
            assert b["end_ts"] > a["end_ts"], (tid, a, b)
            assert b["token"] >= a["token"], (tid, a, b)
    return by_table

"""Runtime fixtures: a change log upstream, a fake downstream, a driver on the session etcd."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from upstream_helpers import Upstream

from cdc_dagster.metastore import Metastore
from cdc_dagster.testing.driver import Driver


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

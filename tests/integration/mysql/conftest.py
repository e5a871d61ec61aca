"""A private MariaDB with a row binlog for the session (Debian's mariadb-server)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from cdc_dagster.testing.servers import EmbeddedServerError, PrivateMariaDB


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateMariaDB]:
    """One MariaDB (binlog ROW, FULL image and metadata) on a free loopback port."""
    server = PrivateMariaDB(tmp_path_factory.mktemp("mariadb"), server_id=1)
    try:
        server.start()
    except EmbeddedServerError as exc:
        pytest.skip(f"no private MariaDB: {exc}")
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def mydb(mariadb: PrivateMariaDB) -> Iterator[str]:
    """A database of this test's own (the puller's filter is ``<db>.*``)."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    conn = mariadb.connect()
    conn.cursor().execute(f"CREATE DATABASE `{name}`")
    conn.close()
    yield name
    conn = mariadb.connect()
    conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
    conn.close()


@pytest.fixture(scope="session")
def etcd_endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """A private etcd for the Dagster-plane tests of this directory."""
    from cdc_dagster.testing.etcd import EmbeddedEtcd, EtcdTuning

    server = EmbeddedEtcd(tmp_path_factory.mktemp("etcd"), tuning=EtcdTuning.for_tests())
    server.start()
    try:
        yield server.endpoints
    finally:
        server.stop()


@pytest.fixture
def cluster_id() -> str:
    """A cluster id of this test's own."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def metastore(etcd_endpoints: list[str], cluster_id: str) -> Iterator[object]:
    from cdc_dagster.metastore import connect

    ms = connect(etcd_endpoints, cluster_id=cluster_id, retry_timeout_s=10.0)
    try:
        yield ms
    finally:
        ms.close()


@pytest.fixture
def dagster_env(
    monkeypatch: pytest.MonkeyPatch, etcd_endpoints: list[str], cluster_id: str, tmp_path
) -> None:
    """The control plane's settings point at this test's cluster (a fresh owner loop)."""
    from cdc_dagster.defs.resources import CdcResource

    monkeypatch.setenv("CDC_DAGSTER_ETCD", ",".join(etcd_endpoints))
    monkeypatch.setenv("CDC_DAGSTER_CLUSTER_ID", cluster_id)
    monkeypatch.setenv("CDC_DAGSTER_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CDC_DAGSTER_OWNER_ID", "owner-1")
    CdcResource.forget_owner_loops()

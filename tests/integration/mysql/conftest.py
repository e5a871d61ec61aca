"""A private MariaDB with a row binlog for the session (Debian's mariadb-server)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from cdc_dagster.mysql.embedded import EmbeddedServerError, PrivateMariaDB


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
def pg_for_mysql(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A private PostgreSQL for the end-to-end tests of this directory."""
    from cdc_dagster.mysql.embedded import PrivatePostgres

    server = PrivatePostgres(tmp_path_factory.mktemp("pg"))
    try:
        server.start()
    except EmbeddedServerError as exc:
        pytest.skip(f"no private PostgreSQL: {exc}")
    try:
        yield server
    finally:
        server.cleanup()

"""A private PostgreSQL for the session (Debian's postgresql; see cdc_dagster.testing.servers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from cdc_dagster.testing.servers import PrivatePostgres


@pytest.fixture
def pg_db(pg_server: PrivatePostgres) -> Iterator[str]:
    """A fresh database of this test's own; yields its name."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_uri(pg_server: PrivatePostgres, pg_db: str) -> str:
    return pg_server.uri(pg_db)


@pytest.fixture
def pg_conn(pg_server: PrivatePostgres, pg_db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_server.dsn(pg_db), autocommit=True) as conn:
        yield conn

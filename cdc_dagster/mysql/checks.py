"""Checks at changefeed create: upstream settings, privileges, every table replicable."""

from __future__ import annotations

from collections.abc import Sequence

from cdc_dagster.mysql.catalog import (
    CatalogError,
    IdRegistry,
    TableFilter,
    build_schema,
    list_tables,
    read_table,
)
from cdc_dagster.mysql.types import UnsupportedTypeError
from cdc_dagster.mysql.upstream import check_upstream, connect
from cdc_dagster.upstream.uri import UpstreamError, parse_uri


def validate_changefeed(upstream_uri: str, filters: Sequence[str] = ()) -> list[str]:
    """The ``db.table`` names a changefeed would replicate; UpstreamError naming every problem.

    Wrong binlog settings or privileges fail first (``check_upstream``); then every table
    the filter selects must have a primary key or a NOT NULL unique key (unless the URI
    says ``force-replicate=true``) and only supported column types.
    """
    cfg = parse_uri(upstream_uri)
    conn = connect(cfg)
    try:
        check_upstream(conn)
        names, keyless, untyped = [], [], []
        ids = IdRegistry()
        for db, table in list_tables(conn, TableFilter(tuple(filters))):
            try:
                raw = read_table(conn, db, table)
            except UnsupportedTypeError as exc:
                untyped.append(f"{db}.{table}: {exc}")
                continue
            if raw is None:
                continue
            try:
                build_schema(
                    raw, ids.new_table_id(), ids, None, force_replicate=cfg.force_replicate
                )
            except CatalogError:
                keyless.append(f"{db}.{table}")
                continue
            names.append(f"{db}.{table}")
    finally:
        conn.close()
    problems = []
    if keyless:
        problems.append(
            f"tables without a primary key or NOT NULL unique key: {', '.join(keyless)}; add "
            "one, filter them out ('!db.table'), or set force-replicate=true on the upstream URI"
        )
    problems += untyped
    if problems:
        raise UpstreamError("changefeed cannot start: " + "; ".join(problems))
    return names

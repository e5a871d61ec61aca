"""Checks at changefeed create: upstream settings, privileges, every table replicable."""

from __future__ import annotations

from collections.abc import Sequence

from cdc_dagster.mysql.catalog import (
    CatalogError,
    IdRegistry,
    TableFilter,
    build_schema,
    list_tables,
    read_tables,
)
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
        listed = list_tables(conn, TableFilter(tuple(filters)))
        raws = read_tables(conn, listed, lambda db, t, exc: untyped.append(f"{db}.{t}: {exc}"))
        for db, table in listed:
            raw = raws.get((db, table))
            if raw is None:  # gone meanwhile, or a type not supported (``untyped``)
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

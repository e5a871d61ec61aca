"""Admin operations shared by the CLI and the Dagster admin jobs.

Changefeed CRUD goes straight to the metastore's compare-and-swap store. Scheduling
requests the owner must act on (move a table, drain a capture, rebalance) are written as
one etcd key each under ``<cluster prefix>/admin/<changefeed>/<request-id>``; the owner
sensor hands them to its coordinator and deletes them. Every request is validated against
what etcd holds now, so a bad one fails with a one-line reason and writes nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from cdc_dagster.metastore import Metastore
from cdc_dagster.metastore.errors import MetastoreError
from scheduler_core.model import TableState

DEFAULT_CAPTURE_TTL_S = 60


class AdminError(Exception):
    """A refused admin request; the message is one line saying why and what to do."""


def admin_prefix(ms: Metastore, changefeed_id: str | None = None) -> str:
    """The key prefix of pending owner requests (of one changefeed, or all)."""
    base = f"{ms.layout.prefix}admin/"
    return base if changefeed_id is None else f"{base}{changefeed_id}/"


def pending_requests(ms: Metastore) -> list[tuple[str, dict[str, Any]]]:
    """Every pending owner request (key, body), by key."""
    out = []
    for kv in ms.client.get_prefix(admin_prefix(ms)).kvs:
        try:
            out.append((kv.key, dict(json.loads(kv.value))))
        except (ValueError, TypeError):
            out.append((kv.key, {"op": "malformed"}))
    return sorted(out, key=lambda item: item[0])


def _submit(ms: Metastore, changefeed_id: str, body: dict[str, Any]) -> str:
    # The owner (cdc_dagster.runtime's OwnerLoop) reads these keys, applies and deletes them;
    # the body format is the runtime's (docs/dataplane.md section 4, admin requests).
    key = f"{admin_prefix(ms, changefeed_id)}{uuid.uuid4().hex[:12]}"
    ms.client.put(key, json.dumps(body).encode())
    return key


def _need_changefeed(ms: Metastore, changefeed_id: str) -> None:
    ms.changefeeds.get(changefeed_id)  # ChangefeedNotFoundError names it


def _tables_held(ms: Metastore, changefeed_id: str) -> dict[str, set[int]]:
    """capture id -> tables it reports holding (not absent / stopped)."""
    snapshot = ms.read_owner_snapshot()
    held: dict[str, set[int]] = {}
    for capture_id, status in snapshot.tasks.get(changefeed_id, {}).items():
        batch = status.tables
        live = (batch.states != int(TableState.ABSENT)) & (batch.states != int(TableState.STOPPED))
        held[capture_id] = {int(t) for t in batch.table_ids[live]}
    return held


def _alive(ms: Metastore) -> set[str]:
    return {c.capture_id for c in ms.captures.list_alive()}


def move_table(ms: Metastore, changefeed_id: str, table_id: int, capture_id: str) -> str:
    """Ask the owner to move ``table_id`` to ``capture_id`` (two-phase, no pause)."""
    _need_changefeed(ms, changefeed_id)
    alive = _alive(ms)
    if capture_id not in alive:
        raise AdminError(
            f"capture {capture_id!r} is not alive (alive: {', '.join(sorted(alive)) or 'none'}); "
            "move the table to one of those"
        )
    held = _tables_held(ms, changefeed_id)
    if held and not any(table_id in tables for tables in held.values()):
        raise AdminError(
            f"table {table_id} is not replicated by changefeed {changefeed_id!r}; "
            "`cdc-dagster changefeed query` lists its tables"
        )
    if table_id in held.get(capture_id, set()):
        raise AdminError(f"table {table_id} is already on capture {capture_id!r}; nothing to move")
    return _submit(ms, changefeed_id, {"op": "move_table", "table_id": table_id, "to": capture_id})


def drain_capture(ms: Metastore, capture_id: str) -> list[str]:
    """Ask the owner to move every table off ``capture_id`` (in every changefeed)."""
    alive = _alive(ms)
    if capture_id not in alive:
        raise AdminError(
            f"capture {capture_id!r} is not alive (alive: {', '.join(sorted(alive)) or 'none'})"
        )
    if len(alive) < 2:
        raise AdminError(
            f"capture {capture_id!r} is the last alive capture; add another before draining it"
        )
    return [
        _submit(ms, cf.changefeed_id, {"op": "drain_capture", "capture_id": capture_id})
        for cf in ms.changefeeds.list()
    ]


def rebalance(ms: Metastore, changefeed_id: str) -> str:
    """Ask the owner to spread the changefeed's tables evenly over the alive captures."""
    _need_changefeed(ms, changefeed_id)
    return _submit(ms, changefeed_id, {"op": "rebalance"})


def resign_owner(ms: Metastore) -> str:
    """Make the current owner step down (the next sensor tick campaigns again); returns its id."""
    owner = ms.election.current_owner()
    if owner is None:
        raise AdminError("there is no owner right now; nothing to resign")
    session = ms.election.attach(owner.owner_id)
    if session is None:
        raise AdminError(f"owner {owner.owner_id!r} changed while resigning; try again")
    session.resign()
    return owner.owner_id


def add_capture(ms: Metastore, capture_id: str, ttl_s: int = DEFAULT_CAPTURE_TTL_S) -> str:
    """Register a capture (its runs renew the lease); returns its epoch."""
    if ms.captures.get(capture_id) is not None:
        raise AdminError(f"capture {capture_id!r} is already registered")
    if ttl_s < 5:
        raise AdminError(f"capture lease ttl {ttl_s}s is too short: use at least 5 s")
    session = ms.captures.register(capture_id, ttl_s, keepalive=False)
    return session.epoch


def remove_capture(ms: Metastore, capture_id: str) -> None:
    """Deregister a capture that holds no tables (drain it first)."""
    info = ms.captures.get(capture_id)
    if info is None:
        raise AdminError(f"capture {capture_id!r} is not registered")
    for cf in ms.changefeeds.list():
        tables = _tables_held(ms, cf.changefeed_id).get(capture_id, set())
        if tables:
            raise AdminError(
                f"capture {capture_id!r} still holds {len(tables)} table(s) of changefeed "
                f"{cf.changefeed_id!r}; drain it first (`cdc-dagster capture drain {capture_id}`)"
            )
    ms.client.revoke_lease(int(info.epoch, 16))


def create_changefeed(
    ms: Metastore,
    changefeed_id: str,
    sink_uri: str,
    *,
    table_filter: Sequence[str] = ("*.*",),
    start_ts: int | None = None,
    target_ts: int = 0,
    sync_point_interval_s: int = 0,
    upstream_uri: str = "",
    changelog_root: str | None = None,
    progress: Any = None,
    checked: Any = None,
) -> Any:
    """Create a changefeed (metastore validation; nothing written on error).

    A ``mysql://`` upstream is checked and snapshotted first (``create_mysql_changefeed``).
    """
    from cdc_dagster.mysql.upstream import is_mysql_uri

    if upstream_uri and is_mysql_uri(upstream_uri):
        if start_ts is not None:
            raise AdminError(
                "a MySQL/MariaDB changefeed starts at its initial snapshot; omit the start ts"
            )
        return create_mysql_changefeed(
            ms,
            changefeed_id,
            sink_uri,
            upstream_uri,
            table_filter=table_filter,
            target_ts=target_ts,
            sync_point_interval_s=sync_point_interval_s,
            changelog_root=changelog_root,
            progress=progress,
            checked=checked,
        )
    extra: dict[str, Any] = {}
    if upstream_uri:
        import dataclasses

        from cdc_dagster.metastore import ChangefeedInfo

        if "upstream_uri" not in {f.name for f in dataclasses.fields(ChangefeedInfo)}:
            raise AdminError("this metastore version stores no upstream URI; omit --upstream-uri")
        extra["upstream_uri"] = upstream_uri
    return ms.changefeeds.create(
        changefeed_id,
        sink_uri,
        table_filter=table_filter,
        start_ts=start_ts,
        target_ts=target_ts,
        sync_point_interval_s=sync_point_interval_s,
        **extra,
    )


def create_mysql_changefeed(
    ms: Metastore,
    changefeed_id: str,
    sink_uri: str,
    upstream_uri: str,
    *,
    table_filter: Sequence[str] = ("*.*",),
    target_ts: int = 0,
    sync_point_interval_s: int = 0,
    changelog_root: str | None = None,
    progress: Any = None,
    checked: Any = None,
) -> Any:
    """Check the upstream, take the initial snapshot into the changefeed's change log, and
    create the changefeed at the snapshot's start ts (docs/mysql-postgres.md).

    ``changelog_root`` is where the change log goes unless the URI names one (changelog=).
    Everything the metastore would refuse is checked before the snapshot; if the create
    fails after it, the snapshot is removed: nothing is left half-written.
    """
    from cdc_dagster.metastore.errors import ChangefeedNotFoundError
    from cdc_dagster.metastore.validation import TableFilter, validate_sink_uri
    from cdc_dagster.mysql.catalog import CatalogError
    from cdc_dagster.mysql.changefeed import discard_snapshot, take_initial_snapshot
    from cdc_dagster.mysql.puller import PullerError
    from cdc_dagster.mysql.upstream import UpstreamError, parse_uri, redact

    validate_sink_uri(sink_uri)
    TableFilter.parse(table_filter)
    try:
        ms.changefeeds.get(changefeed_id)
    except ChangefeedNotFoundError:
        pass
    else:
        raise AdminError(
            f"changefeed {changefeed_id!r} already exists; remove it or pick another id"
        )
    try:
        root = parse_uri(upstream_uri).changelog or changelog_root
        if not root:
            raise AdminError(
                "where should the change log go? give changelog=/abs/path in the upstream URI"
            )
        snap = take_initial_snapshot(upstream_uri, root, tuple(table_filter), progress, checked)
    except (UpstreamError, PullerError, CatalogError) as exc:
        shown = redact(upstream_uri)
        message = str(exc) if shown in str(exc) else f"upstream {shown}: {exc}"
        raise AdminError(message) from None
    try:
        return ms.changefeeds.create(
            changefeed_id,
            sink_uri,
            table_filter=table_filter,
            start_ts=snap.start_ts,
            target_ts=target_ts,
            sync_point_interval_s=sync_point_interval_s,
            upstream_uri=snap.upstream_uri,
        )
    except BaseException:
        discard_snapshot(snap)
        raise


ADMIN_ERRORS: tuple[type[Exception], ...] = (AdminError, MetastoreError)

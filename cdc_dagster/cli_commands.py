"""The ``cdc-dagster`` commands that talk to etcd: changefeed, capture, table, owner.

Apart from :mod:`cdc_dagster.cli` so that ``server`` and ``demo`` start without importing
the metastore, the admin operations and what they pull in (gRPC, the MySQL stack).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cdc_dagster import admin
from cdc_dagster.cli_args import CliError, load_changefeed_config, state_dir_of
from cdc_dagster.metastore import connect
from cdc_dagster.metastore.changefeeds import wall_ms
from cdc_dagster.metastore.errors import MetastoreError
from cdc_dagster.secrets import redact_text, redact_uri
from cdc_dagster.upstream.uri import is_mysql_uri
from scheduler_core.ts import compose, physical_ms, wall_time

ERRORS: tuple[type[Exception], ...] = (MetastoreError, admin.AdminError)


def open_metastore(args: argparse.Namespace) -> Any:
    """The metastore of ``--etcd`` or of the state dir's private etcd (which must run)."""
    endpoints = [e for e in (args.etcd or "").split(",") if e.strip()]
    return connect(endpoints or None, state_dir_of(args), cluster_id=args.cluster_id)


def _time(ts: int) -> str:
    return wall_time(ts) if ts else ""


def _changefeed_row(cf: Any, now_ms: int) -> dict[str, Any]:
    info, status = cf.info, cf.status
    return {
        "id": info.changefeed_id,
        "state": str(status.state),
        "error": redact_text(status.last_error),
        "warning_since": _time(compose(status.warning_since_ms)) if status.warning_since_ms else "",
        "checkpoint_ts": status.checkpoint_ts,
        "checkpoint_time": _time(status.checkpoint_ts),
        "resolved_ts": status.resolved_ts,
        "resolved_time": _time(status.resolved_ts),
        "lag_s": round(max(0.0, (now_ms - physical_ms(status.checkpoint_ts)) / 1000), 1),
        "sink_uri": redact_uri(info.sink_uri),
        "upstream_uri": redact_uri(info.upstream_uri),
        "filter": list(info.table_filter),
        "start_ts": info.start_ts,
        "target_ts": info.target_ts,
        "sync_point_interval_s": info.sync_point_interval_s,
    }


def _skipped_tables(cf: Any) -> dict[str, str]:
    """A mysql:// changefeed's tables its puller skips (no key): ``db.table`` -> why."""
    from cdc_dagster.mysql.state import skipped_tables
    from cdc_dagster.upstream.uri import UpstreamError, changelog_path

    if not is_mysql_uri(cf.info.upstream_uri):
        return {}
    try:
        return skipped_tables(changelog_path(cf.info.upstream_uri))
    except UpstreamError:
        return {}


def _snapshots(ms: Any, cf: Any) -> dict[str, Any]:
    """A mysql:// changefeed's table snapshots in progress and re-snapshots not yet taken."""
    if not is_mysql_uri(cf.info.upstream_uri):
        return {}
    return {
        "snapshots": [p.to_json() for p in admin.snapshots_of(cf)],
        "resnapshot_requested": sorted(admin.resnapshot_requests(ms, cf.changefeed_id)),
    }


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


def _mysql_create_options(args: argparse.Namespace) -> dict[str, Any]:
    """For a mysql:// upstream: where its change log goes, and the snapshot's progress lines."""
    if not args.upstream_uri or not is_mysql_uri(args.upstream_uri):
        return {}
    root = args.changelog_dir or state_dir_of(args) / "mysql" / args.changefeed_id
    shown: dict[str, int] = {}

    def checked(tables: Sequence[str]) -> None:
        print(f"upstream {redact_uri(args.upstream_uri)}: binlog settings and privileges OK")
        print(f"snapshotting {len(tables)} table(s): {', '.join(tables) or '(none)'}", flush=True)

    def progress(table: str, done: int, total: int) -> None:
        percent = 100 * done // max(total, 1)
        if shown.get(table, -1) // 10 != percent // 10 or done >= total:  # every 10 %
            shown[table] = percent
            print(f"  snapshot {table}: {done}/{total} rows ({percent}%)", flush=True)

    return {"changelog_root": str(Path(root).resolve()), "progress": progress, "checked": checked}


def cmd_changefeed(args: argparse.Namespace) -> None:
    """changefeed create|list|query|pause|resume|update|remove."""
    with open_metastore(args) as ms:
        if args.action == "create":
            options = load_changefeed_config(args.config) if args.config else {}
            if args.target_ts:
                options["target_ts"] = args.target_ts
            if args.filter:
                options["table_filter"] = tuple(args.filter)
            options.update(_mysql_create_options(args))
            cf = admin.create_changefeed(
                ms,
                args.changefeed_id,
                args.sink_uri,
                start_ts=args.start_ts,
                upstream_uri=args.upstream_uri,
                **options,
            )
            print(f"created changefeed {cf.changefeed_id} into {redact_uri(cf.info.sink_uri)}")
            print(f"start ts {cf.info.start_ts} ({_time(cf.info.start_ts)})")
            print(_reload_definitions(args))
        elif args.action == "list":
            now = wall_ms()
            _print(
                [
                    {k: r[k] for k in ("id", "state", "checkpoint_time", "lag_s", "error")}
                    for r in (_changefeed_row(cf, now) for cf in ms.changefeeds.list())
                ]
            )
        elif args.action == "query":
            cf = ms.changefeeds.get(args.changefeed_id)
            _print(
                {
                    **_changefeed_row(cf, wall_ms()),
                    "skipped_tables": _skipped_tables(cf),
                    **_snapshots(ms, cf),
                }
            )
        elif args.action == "pause":
            admin.pause_changefeed(ms, args.changefeed_id)
            print(f"paused changefeed {args.changefeed_id}")
        elif args.action == "resume":
            admin.resume_changefeed(ms, args.changefeed_id)
            print(f"resumed changefeed {args.changefeed_id}")
        elif args.action == "update":
            options = load_changefeed_config(args.config) if args.config else {}
            if args.sink_uri is not None:
                options["sink_uri"] = args.sink_uri
            if args.target_ts is not None:
                options["target_ts"] = args.target_ts
            if not options:
                raise CliError("nothing to update: pass --sink-uri, --target-ts or --config")
            admin.update_changefeed(ms, args.changefeed_id, **options)
            print(f"updated changefeed {args.changefeed_id}")
        elif args.action == "remove":
            removed = admin.remove_changefeed(
                ms,
                args.changefeed_id,
                keep_state=args.keep_state,
                staging_root=state_dir_of(args) / "staging",
            )
            print(f"removed changefeed {args.changefeed_id}")
            for path in removed:
                print(f"removed {path}")
            print(_reload_definitions(args))


def _reload_definitions(args: argparse.Namespace) -> str:
    """The Dagster UI's assets follow the changefeeds (a local supervised stack's code server
    is restarted; see ``services.stack.reload_definitions``)."""
    from cdc_dagster.services.stack import reload_definitions

    return reload_definitions(state_dir_of(args))


def _capture_rows(ms: Any) -> list[dict[str, Any]]:
    """Every capture the user asked for or that is registered: alive or not, desired or not."""
    owner = ms.election.current_owner()
    alive = {c.capture_id: c for c in ms.captures.list_alive()}
    desired = ms.captures.desired()
    rows = []
    for cid in sorted(set(alive) | set(desired)):
        info = alive.get(cid)
        row = {
            "id": cid,
            "alive": info is not None,
            "desired": cid in desired,
            "epoch": info.epoch if info else "",
            "is_owner": owner is not None and owner.owner_id == cid,
            "address": info.address if info else "",
        }
        if info is None:
            row["note"] = "its lease expired; the owner registers it again at its next tick"
        rows.append(row)
    return rows


def cmd_capture(args: argparse.Namespace) -> None:
    """capture list|add|drain|remove."""
    with open_metastore(args) as ms:
        if args.action == "list":
            _print(_capture_rows(ms))
        elif args.action == "add":
            ttl = admin.DEFAULT_CAPTURE_TTL_S if args.ttl is None else args.ttl
            epoch = admin.add_capture(ms, args.capture_id, ttl)
            print(f"added capture {args.capture_id} (epoch {epoch})")
        elif args.action == "drain":
            reqs = admin.drain_capture(ms, args.capture_id)
            print(f"draining capture {args.capture_id} ({len(reqs)} changefeed(s))")
        elif args.action == "remove":
            admin.remove_capture(ms, args.capture_id)
            print(f"removed capture {args.capture_id}")


def cmd_table(args: argparse.Namespace) -> None:
    """table move|rebalance|resnapshot."""
    with open_metastore(args) as ms:
        if args.action == "resnapshot":
            for line in admin.request_resnapshot(ms, args.changefeed_id, args.table).lines():
                print(line)
        elif args.action == "move":
            admin.move_table(ms, args.changefeed_id, args.table_id, args.capture_id)
            print(f"moving table {args.table_id} to capture {args.capture_id}")
        else:
            admin.rebalance(ms, args.changefeed_id)
            print(f"rebalancing changefeed {args.changefeed_id}")


def cmd_owner(args: argparse.Namespace) -> None:
    """owner resign|show."""
    with open_metastore(args) as ms:
        if args.action == "resign":
            print(f"owner {admin.resign_owner(ms)} resigned")
        else:
            owner = ms.election.current_owner()
            print(
                "no owner" if owner is None else f"{owner.owner_id} (owner_rev {owner.owner_rev})"
            )


COMMANDS: dict[str, Callable[[argparse.Namespace], None]] = {
    "changefeed": cmd_changefeed,
    "capture": cmd_capture,
    "table": cmd_table,
    "owner": cmd_owner,
}

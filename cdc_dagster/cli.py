"""``cdc-dagster``: the command line, in the shape of TiCDC's ``cdc cli``.

Every command talks to etcd: the cluster's ``--etcd`` endpoints, or the private etcd of
``--state-dir`` (default ``.state`` in the working directory). Errors end the command with
a non-zero status and one line saying why; a literal password in a URI is never printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cdc_dagster import admin
from cdc_dagster.metastore import connect
from cdc_dagster.metastore.changefeeds import wall_ms
from cdc_dagster.metastore.errors import MetastoreError
from cdc_dagster.secrets import SecretReferenceError, redact_text, redact_uri
from cdc_dagster.services import stack
from cdc_dagster.upstream.uri import is_mysql_uri
from scheduler_core.ts import compose, physical_ms, wall_time

DEFAULT_STATE_DIR = ".state"
_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?")


class CliError(Exception):
    """A usage error the CLI reports in one line."""


# --- argument parsing ---------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (exposed for tests)."""
    p = argparse.ArgumentParser(prog="cdc-dagster", description=__doc__.splitlines()[0])
    p.add_argument("--etcd", help="etcd endpoints host:port,... (default: the private etcd)")
    p.add_argument(
        "--state-dir",
        default=None,
        help=f"state dir of the private etcd, Dagster and the demo (default: ./{DEFAULT_STATE_DIR})",
    )
    p.add_argument("--cluster-id", default="default", help="cluster id (key prefix in etcd)")
    sub = p.add_subparsers(dest="group", required=True, metavar="COMMAND")

    cf = sub.add_parser("changefeed", help="create, list, query, pause, resume, update, remove")
    cfs = cf.add_subparsers(dest="action", required=True)
    create = cfs.add_parser("create", help="create a changefeed")
    _cf_id(create)
    create.add_argument("--sink-uri", required=True, help="delta:///abs/path or postgresql://...")
    create.add_argument(
        "--upstream-uri",
        default="",
        help="changelog:///abs/path (the embedded upstream's change log), or "
        "mysql://user:${PW}@host:port/?server-id=N (checked and snapshotted now)",
    )
    create.add_argument(
        "--filter",
        action="append",
        default=None,
        metavar="RULE",
        help="table filter rule, repeatable: 'shop.*', '!shop.tmp_*' (default: *.*)",
    )
    create.add_argument(
        "--changelog-dir",
        type=Path,
        default=None,
        help="mysql:// upstream: where its change log goes (default: <state dir>/mysql/<id>)",
    )
    create.add_argument("--start-ts", type=int, default=None, help="TS to start at (default: now)")
    create.add_argument("--target-ts", type=int, default=0, help="TS to stop at (0: never)")
    create.add_argument("--config", type=Path, help="TOML: [filter] rules, sync-point-interval")
    cfs.add_parser("list", help="list changefeeds")
    for action in ("query", "pause", "resume", "remove"):
        _cf_id(cfs.add_parser(action, help=f"{action} a changefeed"))
    update = cfs.add_parser("update", help="change a paused changefeed's config")
    _cf_id(update)
    update.add_argument("--sink-uri")
    update.add_argument("--target-ts", type=int)
    update.add_argument("--config", type=Path)

    cap = sub.add_parser("capture", help="list, add, drain, remove captures")
    caps = cap.add_subparsers(dest="action", required=True)
    caps.add_parser("list", help="alive captures")
    add = caps.add_parser("add", help="register a capture (scale out)")
    add.add_argument("capture_id")
    add.add_argument("--ttl", type=int, default=admin.DEFAULT_CAPTURE_TTL_S, help="lease TTL (s)")
    for action in ("drain", "remove"):
        caps.add_parser(action, help=f"{action} a capture").add_argument("capture_id")

    table = sub.add_parser("table", help="move a table")
    tables = table.add_subparsers(dest="action", required=True)
    move = tables.add_parser("move", help="move a table to another capture")
    _cf_id(move)
    move.add_argument("--table-id", type=int, required=True)
    move.add_argument("--capture-id", required=True, help="destination capture")
    rebal = tables.add_parser("rebalance", help="spread tables evenly")
    _cf_id(rebal)

    owner = sub.add_parser("owner", help="owner")
    owners = owner.add_subparsers(dest="action", required=True)
    owners.add_parser("resign", help="make the owner step down")
    owners.add_parser("show", help="who is the owner")

    server = sub.add_parser("server", help="start, stop or show etcd, Spark Connect and Dagster")
    servers = server.add_subparsers(dest="action", required=True)
    start = servers.add_parser(
        "start",
        help="start etcd, Spark Connect and Dagster, supervised (in the foreground; "
        "--detach: in the background)",
    )
    start.add_argument("--no-dagster", action="store_true", help="only etcd and Spark Connect")
    start.add_argument("--port", type=int, default=0, help="UI port (0: a free one)")
    start.add_argument(
        "--detach", action="store_true", help="run in the background (`server stop` stops it)"
    )
    start.add_argument(
        "--captures",
        type=int,
        default=2,
        metavar="N",
        help="captures to register (capture-1..N; kept registered until removed; default 2)",
    )
    servers.add_parser("stop", help="stop what `server start` started")
    servers.add_parser("status", help="what is running (exit 1 if a part is down, 3 if none runs)")

    demo = sub.add_parser("demo", help="the whole thing with a generated workload")
    demo.add_argument("--tables", type=int, default=6, help="bank tables of the workload")
    demo.add_argument("--port", type=int, default=0, help="UI port (0: a free one)")
    demo.add_argument("--captures", type=int, default=2, metavar="N", help="captures (default 2)")
    demo.add_argument("--no-dagster", action="store_true", help=argparse.SUPPRESS)
    return p


def _cf_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--changefeed-id", required=True, help="changefeed id")


def parse_duration_s(value: object) -> int:
    """``30``, ``"30s"``, ``"10m"``, ``"1h30m"`` -> seconds."""
    if isinstance(value, bool):
        raise CliError(f"sync-point-interval {value!r} is not a duration")
    if isinstance(value, int):
        return value
    match = _DURATION.fullmatch(str(value).strip())
    if not isinstance(value, str) or not value.strip() or match is None:
        raise CliError(f"sync-point-interval {value!r} is not a duration like 30s, 10m or 1h")
    h, m, s = (int(g or 0) for g in match.groups())
    return h * 3600 + m * 60 + s


def load_changefeed_config(path: Path) -> dict[str, Any]:
    """A changefeed config file (TiCDC-style TOML) as create/update keyword arguments."""
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise CliError(f"cannot read config {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"config {path} is not valid TOML: {exc}") from exc
    known = {"filter", "sync-point-interval", "enable-sync-point", "target-ts"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise CliError(
            f"config {path}: unknown key(s) {', '.join(unknown)}; known: {sorted(known)}"
        )
    out: dict[str, Any] = {}
    rules = raw.get("filter", {}).get("rules")
    if rules is not None:
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise CliError(f"config {path}: [filter] rules must be a list of strings")
        out["table_filter"] = tuple(rules)
    if raw.get("enable-sync-point", True) is False:
        out["sync_point_interval_s"] = 0
    elif "sync-point-interval" in raw:
        out["sync_point_interval_s"] = parse_duration_s(raw["sync-point-interval"])
    if "target-ts" in raw:
        out["target_ts"] = int(raw["target-ts"])
    return out


# --- commands -----------------------------------------------------------------------------


def state_dir_of(args: argparse.Namespace) -> Path:
    """The state dir: ``--state-dir``, ``$CDC_DAGSTER_STATE_DIR``, else ``./.state``."""
    chosen = args.state_dir or os.environ.get("CDC_DAGSTER_STATE_DIR") or DEFAULT_STATE_DIR
    return Path(chosen).resolve()


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
        elif args.action == "list":
            now = wall_ms()
            _print(
                [
                    {k: r[k] for k in ("id", "state", "checkpoint_time", "lag_s", "error")}
                    for r in (_changefeed_row(cf, now) for cf in ms.changefeeds.list())
                ]
            )
        elif args.action == "query":
            _print(_changefeed_row(ms.changefeeds.get(args.changefeed_id), wall_ms()))
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
            admin.remove_changefeed(ms, args.changefeed_id)
            print(f"removed changefeed {args.changefeed_id}")


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
            epoch = admin.add_capture(ms, args.capture_id, args.ttl)
            print(f"added capture {args.capture_id} (epoch {epoch})")
        elif args.action == "drain":
            reqs = admin.drain_capture(ms, args.capture_id)
            print(f"draining capture {args.capture_id} ({len(reqs)} changefeed(s))")
        elif args.action == "remove":
            admin.remove_capture(ms, args.capture_id)
            print(f"removed capture {args.capture_id}")


def cmd_table(args: argparse.Namespace) -> None:
    """table move|rebalance."""
    with open_metastore(args) as ms:
        if args.action == "move":
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


def cmd_server(args: argparse.Namespace) -> int:
    """server start|stop|status; the exit status."""
    state = state_dir_of(args)
    if args.action == "start" and args.detach:
        return stack.start_detached(state, _foreground_server_argv(args, state))
    if args.action == "start":
        return stack.serve(
            state,
            etcd=args.etcd,
            port=args.port,
            dagster=not args.no_dagster,
            captures=admin.capture_names(args.captures),
        )
    if args.action == "stop":
        stack.stop(state)
        return 0
    lines, code = stack.status(state)
    for line in lines:
        print(line)
    return code


def _foreground_server_argv(args: argparse.Namespace, state: Path) -> list[str]:
    """The ``server start`` a detached one runs (the same options, without --detach)."""
    argv = ["--state-dir", str(state), "--cluster-id", args.cluster_id]
    argv += ["--etcd", args.etcd] if args.etcd else []
    argv += ["server", "start", "--port", str(args.port), "--captures", str(args.captures)]
    return argv + (["--no-dagster"] if args.no_dagster else [])


def cmd_demo(args: argparse.Namespace) -> int:
    """demo: etcd, Spark Connect, generator, changefeed, Dagster; Ctrl-C stops them."""
    return stack.demo(
        state_dir_of(args),
        tables=args.tables,
        port=args.port,
        dagster=not args.no_dagster,
        captures=admin.capture_names(args.captures),
    )


COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {
    "changefeed": cmd_changefeed,
    "capture": cmd_capture,
    "table": cmd_table,
    "owner": cmd_owner,
    "server": cmd_server,
    "demo": cmd_demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (1 with a one-line reason on error)."""
    args = build_parser().parse_args(argv)

    try:
        code = COMMANDS[args.group](args)
    except KeyboardInterrupt:
        return 130
    except (
        CliError,
        MetastoreError,
        admin.AdminError,
        SecretReferenceError,
        ValueError,
        RuntimeError,
    ) as exc:
        message = " ".join(str(exc).split())
        print(f"cdc-dagster: error: {redact_text(message)}", file=sys.stderr)
        return 1
    return code or 0


if __name__ == "__main__":
    sys.exit(main())

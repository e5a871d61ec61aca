"""``cdc-dagster``: the command line, in the shape of TiCDC's ``cdc cli``.

Every command talks to etcd: the cluster's ``--etcd`` endpoints, or the private etcd of
``--state-dir`` (default ``.state`` in the working directory). Errors end the command with
a non-zero status and one line saying why; a literal password in a URI is never printed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from cdc_dagster.cli_args import (
    DEFAULT_STATE_DIR,
    CliError,
    capture_names,
    state_dir_of,
)
from cdc_dagster.secrets import SecretReferenceError, redact_text
from cdc_dagster.services import stack


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
    for action in ("query", "pause", "resume"):
        _cf_id(cfs.add_parser(action, help=f"{action} a changefeed"))
    remove = cfs.add_parser("remove", help="remove a changefeed (and the state it kept on disk)")
    _cf_id(remove)
    remove.add_argument(
        "--keep-state",
        action="store_true",
        help="keep its binlog puller's change log and position, and its captures' staging",
    )
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
    add.add_argument("--ttl", type=int, default=None, help="lease TTL in seconds (default 60)")
    for action in ("drain", "remove"):
        caps.add_parser(action, help=f"{action} a capture").add_argument("capture_id")

    table = sub.add_parser("table", help="move, rebalance or re-snapshot tables")
    tables = table.add_subparsers(dest="action", required=True)
    move = tables.add_parser("move", help="move a table to another capture")
    _cf_id(move)
    move.add_argument("--table-id", type=int, required=True)
    move.add_argument("--capture-id", required=True, help="destination capture")
    rebal = tables.add_parser("rebalance", help="spread tables evenly")
    _cf_id(rebal)
    resnap = tables.add_parser(
        "resnapshot",
        help="snapshot a table of a mysql:// changefeed again (in chunks, the other tables "
        "replicating on), replacing its downstream rows",
    )
    _cf_id(resnap)
    resnap.add_argument("table", metavar="DATABASE.TABLE", help="the upstream table")

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
            captures=capture_names(args.captures),
            cluster_id=args.cluster_id,
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
        captures=capture_names(args.captures),
    )


COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {
    "server": cmd_server,
    "demo": cmd_demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (1 with a one-line reason on error)."""
    args = build_parser().parse_args(argv)
    errors: tuple[type[Exception], ...] = (CliError, SecretReferenceError, ValueError, RuntimeError)
    try:
        if args.group in COMMANDS:
            code = COMMANDS[args.group](args)
        else:
            # Only the etcd commands import the metastore and the admin operations (~1 s).
            from cdc_dagster import cli_commands

            errors += cli_commands.ERRORS
            code = cli_commands.COMMANDS[args.group](args)
    except KeyboardInterrupt:
        return 130
    except errors as exc:
        message = " ".join(str(exc).split())
        print(f"cdc-dagster: error: {redact_text(message)}", file=sys.stderr)
        return 1
    return code or 0


if __name__ == "__main__":
    sys.exit(main())

"""Admin operations, the one home of what the CLI, the Dagster admin jobs and the owner do
with them.

- Changefeeds (create, update, pause, resume, remove) go straight to the metastore's
  compare-and-swap store; ``create`` checks the upstream (and snapshots a MySQL one) first.
- Captures (add, remove) are registrations in etcd.
- Scheduling requests the owner must act on (move a table, drain a capture, rebalance) are
  one etcd key each, ``admin/<changefeed>/<request-id>`` (:mod:`cdc_dagster.metastore.keys`):
  the ``request_*``/user functions validate against what etcd holds now and write it (a bad
  request raises :class:`AdminError` and writes nothing); the owner reads them every tick
  (:func:`pending_requests`) and hands them to its coordinator (:func:`apply_requests`). A
  move is deleted once handed over; a drain stays until the capture holds no table of the
  changefeed, so an owner switch mid-drain carries it on.
- Re-snapshot requests (``table resnapshot``) are one key per table,
  ``resnapshot/<changefeed>/<digest>``, taken by the changefeed's puller run (it is the one
  writer of the change log), which deletes the key once its state is saved.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_dagster.metastore import Changefeed, ChangefeedStatus, Metastore, OwnerSession
from cdc_dagster.metastore.client import Delete, Put, create_revision_is
from cdc_dagster.metastore.errors import ChangefeedNotFoundError, MetastoreError
from cdc_dagster.metastore.validation import TableFilter
from cdc_dagster.mysql.catalog import CatalogError
from cdc_dagster.mysql.changefeed import discard_snapshot, take_initial_snapshot
from cdc_dagster.mysql.puller import PullerError, lock_path, pulling
from cdc_dagster.mysql.resnapshot import split_name
from cdc_dagster.mysql.snapshots import SnapshotProgress, snapshot_progress
from cdc_dagster.mysql.state import PullerState, load_state
from cdc_dagster.secrets import redact_uri
from cdc_dagster.sinks.uri import probe_sink
from cdc_dagster.upstream.uri import UpstreamError, changelog_path, is_mysql_uri, parse_uri
from scheduler_core.coordinator import Coordinator
from scheduler_core.errors import ConfigError
from scheduler_core.model import TableState

log = logging.getLogger(__name__)

DEFAULT_CAPTURE_TTL_S = 60

Request = tuple[str, dict[str, Any]]  # (key, body)


class AdminError(ValueError):
    """A refused admin request; the message is one line saying why and what to do."""


ADMIN_ERRORS: tuple[type[Exception], ...] = (AdminError, MetastoreError)


# ------------------------------------------------------------------------------ owner requests
def _submit(ms: Metastore, changefeed_id: str, body: dict[str, Any]) -> str:
    key = ms.layout.admin_request(changefeed_id, uuid.uuid4().hex[:12])
    ms.client.put(key, json.dumps(body).encode())
    return key


def pending_requests(ms: Metastore) -> dict[str, list[Request]]:
    """Requests not yet applied (or drains not yet done), by changefeed, in key order."""
    out: dict[str, list[Request]] = {}
    prefix = ms.layout.admin_requests()
    for kv in sorted(ms.client.get_prefix(prefix).kvs, key=lambda kv: kv.key):
        cf_id = kv.key[len(prefix) :].split("/", 1)[0]
        try:
            body = json.loads(kv.value)
            if not isinstance(body, dict):
                raise ValueError(f"not an object: {body!r}")
        except ValueError as exc:
            log.error("admin request %s is malformed (%s); deleting it", kv.key, exc)
            ms.client.delete(kv.key)
            continue
        out.setdefault(cf_id, []).append((kv.key, body))
    return out


def apply_requests(
    session: OwnerSession, coord: Coordinator, requests: Sequence[Request]
) -> list[str]:
    """Hand requests to the coordinator (after its tick); returns one line per refused one."""
    errors: list[str] = []
    done: list[str] = []
    for key, body in requests:
        op = body.get("op")
        try:
            if op == "move_table":
                coord.move_table(int(body["table_id"]), str(body["to"]))
                done.append(key)
            elif op == "rebalance":
                coord.request_rebalance()
                done.append(key)
            elif op == "drain_capture":
                if _drain(coord, str(body["capture_id"])):
                    done.append(key)
            else:
                raise ConfigError(f"unknown admin op {op!r}")
        except (ConfigError, KeyError, ValueError) as exc:
            errors.append(f"admin request {body}: {exc}")
            done.append(key)
    if done:
        session.txn([], [Delete(k) for k in done])
    return errors


def _drain(coord: Coordinator, capture_id: str) -> bool:
    """Start or follow a drain; True once the capture holds none of the changefeed's tables."""
    if capture_id not in coord.captures.captures:
        return True  # gone: nothing left to drain
    if coord.drain.target == capture_id:
        return False
    if coord.replications.table_counts([capture_id])[capture_id] == 0:
        return True
    if coord.drain.target is None:
        coord.drain_capture(capture_id)
    return False


def _tables_held(ms: Metastore, changefeed_id: str) -> dict[str, set[int]]:
    """capture id -> tables it reports holding (not absent / stopped)."""
    held: dict[str, set[int]] = {}
    for capture_id, status in ms.task_statuses.read(changefeed_id).items():
        batch = status.tables
        live = (batch.states != int(TableState.ABSENT)) & (batch.states != int(TableState.STOPPED))
        held[capture_id] = {int(t) for t in batch.table_ids[live]}
    return held


def _alive(ms: Metastore) -> set[str]:
    return {c.capture_id for c in ms.captures.list_alive()}


def _need_alive(ms: Metastore, capture_id: str, what: str) -> set[str]:
    alive = _alive(ms)
    if capture_id not in alive:
        raise AdminError(
            f"capture {capture_id!r} is not alive (alive: {', '.join(sorted(alive)) or 'none'}); "
            f"{what}"
        )
    return alive


def draining(ms: Metastore) -> set[str]:
    """Captures with a drain request pending in some changefeed."""
    return {
        str(body.get("capture_id"))
        for requests in pending_requests(ms).values()
        for _, body in requests
        if body.get("op") == "drain_capture"
    }


def move_table(ms: Metastore, changefeed_id: str, table_id: int, capture_id: str) -> str:
    """Ask the owner to move ``table_id`` to ``capture_id`` (two-phase, no pause)."""
    ms.changefeeds.get(changefeed_id)  # ChangefeedNotFoundError names it
    _need_alive(ms, capture_id, "move the table to one of those")
    held = _tables_held(ms, changefeed_id)
    if held and not any(table_id in tables for tables in held.values()):
        raise AdminError(
            f"table {table_id} is not replicated by changefeed {changefeed_id!r}; "
            "`cdc-dagster changefeed query` lists its tables"
        )
    if table_id in held.get(capture_id, set()):
        raise AdminError(f"table {table_id} is already on capture {capture_id!r}; nothing to move")
    return _submit(ms, changefeed_id, {"op": "move_table", "table_id": table_id, "to": capture_id})


def drain_capture(ms: Metastore, capture_id: str, changefeed_id: str | None = None) -> list[str]:
    """Ask the owner to move every table off ``capture_id`` (in one changefeed, or in all).

    Refused when no capture that is not draining would be left to take the tables.
    """
    alive = _need_alive(ms, capture_id, "drain one of those")
    staying = alive - draining(ms) - {capture_id}
    if not staying:
        raise AdminError(
            f"capture {capture_id!r} is the last alive capture that is not draining (alive: "
            f"{', '.join(sorted(alive))}; draining: "
            f"{', '.join(sorted(draining(ms) & alive)) or 'none'}); add a capture before "
            "draining it (`cdc-dagster capture add NAME`)"
        )
    ids = [changefeed_id] if changefeed_id else [cf.changefeed_id for cf in ms.changefeeds.list()]
    for cf_id in ids:
        ms.changefeeds.get(cf_id)
    return [_submit(ms, cf_id, {"op": "drain_capture", "capture_id": capture_id}) for cf_id in ids]


def rebalance(ms: Metastore, changefeed_id: str) -> str:
    """Ask the owner to spread the changefeed's tables evenly over the alive captures."""
    ms.changefeeds.get(changefeed_id)
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


# ------------------------------------------------------------------------------ re-snapshots
@dataclass(frozen=True, slots=True)
class ResnapshotRequest:
    """A re-snapshot request written to etcd, for the CLI and the admin job to describe."""

    changefeed_id: str
    name: str  # database.table
    table_id: int
    key: str
    changefeed_state: str
    running: bool  # the changefeed's puller runs (normal or warning)

    def lines(self) -> list[str]:
        """What happens now, and where to watch it."""
        wait = (
            ""
            if self.running
            else f" (the changefeed is {self.changefeed_state}: the request waits until it "
            "is resumed)"
        )
        db, table = self.name.split(".", 1)
        return [
            f"re-snapshot of {self.name} (table id {self.table_id}) requested for changefeed "
            f"{self.changefeed_id}{wait}.",
            "The changefeed's mysql_puller run takes it within seconds: it truncates the table "
            "downstream at that binlog position and a mysql_snapshot run reads its rows again "
            "in key-range chunks, placed in the stream where each was read; the downstream "
            "keeps its current rows until every chunk is placed, then holds exactly the "
            "upstream's. The other tables replicate on.",
            f"Watch: `cdc-dagster changefeed query -c {self.changefeed_id}` (snapshots), or in "
            f"the Dagster UI the asset replica/{db}/{table} (snapshot_* observations) and the "
            "mysql_snapshot run's log.",
        ]


def _puller_state(cf: Changefeed) -> tuple[str, PullerState]:
    """A ``mysql://`` changefeed's change log and its puller state (AdminError if none)."""
    uri = cf.info.upstream_uri
    if not uri or not is_mysql_uri(uri):
        raise AdminError(
            f"changefeed {cf.changefeed_id!r} does not read a MySQL/MariaDB upstream "
            f"({redact_uri(uri) or 'no upstream URI'}); only mysql:// changefeeds snapshot "
            "their tables"
        )
    root = changelog_path(uri)
    try:
        state = load_state(root)
    except (OSError, ValueError, KeyError) as exc:
        raise AdminError(f"cannot read the puller state of {root}: {exc}") from None
    if state is None:
        raise AdminError(
            f"changefeed {cf.changefeed_id!r} has no puller state at {root} (run this where "
            "its change log is)"
        )
    return root, state


def request_resnapshot(ms: Metastore, changefeed_id: str, table: str) -> ResnapshotRequest:
    """Ask a ``mysql://`` changefeed to snapshot ``table`` (``database.table``) again, in
    chunks, replacing its downstream state (``cdc_dagster.mysql.resnapshot``); refused (and
    nothing written) for a table it does not replicate, one being snapshotted or one
    already requested."""
    cf = ms.changefeeds.get(changefeed_id)  # ChangefeedNotFoundError names it
    root, state = _puller_state(cf)
    parts = split_name(table)
    if parts is None:
        raise AdminError(f"table {table!r}: give it as DATABASE.TABLE")
    if state.flavor != "mariadb":
        raise AdminError(
            f"changefeed {changefeed_id!r} reads a MySQL upstream; a re-snapshot is "
            "implemented for MariaDB only (chunks read at its consistent-snapshot positions)"
        )
    tid = state.table_id(*parts)
    if tid is None:
        raise AdminError(_not_replicated(cf, state, table, parts))
    if tid in state.snapshots:
        p = next((p for p in snapshot_progress(root) if p.table_id == tid), None)
        shown = f" ({p.line()})" if p is not None else ""
        raise AdminError(
            f"table {table} of changefeed {changefeed_id!r} is being snapshotted already"
            f"{shown}; `cdc-dagster changefeed query -c {changefeed_id}` shows when it is "
            "complete; ask again after that if it still differs"
        )
    digest = hashlib.sha1(table.encode()).hexdigest()[:16]
    key = ms.layout.resnapshot_request(changefeed_id, digest)
    body = json.dumps({"database": parts[0], "table": parts[1], "table_id": tid}).encode()
    if not ms.client.txn([create_revision_is(key, 0)], [Put(key, body)]).succeeded:
        raise AdminError(
            f"a re-snapshot of {table} is already requested for changefeed {changefeed_id!r} "
            "and not yet taken by its puller run (it is taken while the changefeed is normal)"
        )
    state_now = cf.status.state
    return ResnapshotRequest(changefeed_id, table, tid, key, str(state_now), state_now.running)


def _not_replicated(cf: Changefeed, state: PullerState, table: str, parts: tuple[str, str]) -> str:
    """Why ``table`` cannot be re-snapshotted: skipped, outside the filter, or unknown."""
    cf_id = cf.changefeed_id
    if parts in state.skipped:
        return f"table {table} is not replicated by changefeed {cf_id!r}: {state.skipped[parts]}"
    if not TableFilter.parse(cf.info.table_filter).matches(*parts):
        return (
            f"table {table} is not in changefeed {cf_id!r}: its filter "
            f"{list(cf.info.table_filter)} does not select it"
        )
    names = sorted(s.qualified_name for s in state.tables.values())
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    return (
        f"changefeed {cf_id!r} replicates no table {table} (unknown upstream, or not joined "
        f"yet); it replicates {shown or 'no table'}"
    )


def resnapshot_requests(ms: Metastore, changefeed_id: str) -> dict[str, str]:
    """``database.table`` -> key, of the re-snapshot requests not taken yet (a malformed
    one is deleted, logged)."""
    out: dict[str, str] = {}
    for kv in ms.client.get_prefix(ms.layout.resnapshot_requests(changefeed_id)).kvs:
        try:
            body = json.loads(kv.value)
            out[f"{body['database']}.{body['table']}"] = kv.key
        except (ValueError, KeyError, TypeError) as exc:
            log.error("re-snapshot request %s is malformed (%s); deleting it", kv.key, exc)
            ms.client.delete(kv.key)
    return out


def snapshots_of(cf: Changefeed) -> list[SnapshotProgress]:
    """A ``mysql://`` changefeed's table snapshots in progress ([] for another changefeed,
    or when its change log is not readable here)."""
    if not is_mysql_uri(cf.info.upstream_uri):
        return []
    try:
        return snapshot_progress(changelog_path(cf.info.upstream_uri))
    except (UpstreamError, OSError, ValueError, KeyError):
        return []


# ------------------------------------------------------------------------------ captures
def add_capture(ms: Metastore, capture_id: str, ttl_s: int = DEFAULT_CAPTURE_TTL_S) -> str:
    """Ask for a capture (desired state: the owner registers it again whenever its lease
    expired, until it is removed) and register it now; returns its epoch."""
    if ttl_s < 5:
        raise AdminError(f"capture lease ttl {ttl_s}s is too short: use at least 5 s")
    current = ms.captures.get(capture_id)
    if current is not None and capture_id in ms.captures.desired():
        raise AdminError(f"capture {capture_id!r} is already registered")
    ms.captures.desire(capture_id, ttl_s)
    if current is not None:  # registered before captures were desired state: keep it
        return current.epoch
    return ms.captures.register(capture_id, ttl_s, keepalive=False).epoch


def ensure_captures(
    ms: Metastore, capture_ids: Sequence[str], ttl_s: int = DEFAULT_CAPTURE_TTL_S
) -> list[str]:
    """The captures a server or demo starts with: each desired (and registered) unless it
    already is; returns the ones this call added."""
    desired = ms.captures.desired()
    added = [c for c in capture_ids if c not in desired]
    for capture_id in added:
        add_capture(ms, capture_id, ttl_s)
    return added


def remove_capture(ms: Metastore, capture_id: str) -> None:
    """Deregister a capture that holds no tables (drain it first); it is no longer desired."""
    info = ms.captures.get(capture_id)
    if info is None:
        if capture_id in ms.captures.desired():  # its lease lapsed: just stop wanting it
            ms.captures.undesire(capture_id)
            return
        raise AdminError(f"capture {capture_id!r} is not registered")
    for cf in ms.changefeeds.list():
        tables = _tables_held(ms, cf.changefeed_id).get(capture_id, set())
        if tables:
            raise AdminError(
                f"capture {capture_id!r} still holds {len(tables)} table(s) of changefeed "
                f"{cf.changefeed_id!r}; drain it first (`cdc-dagster capture drain {capture_id}`)"
            )
    ms.captures.undesire(capture_id)
    ms.client.revoke_lease(int(info.epoch, 16))


# ------------------------------------------------------------------------------ changefeeds
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
    progress: Callable[[str, int, int], None] | None = None,
    checked: Callable[[Sequence[str]], None] | None = None,
) -> Changefeed:
    """Create a changefeed (everything checked first, the sink reached; nothing written on
    error). A ``mysql://`` upstream is checked and snapshotted first
    (:func:`create_mysql_changefeed`).
    """
    probe_sink(sink_uri)
    TableFilter.parse(table_filter)
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
    return ms.changefeeds.create(
        changefeed_id,
        sink_uri,
        table_filter=table_filter,
        start_ts=start_ts,
        target_ts=target_ts,
        sync_point_interval_s=sync_point_interval_s,
        upstream_uri=upstream_uri,
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
    progress: Callable[[str, int, int], None] | None = None,
    checked: Callable[[Sequence[str]], None] | None = None,
) -> Changefeed:
    """Check the upstream, take the initial snapshot into the changefeed's change log, and
    create the changefeed at the snapshot's start ts (docs/mysql-postgres.md).

    ``changelog_root`` is where the change log goes unless the URI names one (changelog=).
    Everything the metastore would refuse is checked before the snapshot; if the create
    fails after it, the snapshot is removed: nothing is left half-written.
    """
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
        shown = redact_uri(upstream_uri)
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


def update_changefeed(ms: Metastore, changefeed_id: str, **changes: Any) -> Changefeed:
    """Change a paused changefeed's config (``sink_uri``, ``table_filter``, ``target_ts``,
    ``sync_point_interval_s``)."""
    if not changes:
        raise AdminError(
            "nothing to update: give sink_uri, table_filter, target_ts or sync_point_interval_s"
        )
    if "sink_uri" in changes:
        probe_sink(changes["sink_uri"])
    return ms.changefeeds.update(changefeed_id, **changes)


def pause_changefeed(ms: Metastore, changefeed_id: str) -> ChangefeedStatus:
    """Stop replicating (every capture drops its tables; the config may then be updated)."""
    return ms.changefeeds.pause(changefeed_id)


def resume_changefeed(ms: Metastore, changefeed_id: str) -> ChangefeedStatus:
    """Replicate again from the checkpoint."""
    return ms.changefeeds.resume(changefeed_id)


REMOVE_WAIT_S = 15.0  # how long a remove waits for the changefeed's puller to stop


def wait_for_puller(root: Path, max_s: float | None = None, poll_s: float = 0.2) -> bool:
    """Wait while a binlog puller holds the change log ``root``'s lock (``puller.pulling``),
    at most ``max_s`` (``REMOVE_WAIT_S``); True once nothing holds it (or there is none)."""
    deadline = time.monotonic() + (REMOVE_WAIT_S if max_s is None else max_s)
    while pulling(root):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def remove_changefeed(
    ms: Metastore,
    changefeed_id: str,
    *,
    keep_state: bool = False,
    staging_root: Path | None = None,
) -> list[Path]:
    """Remove the changefeed: its tables stop, the downstream stays as it is. Unless
    ``keep_state``, what it kept on disk goes too: the change log its binlog puller wrote
    (with the puller's position) for a ``mysql://`` upstream, and its captures' staging
    under ``staging_root``. A ``changelog://`` upstream's log is another producer's: kept.
    The change log is removed once its binlog puller has stopped (``wait_for_puller``).
    Returns the directories removed."""
    info = ms.changefeeds.get(changefeed_id).info
    ms.changefeeds.remove(changefeed_id)
    if keep_state:
        return []
    dirs = [Path(changelog_path(info.upstream_uri))] if is_mysql_uri(info.upstream_uri) else []
    for root in dirs:
        # Its puller run sees the removal within a second and stops: its files deleted
        # under it, it failed instead (a `mysql_puller` run failed on every remove).
        if not wait_for_puller(root):
            log.warning(
                "changefeed %s: its binlog puller still holds %s after %.0f s; its change "
                "log is removed anyway (that run fails)",
                changefeed_id, lock_path(root), REMOVE_WAIT_S,
            )  # fmt: skip
    if staging_root is not None:
        dirs.append(Path(staging_root) / changefeed_id)
    removed = [d for d in dirs if d.is_dir()]
    for d in removed:
        shutil.rmtree(d, ignore_errors=True)
    return removed

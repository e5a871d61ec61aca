"""What the owner reads and writes in etcd each tick: one read, one guarded write.

The read is a single transaction of range reads, so the owner sees captures, changefeeds,
task statuses, DDL states and the GC safepoint at one revision. The write is a single
transaction guarded on the owner key, on the mod revision of every status it rewrites
(an admin may have paused the changefeed meanwhile) and, when it moves the GC safepoint,
on no changefeed having been created since the read (its start ts was checked against
the old safepoint).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from cdc_dagster.metastore.captures import CaptureInfo
from cdc_dagster.metastore.changefeeds import (
    Changefeed,
    ChangefeedState,
    encode_record,
    join_changefeeds,
)
from cdc_dagster.metastore.client import (
    Compare,
    EtcdClient,
    Get,
    Op,
    Put,
    mod_revision_is,
    prefix_unchanged_since,
)
from cdc_dagster.metastore.ddl_state import DdlState
from cdc_dagster.metastore.election import OwnerSession
from cdc_dagster.metastore.errors import ConflictError
from cdc_dagster.metastore.keys import KeyLayout
from cdc_dagster.metastore.status_codec import TaskStatus, decode

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OwnerSnapshot:
    """Everything the owner needs for one tick, read at ``revision``."""

    revision: int
    captures: Mapping[str, CaptureInfo]
    changefeeds: Mapping[str, Changefeed]
    tasks: Mapping[str, Mapping[str, TaskStatus]]  # changefeed id -> capture id -> status
    ddl: Mapping[str, DdlState]
    gc_safepoint: int


@dataclass(frozen=True, slots=True)
class ChangefeedProgress:
    """The checkpoint and resolved ts the owner computed for one changefeed this tick."""

    checkpoint_ts: int
    resolved_ts: int


@dataclass(frozen=True, slots=True)
class TickCommit:
    """What a committed tick wrote."""

    revision: int
    gc_safepoint: int
    keys_written: int
    attempts: int = 1
    changefeeds: Mapping[str, Changefeed] = field(default_factory=dict)


def read_owner_snapshot(
    client: EtcdClient, layout: KeyLayout, *, include_tasks: bool = True
) -> OwnerSnapshot:
    """One consistent read of the owner's whole tick input (one round trip)."""
    gets: list[Op] = [
        Get(layout.captures, prefix=True),
        Get(layout.changefeed_infos, prefix=True),
        Get(layout.changefeed_statuses, prefix=True),
        Get(layout.ddls, prefix=True),
        Get(layout.gc_safepoint),
    ]
    if include_tasks:
        gets.append(Get(layout.all_tasks, prefix=True))
    result = client.txn([], gets)
    captures, infos, statuses, ddls, gc, *rest = result.reads
    tasks: dict[str, dict[str, TaskStatus]] = {}
    for kv in rest[0] if rest else ():
        cf_id, capture_id = kv.key[len(layout.all_tasks) :].split("/", 1)
        tasks.setdefault(cf_id, {})[capture_id] = decode(kv.value)
    return OwnerSnapshot(
        revision=result.revision,
        captures=MappingProxyType(
            {c.capture_id: c for c in (CaptureInfo.decode(kv.value) for kv in captures)}
        ),
        changefeeds=MappingProxyType(
            {cf.changefeed_id: cf for cf in join_changefeeds(layout, infos, statuses)}
        ),
        tasks=MappingProxyType(tasks),
        ddl=MappingProxyType(
            {layout.last_segment(kv.key): DdlState.decode(kv.value) for kv in ddls}
        ),
        gc_safepoint=int(gc[0].value) if gc else 0,
    )


def gc_safepoint_for(changefeeds: Iterable[Changefeed], current: int) -> int:
    """The new GC safepoint: min checkpoint over changefeeds still to replicate, never lower."""
    holding = [
        cf.status.checkpoint_ts
        for cf in changefeeds
        if cf.status.state is not ChangefeedState.FINISHED
    ]
    if not holding:
        return current
    lowest = min(holding)
    if lowest < current:
        _log.warning("a checkpoint %d is below the GC safepoint %d; keeping it", lowest, current)
    return max(current, lowest)


def _advanced(cf: Changefeed, progress: ChangefeedProgress | None) -> Changefeed:
    if progress is None:
        return cf
    status = cf.status
    checkpoint = max(status.checkpoint_ts, progress.checkpoint_ts)
    resolved = max(status.resolved_ts, progress.resolved_ts, checkpoint)
    if (checkpoint, resolved) == (status.checkpoint_ts, status.resolved_ts):
        return cf
    new = dataclasses.replace(status, checkpoint_ts=checkpoint, resolved_ts=resolved)
    return dataclasses.replace(cf, status=new)


def _tick_ops(
    layout: KeyLayout,
    snapshot: OwnerSnapshot,
    progress: Mapping[str, ChangefeedProgress],
    ddl: Mapping[str, DdlState],
) -> tuple[list[Compare], list[Op], int, dict[str, Changefeed]]:
    write_id = uuid.uuid4().hex
    compares: list[Compare] = []
    ops: list[Op] = []
    after: dict[str, Changefeed] = {}
    for cf_id, cf in snapshot.changefeeds.items():
        new = after[cf_id] = _advanced(cf, progress.get(cf_id))
        if new is not cf:
            key = layout.changefeed_status(cf_id)
            compares.append(mod_revision_is(key, cf.status_revision))
            ops.append(Put(key, encode_record(new.status, write_id)))
    for cf_id, state in ddl.items():
        if cf_id in snapshot.changefeeds and snapshot.ddl.get(cf_id) != state:
            ops.append(Put(layout.ddl(cf_id), state.encode()))
    safepoint = gc_safepoint_for(after.values(), snapshot.gc_safepoint)
    if safepoint != snapshot.gc_safepoint:
        compares.append(prefix_unchanged_since(layout.changefeed_infos, snapshot.revision))
        ops.append(Put(layout.gc_safepoint, str(safepoint).encode()))
    return compares, ops, safepoint, after


def commit_owner_tick(
    session: OwnerSession,
    client: EtcdClient,
    layout: KeyLayout,
    snapshot: OwnerSnapshot,
    progress: Mapping[str, ChangefeedProgress],
    ddl: Mapping[str, DdlState] | None = None,
    *,
    max_attempts: int = 10,
) -> TickCommit:
    """Persist the tick's progress, DDL states and GC safepoint in one owner-guarded write.

    Checkpoints never go back (each is the max of the stored and the new one). On a
    conflict with an admin's change, re-reads (without task statuses) and tries again.
    Raises NotOwnerError if this session lost ownership.
    """
    ddl = ddl or {}
    for attempt in range(1, max_attempts + 1):
        compares, ops, safepoint, after = _tick_ops(layout, snapshot, progress, ddl)
        if not ops:
            return TickCommit(snapshot.revision, safepoint, 0, attempt, after)
        result = session.txn(compares, ops)
        if result.succeeded:
            written = {
                cf_id: cf
                if cf is snapshot.changefeeds[cf_id]
                else dataclasses.replace(cf, status_revision=result.revision)
                for cf_id, cf in after.items()
            }
            return TickCommit(result.revision, safepoint, len(ops), attempt, written)
        snapshot = dataclasses.replace(
            read_owner_snapshot(client, layout, include_tasks=False), tasks=snapshot.tasks
        )
    raise ConflictError(
        f"owner tick lost {max_attempts} compare-and-swaps in a row to concurrent admin changes"
    )

"""What the owner reads and writes in etcd each tick: one read, owner-guarded writes.

The read is a single transaction of range reads, so the owner sees captures, changefeeds,
task statuses, DDL states and the GC safepoint at one revision. With a
:class:`ConfigCache` it reads only the configs written since its last read (the others
come back as keys only, and are taken from the cache by mod revision).

One malformed value (a capture's task status or registration, a changefeed's record) is
dropped, logged and reported in the snapshot (``capture_errors`` / ``changefeed_errors``,
``dropped_reports``), so one bad writer cannot stop every changefeed's tick.

The write is split into transactions of at most :data:`MAX_TXN_OPS` operations (etcd
refuses more than 128 per transaction), each guarded on the owner key and, per changefeed,
on the mod revision of the status it rewrites (an admin may have paused the changefeed
meanwhile); a changefeed's status and DDL state are always in the same transaction. The GC
safepoint goes last, once every status it is computed from is written, guarded on no
changefeed having been created since the read (its start ts was checked against the old
safepoint).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from cdc_dagster.metastore.captures import CaptureInfo, desired_of
from cdc_dagster.metastore.changefeeds import (
    Changefeed,
    ChangefeedInfo,
    ChangefeedState,
    ChangefeedStatus,
    decode_info,
    decode_status,
    encode_record,
)
from cdc_dagster.metastore.client import (
    Compare,
    EtcdClient,
    Get,
    KeyValue,
    Op,
    Put,
    mod_revision_is,
    prefix_unchanged_since,
)
from cdc_dagster.metastore.ddl_state import DdlState
from cdc_dagster.metastore.election import OwnerSession
from cdc_dagster.metastore.errors import ConflictError, CorruptValueError
from cdc_dagster.metastore.keys import KeyLayout
from cdc_dagster.metastore.problems import Problem, problems_of
from cdc_dagster.metastore.status_codec import TaskStatus, decode

_log = logging.getLogger(__name__)

# etcd refuses a transaction of more than 128 compares or operations (--max-txn-ops); the
# owner guard takes one compare, so 100 changefeeds' compares and puts fit with room.
MAX_TXN_OPS = 100
# Below etcd's default --max-request-bytes (1.5 MiB) with room for the protobuf framing.
MAX_TXN_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class OwnerSnapshot:
    """Everything the owner needs for one tick, read at ``revision``.

    ``capture_errors`` / ``changefeed_errors`` hold why a capture's report (or a
    changefeed's record) was dropped from this snapshot; ``dropped_reports`` counts them.
    """

    revision: int
    captures: Mapping[str, CaptureInfo]
    changefeeds: Mapping[str, Changefeed]
    tasks: Mapping[str, Mapping[str, TaskStatus]]  # changefeed id -> capture id -> status
    ddl: Mapping[str, DdlState]
    gc_safepoint: int
    capture_errors: Mapping[str, str] = field(default_factory=dict)
    changefeed_errors: Mapping[str, str] = field(default_factory=dict)
    dropped_reports: int = 0
    # changefeed id -> source -> what keeps it from moving (metastore/problems.py)
    problems: Mapping[str, Mapping[str, Problem]] = field(default_factory=dict)
    desired: Mapping[str, int] = field(default_factory=dict)  # capture id -> lease TTL


@dataclass(frozen=True, slots=True)
class ChangefeedProgress:
    """The checkpoint and resolved ts the owner computed for one changefeed this tick, and
    its health: a message when something keeps it from moving (its state becomes warning,
    or failed with ``failed``), None when it is well (normal)."""

    checkpoint_ts: int
    resolved_ts: int
    problem: str | None = None
    failed: bool = False
    now_ms: int = 0  # the owner's clock for ``warning_since_ms``


@dataclass(frozen=True, slots=True)
class TickCommit:
    """What a committed tick wrote (``transactions``: how many guarded writes it took)."""

    revision: int
    gc_safepoint: int
    keys_written: int
    attempts: int = 1
    changefeeds: Mapping[str, Changefeed] = field(default_factory=dict)
    transactions: int = 0


class ConfigCache:
    """The changefeed configs an owner already decoded, by key and mod revision.

    An explicit, rebuildable cache (a fresh one just reads every config once): pass the
    same instance to each :func:`read_owner_snapshot` of one owner process.
    """

    def __init__(self) -> None:
        self.revision = 0
        self.decoded = 0  # configs decoded so far (what the cache saves is visible in tests)
        self._infos: dict[str, tuple[int, ChangefeedInfo, str]] = {}

    def reset(self) -> None:
        """Forget everything (the next read decodes every config)."""
        self.revision = 0
        self._infos = {}

    def lookup(self, key: str, mod_revision: int) -> tuple[ChangefeedInfo, str] | None:
        """The cached config of ``key`` if it is the one written at ``mod_revision``."""
        hit = self._infos.get(key)
        return (hit[1], hit[2]) if hit is not None and hit[0] == mod_revision else None

    def replace(
        self, revision: int, infos: Mapping[str, tuple[int, ChangefeedInfo, str]], decoded: int
    ) -> None:
        """Hold exactly ``infos`` (key -> mod revision, config, write id) as of ``revision``."""
        self.revision = revision
        self.decoded += decoded
        self._infos = dict(infos)


class _Drops:
    def __init__(self) -> None:
        self.captures: dict[str, str] = {}
        self.changefeeds: dict[str, str] = {}
        self.count = 0

    def capture(self, capture_id: str, why: str) -> None:
        _log.warning("dropping a report of capture %s: %s", capture_id, why)
        self.captures[capture_id] = why
        self.count += 1

    def changefeed(self, changefeed_id: str, why: str) -> None:
        _log.warning("dropping changefeed %s from this tick: %s", changefeed_id, why)
        self.changefeeds[changefeed_id] = why
        self.count += 1


def read_owner_snapshot(
    client: EtcdClient,
    layout: KeyLayout,
    *,
    include_tasks: bool = True,
    cache: ConfigCache | None = None,
) -> OwnerSnapshot:
    """One consistent read of the owner's whole tick input (one round trip).

    A ``cache`` that does not match etcd (another etcd, restored data) is reset and the
    read repeated once in full.
    """
    try:
        return _read_owner_snapshot(client, layout, include_tasks, cache)
    except _CacheMissError as miss:
        assert cache is not None
        _log.warning("config cache out of step with etcd (%s); reading every config", miss)
        cache.reset()
        return _read_owner_snapshot(client, layout, include_tasks, cache)


class _CacheMissError(Exception):
    pass


def _read_owner_snapshot(
    client: EtcdClient, layout: KeyLayout, include_tasks: bool, cache: ConfigCache | None
) -> OwnerSnapshot:
    since = cache.revision if cache is not None else 0
    infos = layout.changefeed_infos
    gets: list[Op] = [
        Get(layout.captures, prefix=True),
        Get(infos, prefix=True, keys_only=since > 0),
        Get(infos, prefix=True, min_mod_revision=since + 1) if since else Get(layout.owner),
        Get(layout.changefeed_statuses, prefix=True),
        Get(layout.ddls, prefix=True),
        Get(layout.gc_safepoint),
    ]
    gets.append(Get(layout.problems(), prefix=True))
    gets.append(Get(layout.desired_captures, prefix=True))
    if include_tasks:
        gets.append(Get(layout.all_tasks, prefix=True))
    result = client.txn([], gets)
    captures, listed, changed, statuses, ddls, gc, problems, desired, *rest = result.reads
    drops = _Drops()
    configs = _configs(layout, listed, changed if since else listed, cache, result.revision)
    changefeeds = _changefeeds(layout, configs, statuses, drops)
    return OwnerSnapshot(
        revision=result.revision,
        captures=MappingProxyType(_captures(layout, captures, drops)),
        changefeeds=MappingProxyType(changefeeds),
        tasks=MappingProxyType(_tasks(layout, rest[0] if rest else (), drops)),
        ddl=MappingProxyType(_ddls(layout, ddls, changefeeds, drops)),
        gc_safepoint=int(gc[0].value) if gc else 0,
        capture_errors=MappingProxyType(drops.captures),
        changefeed_errors=MappingProxyType(drops.changefeeds),
        dropped_reports=drops.count,
        problems=MappingProxyType(problems_of(layout, list(problems))),
        desired=MappingProxyType(desired_of(layout, desired)),
    )


def _configs(
    layout: KeyLayout,
    listed: Sequence[KeyValue],
    changed: Sequence[KeyValue],
    cache: ConfigCache | None,
    revision: int,
) -> dict[str, tuple[int, ChangefeedInfo, str] | CorruptValueError]:
    fresh = {kv.key: kv for kv in changed}
    out: dict[str, tuple[int, ChangefeedInfo, str] | CorruptValueError] = {}
    decoded = 0
    for kv in listed:
        hit = cache.lookup(kv.key, kv.mod_revision) if cache is not None else None
        if hit is None:
            full = fresh.get(kv.key)
            if full is None:  # not in the cache nor written since: the cache is not ours
                raise _CacheMissError(f"no entry for {kv.key} at revision {kv.mod_revision}")
            try:
                hit = decode_info(full)
                decoded += 1
            except CorruptValueError as exc:
                out[layout.last_segment(kv.key)] = exc
                continue
        out[layout.last_segment(kv.key)] = (kv.mod_revision, *hit)
    if cache is not None:
        good = {
            layout.changefeed_info(cf_id): v
            for cf_id, v in out.items()
            if not isinstance(v, CorruptValueError)
        }
        cache.replace(revision, good, decoded)
    return out


def _captures(layout: KeyLayout, kvs: Sequence[KeyValue], drops: _Drops) -> dict[str, CaptureInfo]:
    out = {}
    for kv in kvs:
        try:
            info = CaptureInfo.decode(kv.value)
        except CorruptValueError as exc:
            drops.capture(layout.last_segment(kv.key), f"registration: {exc}")
            continue
        out[info.capture_id] = info
    return out


def _changefeeds(
    layout: KeyLayout,
    configs: Mapping[str, tuple[int, ChangefeedInfo, str] | CorruptValueError],
    statuses: Sequence[KeyValue],
    drops: _Drops,
) -> dict[str, Changefeed]:
    out = {}
    for kv in statuses:
        cf_id = layout.last_segment(kv.key)
        config = configs.get(cf_id)
        if config is None:
            continue  # created or removed half-way: only one of its two keys exists
        try:
            if isinstance(config, CorruptValueError):
                raise config
            status, w_status = decode_status(kv)
        except CorruptValueError as exc:
            drops.changefeed(cf_id, str(exc))
            continue
        info_revision, info, w_info = config
        out[cf_id] = Changefeed(
            info, status, info_revision, kv.mod_revision, frozenset({w_info, w_status})
        )
    return out


def _ddls(
    layout: KeyLayout, kvs: Sequence[KeyValue], changefeeds: dict[str, Changefeed], drops: _Drops
) -> dict[str, DdlState]:
    """DDL states; a changefeed whose state does not decode leaves the tick (never reset)."""
    out = {}
    for kv in kvs:
        cf_id = layout.last_segment(kv.key)
        try:
            out[cf_id] = DdlState.decode(kv.value)
        except CorruptValueError as exc:
            drops.changefeed(cf_id, f"DDL state: {exc}")
            changefeeds.pop(cf_id, None)
    return out


def _tasks(
    layout: KeyLayout, kvs: Iterable[KeyValue], drops: _Drops
) -> dict[str, dict[str, TaskStatus]]:
    tasks: dict[str, dict[str, TaskStatus]] = {}
    for kv in kvs:
        cf_id, capture_id = kv.key[len(layout.all_tasks) :].split("/", 1)
        try:
            status = decode(kv.value)
        except CorruptValueError as exc:
            drops.capture(capture_id, f"task status of changefeed {cf_id}: {exc}")
            continue
        tasks.setdefault(cf_id, {})[capture_id] = status
    return tasks


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
    new = dataclasses.replace(
        _health(status, progress), checkpoint_ts=checkpoint, resolved_ts=resolved
    )
    return cf if new == status else dataclasses.replace(cf, status=new)


def _health(status: ChangefeedStatus, progress: ChangefeedProgress) -> ChangefeedStatus:
    """The state the owner's view of the changefeed's health gives it. Only a running
    changefeed (normal, warning) changes: an admin's pause and a failure stay as they are."""
    if not status.state.running:
        return status
    if progress.problem is None:
        return dataclasses.replace(
            status, state=ChangefeedState.NORMAL, last_error="", warning_since_ms=0
        )
    since = status.warning_since_ms or progress.now_ms
    state = ChangefeedState.FAILED if progress.failed else ChangefeedState.WARNING
    return dataclasses.replace(
        status, state=state, last_error=progress.problem, warning_since_ms=since
    )


@dataclass(frozen=True, slots=True)
class _Write:
    """One changefeed's part of the tick: written together, in one transaction."""

    changefeed_id: str
    compares: tuple[Compare, ...]
    puts: tuple[Put, ...]

    @property
    def size(self) -> int:
        return sum(len(p.key) + len(p.value) + 16 for p in self.puts) + 64 * len(self.compares)


def _tick_writes(
    layout: KeyLayout,
    snapshot: OwnerSnapshot,
    progress: Mapping[str, ChangefeedProgress],
    ddl: Mapping[str, DdlState],
) -> tuple[list[_Write], dict[str, Changefeed]]:
    write_id = uuid.uuid4().hex
    writes: list[_Write] = []
    after: dict[str, Changefeed] = {}
    for cf_id, cf in snapshot.changefeeds.items():
        new = after[cf_id] = _advanced(cf, progress.get(cf_id))
        compares: list[Compare] = []
        puts: list[Put] = []
        if new is not cf:
            key = layout.changefeed_status(cf_id)
            compares.append(mod_revision_is(key, cf.status_revision))
            puts.append(Put(key, encode_record(new.status, write_id)))
        state = ddl.get(cf_id)
        if state is not None and snapshot.ddl.get(cf_id) != state:
            puts.append(Put(layout.ddl(cf_id), state.encode()))
        if puts:
            writes.append(_Write(cf_id, tuple(compares), tuple(puts)))
    return writes, after


def _batches(writes: Sequence[_Write]) -> list[list[_Write]]:
    """Group whole changefeeds into transactions within etcd's op and size limits."""
    batches: list[list[_Write]] = []
    ops = size = 0
    for write in writes:
        n = max(len(write.compares), len(write.puts))
        if batches and (ops + n > MAX_TXN_OPS or size + write.size > MAX_TXN_BYTES):
            batches.append([])
            ops = size = 0
        if not batches:
            batches.append([])
        batches[-1].append(write)
        ops += n
        size += write.size
    return batches


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
    """Persist the tick's progress, DDL states and GC safepoint in owner-guarded writes.

    Checkpoints never go back (each is the max of the stored and the new one). Any number
    of changefeeds fits (several transactions, each owner-guarded). On a conflict with an
    admin's change, re-reads (without task statuses) and writes what is still missing.
    Raises NotOwnerError if this session lost ownership; nothing is written after that.
    """
    ddl = ddl or {}
    transactions = written = 0
    for attempt in range(1, max_attempts + 1):
        writes, after = _tick_writes(layout, snapshot, progress, ddl)
        revisions: dict[str, int] = {}
        revision = snapshot.revision
        conflict = False
        for batch in _batches(writes):
            compares = [c for w in batch for c in w.compares]
            puts = [p for w in batch for p in w.puts]
            result = session.txn(compares, puts)
            transactions += 1
            if not result.succeeded:
                conflict = True
                break
            revision = result.revision
            written += len(puts)
            revisions.update((w.changefeed_id, revision) for w in batch if w.compares)
        safepoint = gc_safepoint_for(after.values(), snapshot.gc_safepoint)
        if not conflict and safepoint != snapshot.gc_safepoint:
            result = session.txn(
                [prefix_unchanged_since(layout.changefeed_infos, snapshot.revision)],
                [Put(layout.gc_safepoint, str(safepoint).encode())],
            )
            transactions += 1
            conflict = not result.succeeded
            if result.succeeded:
                revision, written = result.revision, written + 1
        if not conflict:
            final = {
                cf_id: dataclasses.replace(cf, status_revision=revisions[cf_id])
                if cf_id in revisions
                else cf
                for cf_id, cf in after.items()
            }
            return TickCommit(revision, safepoint, written, attempt, final, transactions)
        snapshot = dataclasses.replace(
            read_owner_snapshot(client, layout, include_tasks=False), tasks=snapshot.tasks
        )
    raise ConflictError(
        f"owner tick lost {max_attempts} compare-and-swaps in a row to concurrent admin changes"
    )

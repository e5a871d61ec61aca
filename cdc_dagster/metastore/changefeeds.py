"""Changefeeds in etcd: config (info) and progress (status), changed only by compare-and-swap.

Every change reads the info and status keys, computes the new record, and writes it in a
transaction that compares both keys' mod revisions with what it read; on a conflict it
reads again and recomputes, so concurrent admins and the owner never lose each other's
writes. Each write stamps a fresh write id into the value, so a retry after an ambiguous
failure (the first attempt landed but its reply was lost) recognises its own write
instead of applying the change twice.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cdc_dagster.metastore.client import (
    Compare,
    Delete,
    EtcdClient,
    Get,
    KeyValue,
    Op,
    Put,
    TxnResult,
    create_revision_is,
    mod_revision_is,
)
from cdc_dagster.metastore.errors import (
    ChangefeedExistsError,
    ChangefeedNotFoundError,
    ChangefeedStateError,
    ConflictError,
    CorruptValueError,
    InvalidTsError,
    MetastoreError,
)
from cdc_dagster.metastore.keys import KeyLayout
from cdc_dagster.metastore.validation import (
    TableFilter,
    check_ts,
    validate_changefeed_id,
    validate_start_ts,
    validate_sync_point_interval,
    validate_target_ts,
)
from cdc_dagster.secrets import redact_bytes, redact_text, redact_uri
from cdc_dagster.sinks.uri import validate_sink_uri
from scheduler_core.ts import compose

TxnRunner = Callable[[Sequence[Compare], Sequence[Op], Sequence[Op]], TxnResult]


def wall_ms() -> int:
    """Milliseconds since the Unix epoch (the default clock)."""
    return time.time_ns() // 1_000_000


class ChangefeedState(enum.StrEnum):
    """A changefeed's lifecycle state (TiCDC's names)."""

    NORMAL = "normal"  # replicating
    WARNING = "warning"  # replicating, but something keeps it from moving (last_error); retried
    FAILED = "failed"  # stopped: unrecoverable, or a warning that lasted too long; resume it
    STOPPED = "stopped"  # paused by an admin; its config may be updated
    FINISHED = "finished"  # reached target_ts; nothing more to replicate

    @classmethod
    def _missing_(cls, value: object) -> ChangefeedState | None:
        return cls.FAILED if value == "error" else None  # records of earlier versions

    @property
    def running(self) -> bool:
        """The owner schedules its tables (normal, or warning: retried)."""
        return self in (ChangefeedState.NORMAL, ChangefeedState.WARNING)


@dataclass(frozen=True, slots=True)
class ChangefeedInfo:
    """A changefeed's configuration; validated on construction."""

    changefeed_id: str
    sink_uri: str
    table_filter: tuple[str, ...]
    start_ts: int
    target_ts: int = 0  # 0: no end
    sync_point_interval_s: int = 0  # 0: no syncpoints
    # Where the change log lives: changelog:///abs/path (embedded upstream); "" when unset
    # (records written before the field existed read as "").
    upstream_uri: str = ""

    def __post_init__(self) -> None:
        validate_changefeed_id(self.changefeed_id)
        if not isinstance(self.upstream_uri, str):
            raise ValueError(f"upstream_uri must be a str, got {self.upstream_uri!r}")
        validate_sink_uri(self.sink_uri)
        object.__setattr__(self, "table_filter", tuple(self.table_filter))
        TableFilter.parse(self.table_filter)
        check_ts("start_ts", self.start_ts)
        validate_target_ts(self.target_ts, self.start_ts)
        validate_sync_point_interval(self.sync_point_interval_s)

    def __repr__(self) -> str:  # the sink URI may hold a literal password
        return (
            f"ChangefeedInfo(changefeed_id={self.changefeed_id!r}, "
            f"sink_uri={redact_uri(self.sink_uri)!r}, table_filter={self.table_filter!r}, "
            f"start_ts={self.start_ts!r}, target_ts={self.target_ts!r}, "
            f"sync_point_interval_s={self.sync_point_interval_s!r})"
        )

    @property
    def filter(self) -> TableFilter:
        """The parsed table filter."""
        return TableFilter.parse(self.table_filter)


@dataclass(frozen=True, slots=True)
class ChangefeedStatus:
    """A changefeed's progress and state."""

    checkpoint_ts: int
    resolved_ts: int
    state: ChangefeedState
    epoch: int  # bumps when the changefeed is created or resumed (a TS, like TiCDC's)
    last_error: str = ""  # the whole message of a warning or failure; "" when normal
    warning_since_ms: int = 0  # when the current warning began (failed after too long)

    def __post_init__(self) -> None:
        check_ts("checkpoint_ts", self.checkpoint_ts)
        check_ts("resolved_ts", self.resolved_ts)
        check_ts("epoch", self.epoch)
        object.__setattr__(self, "state", ChangefeedState(self.state))
        if self.checkpoint_ts > self.resolved_ts:
            raise InvalidTsError(
                f"checkpoint_ts {self.checkpoint_ts} > resolved_ts {self.resolved_ts}: a "
                "checkpoint is never ahead of the resolved ts"
            )


@dataclass(frozen=True, slots=True)
class Changefeed:
    """A changefeed as read: info, status, and the mod revisions a CAS compares against."""

    info: ChangefeedInfo
    status: ChangefeedStatus
    info_revision: int
    status_revision: int
    write_ids: frozenset[str] = frozenset()

    @property
    def changefeed_id(self) -> str:
        """The changefeed's id."""
        return self.info.changefeed_id


def encode_record(record: ChangefeedInfo | ChangefeedStatus, write_id: str) -> bytes:
    """JSON with a format version and the write id."""
    fields = dataclasses.asdict(record)
    return json.dumps({"v": 1, "w": write_id, **fields}, separators=(",", ":")).encode()


def _decode_record(cls: type[Any], kv: KeyValue) -> tuple[Any, str]:
    try:
        raw = json.loads(kv.value)
        if raw.pop("v") != 1:
            raise ValueError("unknown format version")
        write_id = str(raw.pop("w"))
        if "table_filter" in raw:
            raw["table_filter"] = tuple(raw["table_filter"])
        return cls(**raw), write_id
    except (ValueError, KeyError, TypeError, MetastoreError) as exc:
        excerpt = redact_bytes(kv.value[:120])
        raise CorruptValueError(f"{kv.key} holds {excerpt}: {redact_text(str(exc))}") from exc


def decode_info(kv: KeyValue) -> tuple[ChangefeedInfo, str]:
    """A changefeed config and its write id (CorruptValueError if it does not decode)."""
    info, write_id = _decode_record(ChangefeedInfo, kv)
    return info, write_id


def decode_status(kv: KeyValue) -> tuple[ChangefeedStatus, str]:
    """A changefeed status and its write id (CorruptValueError if it does not decode)."""
    status, write_id = _decode_record(ChangefeedStatus, kv)
    return status, write_id


def decode_changefeed(info_kv: KeyValue, status_kv: KeyValue) -> Changefeed:
    """Build a :class:`Changefeed` from its two keys."""
    info, w_info = _decode_record(ChangefeedInfo, info_kv)
    status, w_status = _decode_record(ChangefeedStatus, status_kv)
    return Changefeed(
        info, status, info_kv.mod_revision, status_kv.mod_revision, frozenset({w_info, w_status})
    )


Change = Callable[[Changefeed], tuple[ChangefeedInfo | None, ChangefeedStatus | None]]


class ChangefeedStore:
    """Create, query, update, pause, resume and remove changefeeds."""

    def __init__(
        self,
        client: EtcdClient,
        layout: KeyLayout,
        *,
        now_ms: Callable[[], int] = wall_ms,
        max_attempts: int = 100,
    ) -> None:
        self._client = client
        self._layout = layout
        self._now_ms = now_ms
        self._max_attempts = max_attempts

    # --- create ----------------------------------------------------------------------

    def create(
        self,
        changefeed_id: str,
        sink_uri: str,
        *,
        table_filter: Sequence[str] = ("*.*",),
        start_ts: int | None = None,
        target_ts: int = 0,
        sync_point_interval_s: int = 0,
        upstream_uri: str = "",
    ) -> Changefeed:
        """Create a changefeed starting at ``start_ts`` (default: now); nothing is written on error."""
        validate_changefeed_id(changefeed_id)
        validate_sink_uri(sink_uri)
        TableFilter.parse(table_filter)
        validate_sync_point_interval(sync_point_interval_s)
        gc_key = self._layout.gc_safepoint
        for _ in range(self._max_attempts):
            gc_kv = self._client.get(gc_key)
            now = self._now_ms()
            start = compose(now) if start_ts is None else start_ts
            validate_start_ts(start, int(gc_kv.value) if gc_kv else 0, now)
            validate_target_ts(target_ts, start)
            info = ChangefeedInfo(
                changefeed_id,
                sink_uri,
                tuple(table_filter),
                start,
                target_ts,
                sync_point_interval_s,
                upstream_uri,
            )
            status = ChangefeedStatus(start, start, ChangefeedState.NORMAL, epoch=compose(now))
            created = self._try_create(info, status, gc_kv.mod_revision if gc_kv else 0)
            if created is not None:
                return created
        raise ConflictError(
            f"creating changefeed {changefeed_id!r} kept racing GC safepoint updates "
            f"({self._max_attempts} attempts); try again"
        )

    def _try_create(
        self, info: ChangefeedInfo, status: ChangefeedStatus, gc_mod_revision: int
    ) -> Changefeed | None:
        info_key = self._layout.changefeed_info(info.changefeed_id)
        status_key = self._layout.changefeed_status(info.changefeed_id)
        write_id = uuid.uuid4().hex
        result = self._client.txn(
            [
                create_revision_is(info_key, 0),
                create_revision_is(status_key, 0),
                # The start ts was checked against this safepoint; it must not have moved.
                mod_revision_is(self._layout.gc_safepoint, gc_mod_revision),
            ],
            [
                Put(info_key, encode_record(info, write_id)),
                Put(status_key, encode_record(status, write_id)),
            ],
            [Get(info_key)],
        )
        if result.succeeded:
            return Changefeed(info, status, result.revision, result.revision, frozenset({write_id}))
        if result.reads[0]:
            existing, existing_write = _decode_record(ChangefeedInfo, result.reads[0][0])
            if existing_write == write_id:
                return self.get(info.changefeed_id)
            raise ChangefeedExistsError(
                f"changefeed {info.changefeed_id!r} already exists "
                f"(sink {redact_uri(existing.sink_uri)}); "
                "remove it first or pick another id"
            )
        return None

    # --- query -----------------------------------------------------------------------

    def get(self, changefeed_id: str) -> Changefeed:
        """The changefeed, or ChangefeedNotFoundError."""
        info_key = self._layout.changefeed_info(changefeed_id)
        status_key = self._layout.changefeed_status(changefeed_id)
        result = self._client.txn([], [Get(info_key), Get(status_key)])
        infos, statuses = result.reads
        if not infos or not statuses:
            raise ChangefeedNotFoundError(
                f"no changefeed {changefeed_id!r} in cluster {self._layout.cluster_id!r}; "
                "list them to see which exist"
            )
        return decode_changefeed(infos[0], statuses[0])

    def list(self) -> list[Changefeed]:
        """Every changefeed, by id, read at one revision."""
        result = self._client.txn(
            [],
            [
                Get(self._layout.changefeed_infos, prefix=True),
                Get(self._layout.changefeed_statuses, prefix=True),
            ],
        )
        return join_changefeeds(self._layout, result.reads[0], result.reads[1])

    # --- changes ---------------------------------------------------------------------

    def modify(
        self, changefeed_id: str, change: Change, runner: TxnRunner | None = None
    ) -> Changefeed:
        """Apply ``change`` by compare-and-swap, re-reading and retrying on conflicts.

        ``change`` returns the new info and/or status (None: leave it); it may raise to
        refuse, and then nothing is written. ``runner`` runs the transaction (the owner
        passes its guarded ``txn``).
        """
        run = runner or self._client.txn
        tried: set[str] = set()
        for _ in range(self._max_attempts):
            current = self.get(changefeed_id)
            if current.write_ids & tried:
                return current  # an earlier attempt landed although its reply was lost
            new_info, new_status = change(current)
            if new_info is None and new_status is None:
                return current
            write_id = uuid.uuid4().hex
            tried.add(write_id)
            written = self._try_swap(current, new_info, new_status, write_id, run)
            if written is not None:
                return written
        raise ConflictError(
            f"changefeed {changefeed_id!r} changed under {self._max_attempts} attempts in a row; "
            "try again"
        )

    def _try_swap(
        self,
        current: Changefeed,
        new_info: ChangefeedInfo | None,
        new_status: ChangefeedStatus | None,
        write_id: str,
        run: TxnRunner,
    ) -> Changefeed | None:
        info_key = self._layout.changefeed_info(current.changefeed_id)
        status_key = self._layout.changefeed_status(current.changefeed_id)
        puts: list[Op] = []
        if new_info is not None:
            puts.append(Put(info_key, encode_record(new_info, write_id)))
        if new_status is not None:
            puts.append(Put(status_key, encode_record(new_status, write_id)))
        result = run(
            [
                mod_revision_is(info_key, current.info_revision),
                mod_revision_is(status_key, current.status_revision),
            ],
            puts,
            [],
        )
        if not result.succeeded:
            return None
        return Changefeed(
            new_info or current.info,
            new_status or current.status,
            result.revision if new_info else current.info_revision,
            result.revision if new_status else current.status_revision,
            frozenset({write_id}),
        )

    def update_info(
        self, changefeed_id: str, change: Callable[[ChangefeedInfo], ChangefeedInfo]
    ) -> ChangefeedInfo:
        """Change the config of a stopped changefeed (like TiCDC, a running one is refused)."""

        def apply(current: Changefeed) -> tuple[ChangefeedInfo, None]:
            if current.status.state is not ChangefeedState.STOPPED:
                raise ChangefeedStateError(
                    f"changefeed {changefeed_id!r} is {current.status.state}; only a stopped "
                    "changefeed can be updated: pause it first"
                )
            new = change(current.info)
            if new.changefeed_id != changefeed_id or new.start_ts != current.info.start_ts:
                raise ChangefeedStateError(
                    f"changefeed {changefeed_id!r}: the id and start_ts cannot be updated; "
                    "create a new changefeed instead"
                )
            return new, None

        return self.modify(changefeed_id, apply).info

    def update(
        self,
        changefeed_id: str,
        *,
        sink_uri: str | None = None,
        table_filter: Sequence[str] | None = None,
        target_ts: int | None = None,
        sync_point_interval_s: int | None = None,
    ) -> ChangefeedInfo:
        """Set the given fields of a stopped changefeed's config."""
        changes: dict[str, Any] = {
            k: v
            for k, v in {
                "sink_uri": sink_uri,
                "table_filter": tuple(table_filter) if table_filter is not None else None,
                "target_ts": target_ts,
                "sync_point_interval_s": sync_point_interval_s,
            }.items()
            if v is not None
        }
        return self.update_info(changefeed_id, lambda info: dataclasses.replace(info, **changes))

    def update_status(
        self,
        changefeed_id: str,
        change: Callable[[ChangefeedStatus], ChangefeedStatus | None],
        runner: TxnRunner | None = None,
    ) -> ChangefeedStatus:
        """Compare-and-swap the status alone (``change`` returns None to leave it)."""
        return self.modify(changefeed_id, lambda cf: (None, change(cf.status)), runner).status

    def pause(self, changefeed_id: str) -> ChangefeedStatus:
        """Stop replicating (normal or error -> stopped); pausing a stopped one is a no-op."""
        return self.update_status(changefeed_id, _paused(changefeed_id))

    def resume(self, changefeed_id: str) -> ChangefeedStatus:
        """Replicate again (stopped or error -> normal) under a new changefeed epoch."""
        return self.update_status(changefeed_id, _resumed(changefeed_id, self._now_ms))

    def remove(self, changefeed_id: str) -> None:
        """Delete the changefeed with everything etcd holds for it: status, DDL state, task
        statuses, Agent states, pending admin and re-snapshot requests, DDL and syncpoint
        markers, problems."""
        for _ in range(self._max_attempts):
            current = self.get(changefeed_id)
            info_key = self._layout.changefeed_info(changefeed_id)
            result = self._client.txn(
                [mod_revision_is(info_key, current.info_revision)],
                [
                    Delete(info_key),
                    Delete(self._layout.changefeed_status(changefeed_id)),
                    Delete(self._layout.ddl(changefeed_id)),
                    Delete(self._layout.tasks(changefeed_id), prefix=True),
                    Delete(self._layout.agent_states(changefeed_id), prefix=True),
                    Delete(self._layout.admin_requests(changefeed_id), prefix=True),
                    Delete(self._layout.resnapshot_requests(changefeed_id), prefix=True),
                    Delete(self._layout.applied(changefeed_id), prefix=True),
                    Delete(self._layout.problems(changefeed_id), prefix=True),
                ],
            )
            if result.succeeded:
                return
        raise ConflictError(f"changefeed {changefeed_id!r} kept changing while being removed")


def _paused(changefeed_id: str) -> Callable[[ChangefeedStatus], ChangefeedStatus | None]:
    def change(status: ChangefeedStatus) -> ChangefeedStatus | None:
        if status.state is ChangefeedState.STOPPED:
            return None
        if status.state is ChangefeedState.FINISHED:
            raise ChangefeedStateError(
                f"changefeed {changefeed_id!r} is finished; there is nothing to pause"
            )
        return dataclasses.replace(status, state=ChangefeedState.STOPPED)

    return change


def _resumed(
    changefeed_id: str, now_ms: Callable[[], int]
) -> Callable[[ChangefeedStatus], ChangefeedStatus | None]:
    def change(status: ChangefeedStatus) -> ChangefeedStatus | None:
        if status.state.running:
            return None
        if status.state is ChangefeedState.FINISHED:
            raise ChangefeedStateError(
                f"changefeed {changefeed_id!r} is finished; update its target_ts while stopped "
                "or create a new one"
            )
        epoch = max(compose(now_ms()), status.epoch + 1)
        return dataclasses.replace(
            status, state=ChangefeedState.NORMAL, epoch=epoch, last_error="", warning_since_ms=0
        )

    return change


def join_changefeeds(
    layout: KeyLayout, infos: Sequence[KeyValue], statuses: Sequence[KeyValue]
) -> list[Changefeed]:
    """Pair info and status keys by changefeed id (ids with only one of them are skipped)."""
    by_id = {layout.last_segment(kv.key): kv for kv in statuses}
    return [
        decode_changefeed(kv, by_id[layout.last_segment(kv.key)])
        for kv in infos
        if layout.last_segment(kv.key) in by_id
    ]

"""One job per admin operation; each is one op over :mod:`cdc_dagster.admin`."""

from collections.abc import Callable
from typing import Any

import dagster as dg

from cdc_dagster import admin
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.secrets import redact_text


class ChangefeedConfig(dg.Config):
    """A changefeed by id."""

    changefeed_id: str


class CreateChangefeedConfig(dg.Config):
    """A new changefeed (``sink_uri`` may hold ``${ENV}`` references)."""

    changefeed_id: str
    sink_uri: str
    upstream_uri: str = ""
    table_filter: list[str] = ["*.*"]
    start_ts: int = 0  # 0: now
    target_ts: int = 0
    sync_point_interval_s: int = 0


class UpdateChangefeedConfig(dg.Config):
    """Fields to change on a paused changefeed (empty / negative: leave)."""

    changefeed_id: str
    sink_uri: str = ""
    table_filter: list[str] = []
    target_ts: int = -1
    sync_point_interval_s: int = -1


class MoveTableConfig(dg.Config):
    """Move ``table_id`` of a changefeed to ``capture_id``."""

    changefeed_id: str
    table_id: int
    capture_id: str


class ResnapshotConfig(dg.Config):
    """A table of a mysql:// changefeed to snapshot again, as DATABASE.TABLE."""

    changefeed_id: str
    table: str


class CaptureConfig(dg.Config):
    """A capture by id."""

    capture_id: str


class AddCaptureConfig(dg.Config):
    """A new capture and its lease TTL."""

    capture_id: str
    ttl_s: int = admin.DEFAULT_CAPTURE_TTL_S


def _guarded(context: dg.OpExecutionContext, what: Callable[[], str]) -> None:
    try:
        message = what()
    except (*admin.ADMIN_ERRORS, ValueError) as exc:
        raise dg.Failure(redact_text(" ".join(str(exc).split())), allow_retries=False) from exc
    context.log.info(message)


def _admin_job(
    name: str, description: str, config_cls: type[dg.Config], action: Callable[[Any, Any], str]
) -> dg.JobDefinition:
    @dg.op(name=f"{name}_op", description=description)
    def run(context: dg.OpExecutionContext, config: config_cls, cdc: CdcResource) -> None:  # type: ignore[valid-type]
        def go() -> str:
            return action(cdc.metastore(), config)

        _guarded(context, go)

    @dg.job(
        name=name,
        description=description,
        executor_def=dg.in_process_executor,
        tags={"cdc/kind": "admin"},
    )
    def job() -> None:
        run()

    return job


def _create(ms: Any, c: CreateChangefeedConfig) -> str:
    cf = admin.create_changefeed(
        ms,
        c.changefeed_id,
        c.sink_uri,
        table_filter=tuple(c.table_filter),
        start_ts=c.start_ts or None,
        target_ts=c.target_ts,
        sync_point_interval_s=c.sync_point_interval_s,
        upstream_uri=c.upstream_uri,
    )
    return f"created changefeed {cf.changefeed_id} at start ts {cf.info.start_ts}"


def _update(ms: Any, c: UpdateChangefeedConfig) -> str:
    changes: dict[str, Any] = {}
    if c.sink_uri:
        changes["sink_uri"] = c.sink_uri
    if c.table_filter:
        changes["table_filter"] = tuple(c.table_filter)
    if c.target_ts >= 0:
        changes["target_ts"] = c.target_ts
    if c.sync_point_interval_s >= 0:
        changes["sync_point_interval_s"] = c.sync_point_interval_s
    admin.update_changefeed(ms, c.changefeed_id, **changes)
    return f"updated changefeed {c.changefeed_id}: {', '.join(sorted(changes))}"


def _pause(ms: Any, c: ChangefeedConfig) -> str:
    admin.pause_changefeed(ms, c.changefeed_id)
    return f"paused changefeed {c.changefeed_id}"


def _resume(ms: Any, c: ChangefeedConfig) -> str:
    admin.resume_changefeed(ms, c.changefeed_id)
    return f"resumed changefeed {c.changefeed_id}"


def _remove(ms: Any, c: ChangefeedConfig) -> str:
    admin.remove_changefeed(ms, c.changefeed_id)
    return f"removed changefeed {c.changefeed_id}"


def _move(ms: Any, c: MoveTableConfig) -> str:
    admin.move_table(ms, c.changefeed_id, c.table_id, c.capture_id)
    return f"asked the owner to move table {c.table_id} to {c.capture_id}"


def _resnapshot(ms: Any, c: ResnapshotConfig) -> str:
    return " ".join(admin.request_resnapshot(ms, c.changefeed_id, c.table).lines())


def _drain(ms: Any, c: CaptureConfig) -> str:
    n = len(admin.drain_capture(ms, c.capture_id))
    return f"asked the owner to drain {c.capture_id} ({n} changefeed(s))"


def _rebalance(ms: Any, c: ChangefeedConfig) -> str:
    admin.rebalance(ms, c.changefeed_id)
    return f"asked the owner to rebalance {c.changefeed_id}"


def _resign(ms: Any, c: dg.Config) -> str:
    return f"owner {admin.resign_owner(ms)} resigned"


def _add_capture(ms: Any, c: AddCaptureConfig) -> str:
    epoch = admin.add_capture(ms, c.capture_id, c.ttl_s)
    return f"added capture {c.capture_id} (epoch {epoch}); the owner schedules onto it next tick"


def _remove_capture(ms: Any, c: CaptureConfig) -> str:
    admin.remove_capture(ms, c.capture_id)
    return f"removed capture {c.capture_id}"


class NoConfig(dg.Config):
    """No settings."""


ADMIN_JOBS: list[dg.JobDefinition] = [
    _admin_job("create_changefeed", "Create a changefeed.", CreateChangefeedConfig, _create),
    _admin_job("pause_changefeed", "Pause a changefeed.", ChangefeedConfig, _pause),
    _admin_job("resume_changefeed", "Resume a paused changefeed.", ChangefeedConfig, _resume),
    _admin_job(
        "update_changefeed", "Change a paused changefeed's config.", UpdateChangefeedConfig, _update
    ),
    _admin_job("remove_changefeed", "Remove a changefeed.", ChangefeedConfig, _remove),
    _admin_job(
        "move_table",
        "Move a table to another capture (two-phase, no pause).",
        MoveTableConfig,
        _move,
    ),
    _admin_job(
        "resnapshot_table",
        "Snapshot one table of a mysql:// changefeed again, in chunks, replacing its "
        "downstream rows; the other tables replicate on (`cdc-dagster table resnapshot`).",
        ResnapshotConfig,
        _resnapshot,
    ),
    _admin_job("drain_capture", "Move every table off a capture.", CaptureConfig, _drain),
    _admin_job("rebalance", "Spread a changefeed's tables evenly.", ChangefeedConfig, _rebalance),
    _admin_job("resign_owner", "Make the owner step down.", NoConfig, _resign),
    _admin_job(
        "add_capture",
        "Register a capture (scale out at one barrier).",
        AddCaptureConfig,
        _add_capture,
    ),
    _admin_job("remove_capture", "Deregister a drained capture.", CaptureConfig, _remove_capture),
]

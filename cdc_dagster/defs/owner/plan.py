"""Turn one owner tick into a ``SensorResult``: pure, so it is tested without Dagster running."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

import dagster as dg

from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.handoff import AHEAD_TAG
from cdc_dagster.defs.partitions import CAPTURES
from cdc_dagster.defs.tables.gate import gate_status
from cdc_dagster.metastore.mailbox import merge
from cdc_dagster.runtime import OwnerStep, ReadyDdl
from scheduler_core.ts import format_ts

CAPTURE_JOB = "capture_tick"
DDL_JOB = "apply_ddl"


def capture_run_request(
    capture_id: str,
    owner_rev: int,
    tick: int,
    messages: Mapping[str, list[dict[str, Any]]],
    follow_s: float = 0.0,
    ahead: bool = False,
) -> dg.RunRequest:
    """One capture run: its owner messages, ``owner_rev`` and the tick in the run config, and
    how long it goes on ticking from its mailbox; ``ahead``: the capture's next run, asked
    for before its run ends (``AHEAD_TAG``)."""
    config = {
        "capture_id": capture_id,
        "owner_rev": owner_rev,
        "tick": tick,
        "messages_json": json.dumps(messages, separators=(",", ":")),
    }
    return dg.RunRequest(
        # run keys are deduplicated forever: owner_rev and the tick make each one new.
        run_key=f"capture:{capture_id}:{owner_rev}:{tick}",
        partition_key=capture_id,
        job_name=CAPTURE_JOB,
        run_config={
            "ops": {"receive": {"config": config}, "follow": {"config": {"seconds": follow_s}}}
        },
        tags={
            "cdc/owner_rev": str(owner_rev),
            "cdc/tick": str(tick),
            **({AHEAD_TAG: "1"} if ahead else {}),
        },
    )


DDL_RETRY_TICKS = 6  # a DDL still ready this many ticks later gets a new run (~30 s)
# ... or, when the sensor passes a ``retry_epoch`` (its wall clock in these units: one
# evaluation may tick the owner many times), this many seconds later.
DDL_RETRY_S = 30


def ddl_run_request(
    ddl: ReadyDdl, owner_rev: int, tick: int, retry_epoch: int | None = None
) -> dg.RunRequest:
    """The run applying one DDL whose gate is open (again after a failed run, every ~30 s:
    a new ``retry_epoch``, or DDL_RETRY_TICKS ticks without one)."""
    retry = tick // DDL_RETRY_TICKS if retry_epoch is None else retry_epoch
    config = {
        "changefeed_id": ddl.changefeed_id,
        "commit_ts": ddl.commit_ts,
        "table_ids": list(ddl.table_ids),
    }
    return dg.RunRequest(
        run_key=f"ddl:{ddl.changefeed_id}:{ddl.commit_ts}:{owner_rev}:{retry}",
        job_name=DDL_JOB,
        run_config={"ops": {"ddl_gate": {"config": config}, "ddl_apply": {"config": config}}},
        tags={"cdc/changefeed": ddl.changefeed_id, "cdc/ddl_commit_ts": str(ddl.commit_ts)},
    )


class Outbox:
    """Owner messages of captures whose previous run has not started yet, in memory.

    The owner sensor keeps them in etcd instead (``cdc_dagster/defs/owner/mailbox.py``,
    where a run in progress or just started can take them); this one serves ``plan``
    without etcd.

    A capture runs one tick at a time (the run queue's limit per partition), and a run
    takes longer than the sensor's interval on a busy machine: a run per capture per tick
    would pile up in the queue, each carrying messages that are older by the time it
    starts. So while a capture has a queued run, the sensor requests no other one and
    keeps that tick's messages here; the capture's next run carries them all, in order
    (a delayed message is one the protocol already tolerates). Heartbeats are superseded
    by the newest one of the same changefeed; dispatches are all kept (``merge``).
    """

    def __init__(self) -> None:
        self.owner_rev = 0
        self._held: dict[str, dict[str, list[dict[str, Any]]]] = {}

    def held(self, capture_id: str) -> int:
        """Messages waiting for ``capture_id``'s next run."""
        return sum(len(m) for m in self._held.get(capture_id, {}).values())

    def hold(self, capture_id: str, work: Mapping[str, list[dict[str, Any]]]) -> None:
        """Keep ``work`` (changefeed -> encoded messages) for the capture's next run."""
        self._held[capture_id] = merge(self._held.get(capture_id, {}), work)

    def take(
        self, capture_id: str, work: Mapping[str, list[dict[str, Any]]]
    ) -> dict[str, list[dict[str, Any]]]:
        """What the capture's run carries now: held messages first, then ``work``."""
        self.hold(capture_id, work)
        return self._held.pop(capture_id, {})

    def new_owner(self, owner_rev: int) -> None:
        """Messages of another owner_rev are refused by captures anyway: drop them."""
        if owner_rev != self.owner_rev:
            self._held.clear()
            self.owner_rev = owner_rev

    def forget(self, alive: Collection[str]) -> None:
        """Drop what was held for captures that left."""
        for cid in [c for c in self._held if c not in alive]:
            del self._held[cid]


def plan(
    step: OwnerStep,
    tick: int,
    known_captures: Collection[str],
    catalog: Catalog,
    checkpoint_of: Callable[[str, int], int | None],
    *,
    queued: Collection[str] = (),
    outbox: Outbox | None = None,
    follow_s: float = 0.0,
    retry_epoch: int | None = None,
    handoff: Collection[str] = (),
) -> dg.SensorResult:
    """The sensor's answer for one owner step.

    A run per capture with work (a heartbeat is work: it renews the lease) unless the
    capture has a run still queued (or, with ``follow_s``, in progress: a run that follows
    its mailbox takes them itself): then its messages wait in ``outbox`` for that run or
    the next; partitions follow the alive captures; a DDL run only when the tables'
    checkpoint metadata has reached its commit ts (the gate op re-checks inside the run),
    asked again in each ``retry_epoch`` (see ``ddl_run_request``). A capture in ``handoff``
    (its run follows its mailbox and is about to end: ``defs/capture/handoff.py``) gets its
    next run now, with no messages: they wait in ``outbox`` (the mailbox) for whichever run
    ticks first.
    """
    owner = step.tick
    if not owner.is_owner:
        return dg.SensorResult(skip_reason="; ".join(step.notes), cursor=str(tick))
    alive = set(owner.captures)
    partition_requests: list[
        dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest
    ] = []
    added = sorted(alive - set(known_captures))
    gone = sorted(set(known_captures) - alive)
    if added:
        partition_requests.append(CAPTURES.build_add_request(added))
    if gone:
        partition_requests.append(CAPTURES.build_delete_request(gone))
    box = outbox if outbox is not None else Outbox()
    box.new_owner(owner.owner_rev)
    box.forget(alive)
    runs = [
        capture_run_request(c, owner.owner_rev, tick, {}, follow_s, ahead=True)
        for c in sorted(set(handoff) & alive)
    ]
    for c, m in sorted(step.work.items()):
        if c not in alive:
            continue
        if c in queued or c in handoff:
            box.hold(c, m)
            continue
        runs.append(capture_run_request(c, owner.owner_rev, tick, box.take(c, m), follow_s))
    for ddl in step.gated:
        tables = owner.changefeeds.get(ddl.changefeed_id)
        current = {t.table_id for t in tables.tables} if tables else set()
        is_open, _ = gate_status(ddl, catalog, checkpoint_of, current or None)
        if is_open:
            runs.append(ddl_run_request(ddl, owner.owner_rev, tick, retry_epoch))
    return dg.SensorResult(
        run_requests=runs,
        dynamic_partitions_requests=partition_requests,
        cursor=str(tick),
    )


def awaiting_answers(step: OwnerStep, following: Collection[str]) -> dict[str, tuple[str, ...]]:
    """Captures (and their changefeeds) whose answers the owner's next tick would act on at
    once, if it ticked again as soon as they answered: a changefeed was rebuilt (a resume, a
    new owner: its captures must report under the new epoch before tables are scheduled) or
    the tick sent dispatches (a prepare is answered PREPARED, a commit REPLICATING); and
    every capture with messages follows its mailbox (its running capture run takes them
    within a poll). Empty: the protocol waits for the sensor's next evaluation."""
    owner = step.tick
    if not owner.is_owner or not step.work or not set(step.work) <= set(following):
        return {}
    if not moving(step):
        return {}
    return {c: tuple(sorted(work)) for c, work in sorted(step.work.items())}


def moving(step: OwnerStep) -> list[str]:
    """The changefeeds whose step moved the protocol: rebuilt, or sent a dispatch."""
    out = {cf for cf, t in step.tick.changefeeds.items() if t.rebuilt}
    for work in step.work.values():
        out |= {cf for cf, msgs in work.items() if any(m.get("type") == "dispatch" for m in msgs)}
    return sorted(out)


def progress_lines(step: OwnerStep) -> Mapping[str, str]:
    """Per changefeed, one log line of its progress."""
    return {
        cf: f"checkpoint {format_ts(t.checkpoint_ts)} resolved {format_ts(t.resolved_ts)} "
        f"lag {t.lag_s:.1f} s"
        for cf, t in step.tick.changefeeds.items()
    }


IDLE_PREFIX = "owner (owner_rev "  # how an owner tick that launched nothing starts its line


def idle_reason(step: OwnerStep) -> str:
    """What an owner tick that launched no run did, for the sensor's tick list in the UI
    (instead of Dagster's "returned an empty result"): each changefeed's lag and health."""
    parts = []
    for cf, t in sorted(step.tick.changefeeds.items()):
        health = step.tick.health.get(cf)
        state = ""
        if health is not None and health.message:
            state = f", {'failed' if health.failed else 'warning'}: {health.message[:200]}"
        parts.append(f"{cf} lag {t.lag_s:.1f} s{state}")
    what = "; ".join(parts) if parts else "no changefeed"
    return f"{IDLE_PREFIX}{step.tick.owner_rev}), no run to launch: {what}"

"""What changed in etcd since an owner tick read it, sorted by what it means to the owner.

One watch over the cluster prefix, from the revision the tick read, with each key's value
before the change (``prev_kv``), so the owner's own writes (statuses that only move
checkpoints, DDL states, mailbox puts, the GC safepoint) wake nobody. Each event is one of:

- **urgent** — a changefeed created, updated, removed, paused or resumed (its status's
  state or epoch changed), a capture registered or gone, a capture asked for, an admin
  request, a DDL or syncpoint marked applied: the owner should tick at once;
- **progress** — a capture's task statuses changed (a table's checkpoint moved): the
  changefeed checkpoint can move;
- **a take** of a capture's mailbox, or **an agent state** of a capture (``in_tick``: between
  its tick's halves): with both, the owner knows when a capture answered its messages;
- **lost** — the election key is gone or another owner's: stop waiting.

The sorting is :func:`sort_event` (pure); :class:`OwnerWatch` keeps the newest revision of
each kind for a waiter (the owner sensor, ``cdc_dagster/defs/owner/wait.py``).
"""

from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cdc_dagster.metastore.changefeeds import decode_status
from cdc_dagster.metastore.client import EtcdClient, KeyValue, WatchEvent, WatchEventType
from cdc_dagster.metastore.errors import CorruptValueError, MetastoreError
from cdc_dagster.metastore.keys import KeyLayout


class Change(enum.Enum):
    """What one etcd event means to the owner."""

    NONE = "none"  # the owner's own writes, or nothing it acts on
    URGENT = "urgent"  # tick at once (a user or a capture changed what the owner schedules)
    PROGRESS = "progress"  # a capture's task statuses changed: checkpoints may move
    TAKE = "take"  # a capture took its mailbox
    AGENT = "agent"  # a capture wrote its agent state (an answer, once out of its tick)
    LOST = "lost"  # the election key is gone or another owner's


def sort_event(layout: KeyLayout, owner_rev: int, event: WatchEvent) -> Change:
    """What ``event`` (watched with ``prev_kv``) means to the owner of ``owner_rev``."""
    key, put = event.kv.key, event.type is WatchEventType.PUT
    if key == layout.owner:
        return Change.NONE if put and event.kv.create_revision == owner_rev else Change.LOST
    if key.startswith((layout.changefeed_infos, layout.captures, layout.desired_captures)):
        return Change.URGENT
    if key.startswith(layout.changefeed_statuses):
        return Change.URGENT if not put or _state_changed(event.prev, event.kv) else Change.NONE
    if key.startswith((layout.admin_requests(), layout.prefix + "applied/")):
        return Change.URGENT if put else Change.NONE  # a delete: the owner took or cleaned it
    if key.startswith(layout.all_tasks):
        changed = event.prev is None or event.prev.value != event.kv.value
        return Change.PROGRESS if put and changed else Change.NONE
    if key.startswith(layout.mailboxes):
        return Change.NONE if put else Change.TAKE
    if key.startswith(layout.prefix + "agent/"):
        return Change.AGENT if put else Change.NONE
    return Change.NONE


def _state_changed(prev: KeyValue | None, now: KeyValue) -> bool:
    """A status whose state or epoch changed (pause, resume, create), not only its ts."""
    if prev is None:
        return True
    try:
        before, _ = decode_status(prev)
        after, _ = decode_status(now)
    except CorruptValueError:
        return True  # the owner's tick reports it
    return (before.state, before.epoch) != (after.state, after.epoch)


def in_tick(value: bytes) -> bool:
    """Whether an agent state was written between its tick's halves (true if unreadable:
    no answer to act on)."""
    try:
        return bool(json.loads(value).get("in_tick", True))
    except (ValueError, AttributeError):
        return True


@dataclass(slots=True)
class Seen:
    """The newest revision of each kind of change the watch delivered (0: none)."""

    urgent: int = 0
    progress: int = 0
    takes: dict[str, int] = field(default_factory=dict)  # capture -> its mailbox's last take
    # (changefeed, capture) -> (revision, in_tick) of its last agent state
    agents: dict[tuple[str, str], tuple[int, bool]] = field(default_factory=dict)
    stopped: str = ""  # why waiting is over for good (lost the election, etcd stream ended)

    def answered(self, capture_id: str, changefeeds: tuple[str, ...], since: int) -> bool:
        """The capture took its mailbox after ``since`` and every one of ``changefeeds``'
        agent states was written out of a tick after that take."""
        taken = self.takes.get(capture_id, 0)
        if taken <= since:
            return False
        for cf in changefeeds:
            rev, busy = self.agents.get((cf, capture_id), (0, True))
            if rev <= taken or busy:
                return False
        return True


class OwnerWatch:
    """Changes under the cluster prefix from a revision (see the module docstring).

    ``open`` returns within its timeout even when etcd does not answer (the subscription
    then goes on in its thread and is cancelled when it completes); every failure ends the
    wait (``Seen.stopped``), none is raised.
    """

    def __init__(self, client: EtcdClient, layout: KeyLayout, owner_rev: int) -> None:
        self._client = client
        self._layout = layout
        self._owner_rev = owner_rev
        self._cond = threading.Condition()
        self._seen = Seen()
        self._watch_id: int | None = None
        self._closed = False

    def open(self, start_revision: int, timeout_s: float) -> bool:
        """Watch from ``start_revision`` (0: from now); False if it could not start in time."""
        ready = threading.Event()
        thread = threading.Thread(
            target=self._subscribe, args=(start_revision, ready), name="owner watch", daemon=True
        )
        thread.start()
        if not ready.wait(timeout_s):
            self._stop("the watch did not start in time (is etcd reachable?)")
            self.close()
            return False
        with self._cond:
            return not self._seen.stopped

    def _subscribe(self, start_revision: int, ready: threading.Event) -> None:
        try:
            watch_id = self._client.watch_prefix(
                self._layout.prefix, start_revision, self._on_events, self._stop, prev_kv=True
            )
        except MetastoreError as exc:
            self._stop(f"cannot watch: {exc}")
            ready.set()
            return
        with self._cond:
            late = self._closed
            self._watch_id = None if late else watch_id
        if late:
            self._cancel(watch_id)
        ready.set()

    def _on_events(self, events: list[WatchEvent]) -> None:
        with self._cond:
            seen = self._seen
            for e in events:
                change = sort_event(self._layout, self._owner_rev, e)
                rev = e.kv.mod_revision
                if change is Change.URGENT:
                    seen.urgent = max(seen.urgent, rev)
                elif change is Change.PROGRESS:
                    seen.progress = max(seen.progress, rev)
                elif change is Change.TAKE:
                    seen.takes[self._layout.last_segment(e.kv.key)] = rev
                elif change is Change.AGENT:
                    cf, capture = e.kv.key.rsplit("/", 2)[-2:]
                    seen.agents[(cf, capture)] = (rev, in_tick(e.kv.value))
                elif change is Change.LOST:
                    seen.stopped = seen.stopped or "the owner lost the election"
            self._cond.notify_all()

    def _stop(self, reason: str) -> None:
        with self._cond:
            self._seen.stopped = self._seen.stopped or reason
            self._cond.notify_all()

    def wait(self, ready: Callable[[Seen, float], float | None], deadline: float) -> Seen | None:
        """Block until ``ready(seen, now)`` returns a time that has come (it returns None
        while nothing is due, else when to go on), the watch stopped, or ``deadline``
        (monotonic); the seen changes then, or None (stopped, or the deadline passed)."""
        with self._cond:
            while True:
                now = time.monotonic()
                if self._seen.stopped or now >= deadline:
                    return None
                at = ready(self._seen, now)
                if at is not None and at <= now:
                    return self._seen
                self._cond.wait(min(deadline, at if at is not None else deadline) - now)

    def stopped(self) -> str:
        """Why waiting is over for good ("" while the watch goes on)."""
        with self._cond:
            return self._seen.stopped

    def close(self) -> None:
        """Cancel the watch (one that is still starting is cancelled when it started)."""
        with self._cond:
            self._closed = True
            watch_id, self._watch_id = self._watch_id, None
        if watch_id is not None:
            self._cancel(watch_id)

    def _cancel(self, watch_id: int) -> None:
        self._client.cancel_watch(watch_id)  # never raises for etcd's trouble

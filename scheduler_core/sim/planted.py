"""Planted bugs: each is a known-wrong variant of one protocol rule, switched on in a test.

The soak must find a violation with each of them on (tests/unit/sim/test_planted_bugs.py);
a validator that misses a planted bug checks bookkeeping, not behaviour. Every plant is a
context manager that patches one function and restores it on exit; nothing here runs in
production.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from scheduler_core import checkpoint as checkpoint_mod
from scheduler_core.captures import CaptureManager
from scheduler_core.ddl import DDLEvent, DDLKind, DDLManager
from scheduler_core.messages import AddTableRequest
from scheduler_core.replication import ReplicationSet
from scheduler_core.schedulers import BalanceScheduler
from scheduler_core.sim import fake_executor


@contextlib.contextmanager
def _patched(owner: object, name: str, value: object) -> Iterator[None]:
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def cap_ignores_table_barriers() -> contextlib.AbstractContextManager[None]:
    """The changefeed checkpoint is capped by the global barrier only."""
    return _patched(checkpoint_mod, "barrier_cap", lambda barrier: barrier.global_barrier_ts)


def multi_table_drop_blocks_first_table_only() -> contextlib.AbstractContextManager[None]:
    """A DROP of several tables holds back only the first of them."""
    real = DDLEvent.blocks_only

    def blocks_only(self: DDLEvent, current_tables) -> int | None:
        if self.kind is DDLKind.DROP_TABLE and self.table_ids[0] in current_tables:
            return self.table_ids[0]
        return real(self, current_tables)

    return _patched(DDLEvent, "blocks_only", blocks_only)


def owner_accepts_stale_capture_epochs() -> contextlib.AbstractContextManager[None]:
    """The owner checks a report's seq but not its capture epoch."""

    def accept(self: CaptureManager, capture_id: str, epoch: str, seq: int) -> bool:
        st = self.captures.get(capture_id)
        return st is not None and (not st.epoch or epoch != st.epoch or seq > st.last_seq)

    return _patched(CaptureManager, "accept", accept)


@contextlib.contextmanager
def new_primary_starts_at_its_prepare_checkpoint() -> Iterator[None]:
    """A promoted secondary is told to sink from where it prepared, not from the old
    primary's final checkpoint."""
    prepared: dict[tuple[int, str], object] = {}
    real_poll: Callable = ReplicationSet.poll

    def poll(self: ReplicationSet, status, from_capture: str):
        out = real_poll(self, status, from_capture)
        fixed = []
        for msg in out:
            key = (msg.table_id, msg.to)
            if isinstance(msg, AddTableRequest) and msg.is_secondary:
                prepared[key] = msg.checkpoint
            elif isinstance(msg, AddTableRequest) and key in prepared:
                msg = AddTableRequest(msg.to, msg.table_id, False, prepared[key])  # type: ignore[arg-type]
            fixed.append(msg)
        return fixed

    with _patched(ReplicationSet, "poll", poll):
        yield


def promote_while_undetermined() -> contextlib.AbstractContextManager[None]:
    """A secondary is promoted although an Undetermined capture may still be writing."""
    return _patched(ReplicationSet, "has_undetermined", lambda self: False)


def sink_spans_syncpoints() -> contextlib.AbstractContextManager[None]:
    """Sinks write one batch up to their limit, across syncpoint TSs (no split)."""
    return _patched(fake_executor, "syncpoints_between", lambda lo, hi, interval: [])


def table_set_changes_before_syncpoint_record() -> contextlib.AbstractContextManager[None]:
    """A DDL above an unrecorded syncpoint runs (and changes the table set) before it."""
    return _patched(DDLManager, "after_syncpoints", lambda self, ts: True)


def open_barrier_ignores_stream_ddls() -> contextlib.AbstractContextManager[None]:
    """A sink past an open barrier goes to the stream's resolved TS, over DDLs in between."""
    return _patched(fake_executor.FakeUpstream, "stream_ts", lambda self, after: self._resolved_ts)


def balance_waits_for_a_quiet_changefeed() -> contextlib.AbstractContextManager[None]:
    """The balance runs only on a tick where every table replicates and no task runs (what
    it did before issue 17's scale-out fix): under DDLs and moves a new capture stays idle."""
    real = BalanceScheduler.schedule

    def schedule(self: BalanceScheduler, ctx):
        rm = ctx.replications
        if rm.running_tasks or not rm.all_replicating():
            return []
        return real(self, ctx)

    return _patched(BalanceScheduler, "schedule", schedule)


def balance_ignores_capture_changes() -> contextlib.AbstractContextManager[None]:
    """A new capture waits for the periodic balance (no round when the captures change)."""
    real = BalanceScheduler.due

    def due(self: BalanceScheduler, ctx) -> bool:
        self._members = tuple(ctx.schedulable())
        return real(self, ctx)

    return _patched(BalanceScheduler, "due", due)


PLANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "cap_ignores_table_barriers": cap_ignores_table_barriers,
    "multi_table_drop_blocks_first_table_only": multi_table_drop_blocks_first_table_only,
    "owner_accepts_stale_capture_epochs": owner_accepts_stale_capture_epochs,
    "new_primary_starts_at_its_prepare_checkpoint": new_primary_starts_at_its_prepare_checkpoint,
    "promote_while_undetermined": promote_while_undetermined,
    "sink_spans_syncpoints": sink_spans_syncpoints,
    "table_set_changes_before_syncpoint_record": table_set_changes_before_syncpoint_record,
    "open_barrier_ignores_stream_ddls": open_barrier_ignores_stream_ddls,
    "balance_waits_for_a_quiet_changefeed": balance_waits_for_a_quiet_changefeed,
    "balance_ignores_capture_changes": balance_ignores_capture_changes,
}

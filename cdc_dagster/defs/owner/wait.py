"""When one evaluation of the owner sensor ticks the owner again, instead of returning.

Dagster's daemon wakes the sensor every 5 s at best (every second in the daemon ``server
start`` runs: ``services/run_coordinator.py``), so whatever a user or a capture does waited
0-5 s for the owner to see it: a ``changefeed resume``, a capture's answer to a
prepare, a checkpoint that moved. An evaluation that has nothing to launch (run requests
are launched only once it returns) watches etcd (``metastore/owner_watch.py``) until its
budget is spent and ticks again as soon as something that matters changed:

- at once (at most every ``URGENT_STEP_S``) on an urgent change (a changefeed created,
  updated, paused or resumed, a capture registered or gone, an admin request, a DDL
  applied) and when every following capture answered the last step's messages (a resume's
  reports, a prepare, a commit: what ``settle`` did);
- at most every ``PROGRESS_STEP_S`` when only task statuses changed (checkpoints moved):
  each owner step sends every capture a heartbeat, on which a following capture ticks and
  writes its statuses again, so ticking on each of them would keep both busy for nothing.

The budget is ``Settings.owner_wait_s`` from the evaluation's start; ``server start`` and
``demo`` set 3.5 s, so the evaluation ends before the daemon's next wake (it skips a sensor
still evaluating: a longer wait would make the owner tick every other wake; with 4 s, the
daemon's handling of a result, 0.3-1.4 s, made 5 of 179 evaluations in a bench run skip
one). Its default is 0 so that tests which evaluate the sensor directly take no longer: then
only answers are waited for, for ``SETTLE_S`` after the first step, as before the budget
existed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from cdc_dagster.metastore import Metastore
from cdc_dagster.metastore.owner_watch import OwnerWatch, Seen

# How long an evaluation without a wait budget still ticks the owner while following
# capture runs answer (a resume's reports, prepare and commit: three owner steps, 15 s at
# one per daemon wake).
SETTLE_S = 3.0
URGENT_STEP_S = 0.2  # the least time between two steps on urgent changes or answers
PROGRESS_STEP_S = 1.0  # ... when only checkpoints moved


class OwnerWaiter:
    """Waits, within one evaluation, for the next reason to tick the owner."""

    def __init__(self, ms: Metastore, owner_rev: int, deadline: float, general: bool) -> None:
        """``deadline``: monotonic end of the wait; ``general``: wake on urgent changes and
        progress too, not only on answers."""
        self.deadline = deadline
        self.general = general
        self._watch = OwnerWatch(ms.client, ms.layout, owner_rev)
        self._opened = False

    def next(
        self,
        revision: int,
        stepped_at: float,
        targets: Mapping[str, tuple[str, ...]],
        marks: Mapping[str, int],
    ) -> str | None:
        """Wait for what the step that read ``revision`` (and started at ``stepped_at``)
        has not seen; why to step again, or None (budget spent, watch stopped: return)."""
        if not self.general and not targets:
            return None
        if not self._opened:
            self._opened = True
            start = revision + 1 if revision else 0
            if not self._watch.open(start, max(0.0, self.deadline - time.monotonic())):
                return None
        why: list[str] = []

        def ready(seen: Seen, now: float) -> float | None:
            due = {}
            if targets and all(
                seen.answered(c, cfs, marks.get(c, 0)) for c, cfs in targets.items()
            ):
                due["captures answered"] = stepped_at + URGENT_STEP_S
            if self.general and seen.urgent > revision:
                due["changefeed or capture changed"] = stepped_at + URGENT_STEP_S
            if self.general and seen.progress > revision:
                due["checkpoints moved"] = stepped_at + PROGRESS_STEP_S
            why[:] = [k for k, at in due.items() if at <= now]
            return min(due.values()) if due else None

        seen = self._watch.wait(ready, self.deadline)
        return ", ".join(why) if seen is not None else None

    def stopped(self) -> str:
        """Why the watch ended early ("" if it did not)."""
        return self._watch.stopped()

    def close(self) -> None:
        """Stop watching."""
        self._watch.close()

"""A capture's changefeeds tick side by side: one lane per changefeed.

A capture serves every changefeed it holds tables of, and their ticks are independent
(each changefeed has its own staging, Agent state, task status key and sink). Ticked one
after another, a changefeed whose tick is long -- a snapshot's table released with millions
of rows, a Spark job of many seconds -- held every other changefeed of the capture for that
long: a stream of a few rows per second lagged by the length of another changefeed's tick.

So a following capture run ticks each changefeed in a lane of its own (a thread): at most
one tick per changefeed at a time (a changefeed's ticks stay in order), the changefeeds'
ticks concurrently. What comes for a changefeed while its lane is busy waits for it: the
owner's messages (merged as the mailbox merges them: a newer heartbeat replaces an older)
and a "new data" mark. Spark jobs from two lanes run side by side on one session, and an
in-process tick's Arrow and Delta work releases the GIL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from cdc_dagster.metastore.mailbox import Work, merge

T = TypeVar("T")

OWNER = "owner"  # a tick for the owner's messages
DATA = "data"  # a tick of the capture's own: the change log resolved further


@dataclass(frozen=True, slots=True)
class LaneTick(Generic[T]):
    """One finished tick of one changefeed."""

    changefeed_id: str
    why: str  # OWNER or DATA
    messages: list[dict[str, Any]]
    result: T | None
    error: BaseException | None
    seconds: float


class ChangefeedLanes(Generic[T]):
    """Tick changefeeds concurrently, each one tick at a time (see the module docstring).

    ``tick(changefeed_id, messages)`` runs in a lane's thread; what it returns or raises
    comes back as a :class:`LaneTick` from :meth:`finished` or :meth:`close`."""

    def __init__(self, tick: Callable[[str, list[dict[str, Any]]], T], workers: int = 8) -> None:
        self._tick = tick
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="changefeed-lane")
        self._running: dict[str, tuple[Future[T], str, list[dict[str, Any]], float]] = {}
        self._messages: Work = {}  # the owner's messages waiting for their lane
        self._due: dict[str, str] = {}  # changefeed -> why its next tick is due

    def busy(self) -> set[str]:
        """The changefeeds whose lane is ticking."""
        return set(self._running)

    def waiting(self) -> set[str]:
        """The changefeeds with a tick due that has not started."""
        return set(self._due)

    def add(self, work: Mapping[str, list[dict[str, Any]]], why: str) -> None:
        """A tick is due for each changefeed of ``work`` (with its messages, if any)."""
        self._messages = merge(self._messages, work)
        for cf in work:
            if why == OWNER or cf not in self._due:
                self._due[cf] = why

    def start(self, not_before: Mapping[str, float] | None = None) -> list[str]:
        """Start the due ticks whose lane is free; the changefeeds started. A changefeed in
        ``not_before`` waits until ``time.monotonic()`` reaches its time (its messages wait,
        merged, for that tick)."""
        started, waits, now = [], not_before or {}, time.monotonic()
        for cf in sorted(self._due):
            if cf in self._running or waits.get(cf, 0.0) > now:
                continue
            why = self._due.pop(cf)
            messages = self._messages.pop(cf, [])
            future = self._pool.submit(self._tick, cf, messages)
            self._running[cf] = (future, why, messages, time.perf_counter())
            started.append(cf)
        return started

    def finished(self, timeout_s: float | None = 0.0) -> list[LaneTick[T]]:
        """The ticks that ended, waiting up to ``timeout_s`` (None: as long as it takes) for
        one when none has."""
        if not self._running:
            return []
        futures = [f for f, *_ in self._running.values()]
        wait(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)
        out = []
        for cf, (future, why, messages, t0) in sorted(self._running.items()):
            if not future.done():
                continue
            del self._running[cf]
            error = future.exception()
            seconds = time.perf_counter() - t0
            result = None if error is not None else future.result()
            out.append(LaneTick(cf, why, messages, result, error, seconds))
        return out

    def close(self, finish_owner_messages: bool) -> list[LaneTick[T]]:
        """Wait for every lane; with ``finish_owner_messages``, tick once more the changefeeds
        whose owner's messages wait for their lane (they were taken from the mailbox), and
        wait for those too. Data ticks still due are dropped (the next run ticks them)."""
        out: list[LaneTick[T]] = []
        while self._running:
            out += self.finished(timeout_s=None)
        if finish_owner_messages:
            self._due = {cf: why for cf, why in self._due.items() if cf in self._messages}
            self.start()
            while self._running:
                out += self.finished(timeout_s=None)
        self._due.clear()
        self._messages = {}
        self._pool.shutdown(wait=True)
        return out

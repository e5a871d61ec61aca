"""A follow loop's Dagster events, written by a thread of their own.

Each asset materialization and log line is one event-log write (~12 ms on SQLite idle,
~50 ms under load), and the follow loop (``defs/capture/job.py``) wrote them itself
between starting lanes: when a snapshot's changefeed finished a tick with 50 tables, the
loop spent ~2.5 s writing their materializations, and every other changefeed's next tick
waited that long to start. On 2 cores, while a 100-table snapshot was read and sunk, the
stream's ticks were held 2.4-2.7 s at each of the snapshot's tick ends (a tick of the
stream: 5.9 s, of which prepare and commit 3.2 s), and its lag followed.

So the loop hands what it would write to an :class:`EventWriter` and goes on; one thread
writes it, in order. While it is behind, what waits is coalesced: a newer materialization
of an asset by the same changefeed replaces the waiting one. Each carries the state of the
changefeed's tables of that asset as of its tick, and its readers (the UI, the DDL gate)
read the latest: what is lost is plot points, and a state held only between the two ticks
(not in the asset's history; the tick's log line still says it). Log lines are written
each as its own entry (one per tick: a few a second at most). So a slow event log never
takes the loop's time, and what waits is bounded by the number of assets.

An error writing (the instance's storage gone) is raised in the loop at its next
:meth:`EventWriter.put`, or by :meth:`EventWriter.close`: the run fails as it did when
the loop wrote itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import dagster as dg

from cdc_dagster.defs.tables.assets import metadata_value


class EventWriter:
    """Writes materializations and log lines for a follow loop, in a thread (see above).

    ``log_event`` and ``log_info`` are the op context's (``context.log_event``,
    ``context.log.info``)."""

    def __init__(
        self,
        log_event: Callable[[dg.AssetMaterialization], Any],
        log_info: Callable[[str], Any],
    ) -> None:
        self._log_event = log_event
        self._log_info = log_info
        self._cond = threading.Condition()
        # (changefeed, asset) -> its newest waiting materialization, in put order
        self._events: dict[tuple[str, dg.AssetKey], dg.AssetMaterialization] = {}
        self._lines: list[str] = []
        self._writing = False
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="event-writer", daemon=True)
        self._thread.start()

    def put(self, events: Iterable[dg.AssetMaterialization], line: str | None = None) -> None:
        """Queue ``events`` (replacing an asset's waiting one) and ``line``; raises what the
        thread failed with since."""
        with self._cond:
            self._raise()
            for event in events:
                # the changefeed whose tables it reports ("" where it does not say)
                key = (str(metadata_value(event.metadata, "changefeed") or ""), event.asset_key)
                self._events.pop(key, None)  # the newest goes last
                self._events[key] = event
            if line is not None:
                self._lines.append(line)
            self._cond.notify()

    def waiting(self) -> int:
        """Materializations and lines queued, not yet being written."""
        with self._cond:
            return len(self._events) + len(self._lines)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything queued is written (False: ``timeout_s`` passed first);
        raises what the thread failed with."""
        with self._cond:
            done = self._cond.wait_for(
                lambda: (
                    self._error is not None or not (self._events or self._lines or self._writing)
                ),
                timeout=timeout_s,
            )
            self._raise()
            return done

    def close(self) -> None:
        """Write what is queued, stop the thread; raises what it failed with."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        with self._cond:
            self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error  # for good: nothing is written after it

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._events or self._lines or self._closed)
                if not (self._events or self._lines):
                    return  # closed, nothing left
                events, self._events = list(self._events.values()), {}
                lines, self._lines = self._lines, []
                self._writing = True
            try:
                for event in events:
                    self._log_event(event)
                for line in lines:
                    self._log_info(line)
            except BaseException as exc:  # raised in the loop by put / flush / close
                with self._cond:
                    self._error, self._writing = exc, False
                    self._events, self._lines = {}, []
                    self._cond.notify_all()
                return
            with self._cond:
                self._writing = False
                self._cond.notify_all()

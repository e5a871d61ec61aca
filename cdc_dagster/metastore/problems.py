"""What keeps a changefeed from moving, as the part that ran into it sees it.

One key per (changefeed, source), ``problem/<changefeed>/<source>`` (JSON), where the source
is a capture id (written with the capture's report, under its lease: it goes with the
capture), ``puller`` (the binlog puller runs), ``ddl`` (applying a DDL downstream, by the
owner or a gated DDL run) or ``syncpoint`` (recording a syncpoint downstream). The owner
reads every problem in its one snapshot read, shows them in the changefeed's state
(warning, with the whole message) and fails the changefeed when one is fatal or lasts too
long; the source clears its key once it works again.

A problem counts its attempts and says when to try again (exponential backoff, capped), so
a broken sink or upstream is retried without hammering it, and without holding up the
other changefeeds of the same capture.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from cdc_dagster.metastore.client import Delete, EtcdClient, KeyValue, Put
from cdc_dagster.metastore.keys import KeyLayout

BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
MAX_MESSAGE_CHARS = 4000
PULLER = "puller"
DDL = "ddl"
SYNCPOINT = "syncpoint"


def backoff_s(attempts: int) -> float:
    """Seconds to wait before attempt ``attempts + 1``: 1, 2, 4, ... capped at a minute."""
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** max(0, attempts - 1))


@dataclass(frozen=True, slots=True)
class Problem:
    """One source's problem with one changefeed."""

    message: str  # what, where, what to do (whole, redacted by the writer)
    since_ms: int  # when it was first seen (this streak)
    attempts: int = 1  # failed attempts in a row
    retry_at_ms: int = 0  # the source tries again from then on
    fatal: bool = False  # retrying cannot help: the changefeed fails at once
    tables: Mapping[int, str] = field(default_factory=dict)  # per-table messages, if any

    def again(self, message: str, now_ms: int, **changes: object) -> Problem:
        """The same problem seen once more (or a new one, if the message changed)."""
        attempts = self.attempts + 1
        return Problem(
            message[:MAX_MESSAGE_CHARS],
            self.since_ms,
            attempts,
            now_ms + int(backoff_s(attempts) * 1000),
            **changes,  # type: ignore[arg-type]
        )

    @staticmethod
    def first(message: str, now_ms: int, **changes: object) -> Problem:
        """A problem seen for the first time."""
        return Problem(
            message[:MAX_MESSAGE_CHARS],
            now_ms,
            1,
            now_ms + int(backoff_s(1) * 1000),
            **changes,  # type: ignore[arg-type]
        )

    def encode(self) -> bytes:
        """JSON of the problem."""
        doc = {
            "v": 1,
            "message": self.message,
            "since_ms": self.since_ms,
            "attempts": self.attempts,
            "retry_at_ms": self.retry_at_ms,
            "fatal": self.fatal,
            "tables": {str(t): m for t, m in sorted(self.tables.items())},
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @staticmethod
    def decode(data: bytes) -> Problem:
        """Inverse of :meth:`encode`; a value it cannot read is itself a problem, not a crash."""
        try:
            doc = json.loads(data)
            return Problem(
                str(doc["message"]),
                int(doc["since_ms"]),
                int(doc.get("attempts", 1)),
                int(doc.get("retry_at_ms", 0)),
                bool(doc.get("fatal", False)),
                {int(t): str(m) for t, m in dict(doc.get("tables", {})).items()},
            )
        except (ValueError, KeyError, TypeError) as exc:
            return Problem(f"unreadable problem record ({exc}): {data[:200]!r}", 0)


def reported(
    previous: Problem | None, message: str, now_ms: int, *, fatal: bool = False, **changes: object
) -> Problem:
    """``message`` as the next report after ``previous`` (attempts counted, backoff set)."""
    if previous is None:
        return Problem.first(message, now_ms, fatal=fatal, **changes)
    return previous.again(message, now_ms, fatal=fatal, **changes)


class ProblemStore:
    """Read and write the problem keys (a capture writes its own in its report transaction)."""

    def __init__(self, client: EtcdClient, layout: KeyLayout) -> None:
        self._client = client
        self._layout = layout

    def get(self, changefeed_id: str, source: str) -> Problem | None:
        """The source's problem with the changefeed, if any."""
        kv = self._client.get(self._layout.problem(changefeed_id, source))
        return Problem.decode(kv.value) if kv is not None else None

    def of(self, changefeed_id: str) -> dict[str, Problem]:
        """Every source's problem with one changefeed."""
        return {
            self._layout.last_segment(kv.key): Problem.decode(kv.value)
            for kv in self._client.get_prefix(self._layout.problems(changefeed_id)).kvs
        }

    def put_op(
        self, changefeed_id: str, source: str, problem: Problem | None, lease: int = 0
    ) -> Put | Delete:
        """The write of ``problem`` (None: the problem is gone), for a transaction."""
        key = self._layout.problem(changefeed_id, source)
        if problem is None:
            return Delete(key)
        return Put(key, problem.encode(), lease)

    def report(
        self, changefeed_id: str, source: str, message: str, now_ms: int, *, fatal: bool = False
    ) -> Problem:
        """Record (or count again) the source's problem; returns it with its next retry time."""
        problem = reported(self.get(changefeed_id, source), message, now_ms, fatal=fatal)
        self._client.put(self._layout.problem(changefeed_id, source), problem.encode())
        return problem

    def clear(self, changefeed_id: str, source: str) -> None:
        """The source works again."""
        self._client.delete(self._layout.problem(changefeed_id, source))


def problems_of(layout: KeyLayout, kvs: list[KeyValue]) -> dict[str, dict[str, Problem]]:
    """Changefeed id -> source -> problem, from a read of the ``problem/`` prefix."""
    out: dict[str, dict[str, Problem]] = {}
    base = layout.problems()
    for kv in kvs:
        cf_id, _, source = kv.key[len(base) :].partition("/")
        out.setdefault(cf_id, {})[source] = Problem.decode(kv.value)
    return out

"""Messages between the owner (Coordinator) and the captures (Agents).

Owner -> capture: :class:`Heartbeat`, :class:`DispatchTableRequest`.
Capture -> owner: :class:`HeartbeatResponse`, :class:`DispatchTableResponse`.
Every envelope carries a :class:`Header` with ``owner_rev``, the capture epoch and the
changefeed epoch; receivers drop envelopes whose header does not match (fencing).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from scheduler_core.errors import InvalidMessageError
from scheduler_core.model import Checkpoint, TableState, TableStatus, check_ts
from scheduler_core.ts import MAX_TS


def check_id(name: str, value: str) -> None:
    """Refuse an id that is not a non-empty str."""
    if not isinstance(value, str) or not value:
        raise InvalidMessageError(f"{name} must be a non-empty str, got {value!r}")


def check_table_id(value: int) -> None:
    """Refuse a table id that is not an int >= 0."""
    if type(value) is not int or value < 0:
        raise InvalidMessageError(f"table_id must be an int >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class AddTableRequest:
    """Owner intent: ``to`` should prepare (``is_secondary``) or start sinking the table from ``checkpoint``."""

    to: str
    table_id: int
    is_secondary: bool
    checkpoint: Checkpoint

    def __post_init__(self) -> None:
        check_id("to", self.to)
        check_table_id(self.table_id)
        if type(self.is_secondary) is not bool:
            raise InvalidMessageError(f"is_secondary must be a bool, got {self.is_secondary!r}")
        if not isinstance(self.checkpoint, Checkpoint):
            raise InvalidMessageError(f"checkpoint must be a Checkpoint, got {self.checkpoint!r}")


@dataclass(frozen=True, slots=True)
class RemoveTableRequest:
    """Owner intent: ``to`` should stop the table and report its final checkpoint."""

    to: str
    table_id: int

    def __post_init__(self) -> None:
        check_id("to", self.to)
        check_table_id(self.table_id)


Dispatch = AddTableRequest | RemoveTableRequest


@dataclass(frozen=True, slots=True)
class Header:
    """Fencing fields every envelope carries."""

    owner_rev: int  # the owner's election revision; higher wins
    capture_epoch: str  # the addressed (or sending) capture's epoch; "" when not yet known
    changefeed_epoch: int  # bumps when the changefeed is (re)created or resumed
    seq: int = 0  # per sender and epoch, strictly increasing: receivers drop older or repeated ones

    def __post_init__(self) -> None:
        if type(self.seq) is not int or self.seq < 0:
            raise InvalidMessageError(f"seq must be an int >= 0, got {self.seq!r}")
        if type(self.owner_rev) is not int or self.owner_rev < 0:
            raise InvalidMessageError(f"owner_rev must be an int >= 0, got {self.owner_rev!r}")
        if not isinstance(self.capture_epoch, str):
            raise InvalidMessageError(f"capture_epoch must be a str, got {self.capture_epoch!r}")
        if type(self.changefeed_epoch) is not int or self.changefeed_epoch < 0:
            raise InvalidMessageError(
                f"changefeed_epoch must be an int >= 0, got {self.changefeed_epoch!r}"
            )


@dataclass(frozen=True, slots=True)
class Barrier:
    """TSs sinks must not pass: one global, plus per-table barriers for DDLs that touch one table.

    ``open_until_ts`` (0: closed) says the global barrier is only how far the owner had read
    the DDL stream: no DDL, table-set change or target ts holds the changefeed below
    ``open_until_ts``. A sink that reads the DDL stream itself may then go past the global
    barrier, up to the first DDL it finds above it, the stream's resolved ts or
    ``open_until_ts``, whichever is lowest (:meth:`open_barrier_ts`). So a capture commits
    new data as soon as it is resolved, without waiting for the owner's next tick to move
    the barrier, and still never passes a DDL the owner has not seen (it stops at it).
    """

    global_barrier_ts: int = MAX_TS
    table_barriers: Mapping[int, int] = field(default_factory=dict)
    open_until_ts: int = 0

    def __post_init__(self) -> None:
        check_ts("global_barrier_ts", self.global_barrier_ts)
        frozen = MappingProxyType(dict(self.table_barriers))
        for table_id, ts in frozen.items():
            check_table_id(table_id)
            check_ts(f"table_barriers[{table_id}]", ts)
        object.__setattr__(self, "table_barriers", frozen)
        check_ts("open_until_ts", self.open_until_ts)
        if self.open_until_ts and self.open_until_ts <= self.global_barrier_ts:
            raise InvalidMessageError(
                f"open_until_ts {self.open_until_ts} must be above global_barrier_ts "
                f"{self.global_barrier_ts} (or 0: a closed barrier)"
            )

    def barrier_ts(self, table_id: int) -> int:
        """The TS table ``table_id`` must not sink past."""
        table_ts = self.table_barriers.get(table_id, MAX_TS)
        return min(self.global_barrier_ts, table_ts)

    def open_barrier_ts(self, table_id: int, stream_ts: int) -> int:
        """The TS the table may sink to for a sink that read the DDL stream: ``stream_ts`` is
        the lower of the stream's resolved ts and its first DDL above the global barrier.

        Closed, or held by a table barrier below the global one: :meth:`barrier_ts`.
        """
        ts = self.barrier_ts(table_id)
        if not self.open_until_ts or ts < self.global_barrier_ts:
            return ts
        return max(ts, min(stream_ts, self.open_until_ts))

    def closed(self) -> Barrier:
        """The same barrier without the opening (a sink that does not read the DDL stream)."""
        return Barrier(self.global_barrier_ts, self.table_barriers)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Barrier):
            return NotImplemented
        return (
            self.global_barrier_ts == other.global_barrier_ts
            and self.open_until_ts == other.open_until_ts
            and dict(self.table_barriers) == dict(other.table_barriers)
        )

    def __hash__(self) -> int:
        return hash(
            (self.global_barrier_ts, self.open_until_ts, frozenset(self.table_barriers.items()))
        )


class Liveness(enum.IntEnum):
    """What a capture says about itself in a heartbeat response."""

    ALIVE = 0  # accepts new tables
    STOPPING = 1  # draining: accepts no new tables


def _readonly_int64(name: str, values: Iterable[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.int64)
    if arr.ndim != 1:
        raise InvalidMessageError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if not arr.flags.writeable and arr.dtype == np.int64:
        return arr
    arr = arr.copy()
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, slots=True, eq=False)
class TableStatusBatch:
    """Many :class:`TableStatus` in columns: what a capture reports each tick, kept compact.

    Arrays are int64 (states as their int values) and read-only once built.
    """

    table_ids: np.ndarray
    states: np.ndarray
    checkpoint_ts: np.ndarray
    resolved_ts: np.ndarray

    def __post_init__(self) -> None:
        for name in ("table_ids", "states", "checkpoint_ts", "resolved_ts"):
            object.__setattr__(self, name, _readonly_int64(name, getattr(self, name)))
        n = len(self.table_ids)
        if not (len(self.states) == len(self.checkpoint_ts) == len(self.resolved_ts) == n):
            raise InvalidMessageError("TableStatusBatch columns must all have the same length")
        if n == 0:
            return
        if self.table_ids.min() < 0:
            raise InvalidMessageError("TableStatusBatch has a negative table_id")
        if self.states.min() < TableState.ABSENT or self.states.max() > TableState.STOPPED:
            raise InvalidMessageError(f"TableStatusBatch has a state outside {list(TableState)}")
        if self.checkpoint_ts.min() < 0 or (self.checkpoint_ts > self.resolved_ts).any():
            raise InvalidMessageError(
                "TableStatusBatch has a negative checkpoint_ts or checkpoint_ts > resolved_ts"
            )
        # Sorted strictly increasing ids (what the status codec decodes) are distinct without
        # a hash pass: np.unique costs ~1.3 ms per 10k rows, x100 captures per owner tick.
        increasing = n == 1 or bool((self.table_ids[1:] > self.table_ids[:-1]).all())
        if not increasing and len(np.unique(self.table_ids)) != n:
            raise InvalidMessageError("TableStatusBatch reports a table_id twice")

    @staticmethod
    def of(statuses: Iterable[TableStatus]) -> TableStatusBatch:
        """Pack statuses into columns."""
        items = list(statuses)
        return TableStatusBatch(
            np.fromiter((s.table_id for s in items), np.int64, len(items)),
            np.fromiter((int(s.state) for s in items), np.int64, len(items)),
            np.fromiter((s.checkpoint.checkpoint_ts for s in items), np.int64, len(items)),
            np.fromiter((s.checkpoint.resolved_ts for s in items), np.int64, len(items)),
        )

    def __len__(self) -> int:
        return len(self.table_ids)

    def __iter__(self) -> Iterator[TableStatus]:
        for i in range(len(self.table_ids)):
            yield self.status_at(i)

    def status_at(self, i: int) -> TableStatus:
        """Row ``i`` as a :class:`TableStatus`."""
        return TableStatus(
            int(self.table_ids[i]),
            TableState(int(self.states[i])),
            Checkpoint(int(self.checkpoint_ts[i]), int(self.resolved_ts[i])),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TableStatusBatch):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, n), getattr(other, n))
            for n in ("table_ids", "states", "checkpoint_ts", "resolved_ts")
        )

    def __hash__(self) -> int:
        return hash(self.table_ids.tobytes())


def _check_envelope(sender: str, to: str, header: Header) -> None:
    check_id("sender", sender)
    check_id("to", to)
    if not isinstance(header, Header):
        raise InvalidMessageError(f"header must be a Header, got {header!r}")


@dataclass(frozen=True, slots=True, eq=False)
class Heartbeat:
    """Owner -> capture, every tick: the tables the owner thinks ``to`` holds, and the barriers."""

    header: Header
    sender: str
    to: str
    table_ids: np.ndarray
    is_stopping: bool = False
    barrier: Barrier = field(default_factory=Barrier)

    def __post_init__(self) -> None:
        _check_envelope(self.sender, self.to, self.header)
        object.__setattr__(self, "table_ids", _readonly_int64("table_ids", self.table_ids))
        if not isinstance(self.barrier, Barrier):
            raise InvalidMessageError(f"barrier must be a Barrier, got {self.barrier!r}")


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    """Capture -> owner: the status of every table the capture holds (and Absent for listed ones it lacks)."""

    header: Header
    sender: str
    to: str
    tables: TableStatusBatch
    liveness: Liveness = Liveness.ALIVE
    registration: str = (
        ""  # the sender's registry token; the owner learns epochs only from the current one
    )

    def __post_init__(self) -> None:
        _check_envelope(self.sender, self.to, self.header)
        if not isinstance(self.registration, str):
            raise InvalidMessageError(f"registration must be a str, got {self.registration!r}")
        if not isinstance(self.tables, TableStatusBatch):
            raise InvalidMessageError(f"tables must be a TableStatusBatch, got {self.tables!r}")
        if not isinstance(self.liveness, Liveness):
            raise InvalidMessageError(f"liveness must be a Liveness, got {self.liveness!r}")


@dataclass(frozen=True, slots=True, eq=False)
class AddTableBatch:
    """Many :class:`AddTableRequest` for one capture, in columns (a burst of adds stays compact)."""

    table_ids: np.ndarray
    is_secondary: np.ndarray  # 1 = prepare, 0 = start sinking
    checkpoint_ts: np.ndarray
    resolved_ts: np.ndarray

    def __post_init__(self) -> None:
        for name in ("table_ids", "is_secondary", "checkpoint_ts", "resolved_ts"):
            object.__setattr__(self, name, _readonly_int64(name, getattr(self, name)))
        n = len(self.table_ids)
        if not (len(self.is_secondary) == len(self.checkpoint_ts) == len(self.resolved_ts) == n):
            raise InvalidMessageError("AddTableBatch columns must all have the same length")
        if n and (
            self.table_ids.min() < 0
            or self.checkpoint_ts.min() < 0
            or (self.checkpoint_ts > self.resolved_ts).any()
            or not np.isin(self.is_secondary, (0, 1)).all()
        ):
            raise InvalidMessageError(
                "AddTableBatch needs table ids >= 0, 0 <= checkpoint_ts <= resolved_ts "
                "and is_secondary in {0, 1}"
            )

    def __len__(self) -> int:
        return len(self.table_ids)

    def requests(self, to: str) -> Iterator[AddTableRequest]:
        """The rows as :class:`AddTableRequest` objects addressed to ``to``."""
        cols = (self.table_ids, self.is_secondary, self.checkpoint_ts, self.resolved_ts)
        for tid, sec, ck, rs in zip(*(c.tolist() for c in cols), strict=True):
            yield AddTableRequest(to, tid, bool(sec), Checkpoint(ck, rs))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AddTableBatch):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, n), getattr(other, n))
            for n in ("table_ids", "is_secondary", "checkpoint_ts", "resolved_ts")
        )

    def __hash__(self) -> int:
        return hash(self.table_ids.tobytes())


@dataclass(frozen=True, slots=True)
class DispatchTableRequest:
    """Owner -> capture: add / remove table requests for ``to`` (all with ``to`` as addressee).

    ``adds`` carries a burst of adds in columns; :meth:`all_requests` yields everything.
    """

    header: Header
    sender: str
    to: str
    requests: tuple[Dispatch, ...]
    adds: AddTableBatch | None = None

    def all_requests(self) -> Iterator[Dispatch]:
        """Every request: the listed ones, then the columnar adds."""
        yield from self.requests
        if self.adds is not None:
            yield from self.adds.requests(self.to)

    def __post_init__(self) -> None:
        if self.adds is not None and not isinstance(self.adds, AddTableBatch):
            raise InvalidMessageError(f"adds must be an AddTableBatch, got {self.adds!r}")
        _check_envelope(self.sender, self.to, self.header)
        object.__setattr__(self, "requests", tuple(self.requests))
        for req in self.requests:
            if not isinstance(req, AddTableRequest | RemoveTableRequest):
                raise InvalidMessageError(f"not a dispatch: {req!r}")
            if req.to != self.to:
                raise InvalidMessageError(
                    f"dispatch for {req.to!r} inside a message to {self.to!r}"
                )


@dataclass(frozen=True, slots=True)
class DispatchTableResponse:
    """Capture -> owner: the state each dispatched table reached (the add/remove responses)."""

    header: Header
    sender: str
    to: str
    statuses: tuple[TableStatus, ...]

    def __post_init__(self) -> None:
        _check_envelope(self.sender, self.to, self.header)
        object.__setattr__(self, "statuses", tuple(self.statuses))
        for status in self.statuses:
            if not isinstance(status, TableStatus):
                raise InvalidMessageError(f"not a TableStatus: {status!r}")


OwnerMessage = Heartbeat | DispatchTableRequest
CaptureMessage = HeartbeatResponse | DispatchTableResponse

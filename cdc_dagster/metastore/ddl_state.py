"""A changefeed's DDL and barrier state, as the owner persists it each tick it changes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from cdc_dagster.metastore.errors import CorruptValueError
from scheduler_core.errors import InvalidMessageError
from scheduler_core.messages import Barrier
from scheduler_core.ts import MAX_TS


@dataclass(frozen=True, slots=True)
class DdlState:
    """The barriers the owner holds, the last DDL it ran, and the last syncpoint it recorded."""

    barrier: Barrier = field(default_factory=Barrier)
    finished_ddl_ts: int = (
        0  # every DDL with commit ts <= it ran downstream (or preceded the start)
    )
    last_syncpoint_ts: int = 0  # the last syncpoint every table reached

    def __post_init__(self) -> None:
        if not isinstance(self.barrier, Barrier):
            raise InvalidMessageError(f"barrier must be a Barrier, got {self.barrier!r}")
        for name in ("finished_ddl_ts", "last_syncpoint_ts"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= MAX_TS:
                raise InvalidMessageError(f"{name} must be an int TS in [0, 2^63), got {value!r}")

    def encode(self) -> bytes:
        """Compact JSON (table barriers as ``{"table_id": ts}``)."""
        return json.dumps(
            {
                "v": 1,
                "global_barrier_ts": self.barrier.global_barrier_ts,
                "table_barriers": {
                    str(t): ts for t, ts in sorted(self.barrier.table_barriers.items())
                },
                "finished_ddl_ts": self.finished_ddl_ts,
                "last_syncpoint_ts": self.last_syncpoint_ts,
            },
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def decode(data: bytes) -> DdlState:
        """Inverse of :meth:`encode`."""
        try:
            raw = json.loads(data)
            if raw["v"] != 1:
                raise ValueError(f"unknown format version {raw['v']!r}")
            barrier = Barrier(
                raw["global_barrier_ts"],
                {int(t): ts for t, ts in raw["table_barriers"].items()},
            )
            return DdlState(barrier, raw["finished_ddl_ts"], raw["last_syncpoint_ts"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptValueError(f"DDL state {data[:120]!r} does not decode: {exc}") from exc

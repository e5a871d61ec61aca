"""A lossy message bus: delays, drops, duplicates and (through random delays) reorders."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Faults:
    """Per-message fault probabilities; all zero is a perfect network."""

    drop: float = 0.0
    duplicate: float = 0.0
    max_delay: int = 0  # ticks; a random delay in [0, max_delay] also reorders

    @property
    def none(self) -> bool:
        """No faults at all."""
        return self.drop == 0 and self.duplicate == 0 and self.max_delay == 0


@dataclass(slots=True)
class Bus:
    """Messages in flight, keyed by the tick they arrive."""

    rng: random.Random
    faults: Faults = field(default_factory=Faults)
    _inflight: list[tuple[int, int, Any]] = field(default_factory=list)
    _n: int = 0
    sent: int = 0
    dropped: int = 0
    duplicated: int = 0

    def send(self, now: int, msg: Any) -> None:
        """Put a message on the wire (it may be lost, copied or late)."""
        self.sent += 1
        copies = 1
        if self.rng.random() < self.faults.drop:
            self.dropped += 1
            copies = 0
        elif self.rng.random() < self.faults.duplicate:
            self.duplicated += 1
            copies = 2
        for _ in range(copies):
            delay = self.rng.randint(0, self.faults.max_delay) if self.faults.max_delay else 0
            self._n += 1
            self._inflight.append((now + delay, self._n, msg))

    def deliver(self, now: int, to: str) -> list[Any]:
        """Messages for ``to`` that have arrived by ``now``, in arrival order."""
        ready = [m for m in self._inflight if m[0] <= now and m[2].to == to]
        if not ready:
            return []
        keep = [m for m in self._inflight if not (m[0] <= now and m[2].to == to)]
        self._inflight = keep
        ready.sort(key=lambda m: (m[0], m[1]))
        return [m[2] for m in ready]

    def drop_for(self, to: str) -> None:
        """Lose everything in flight to ``to`` (it crashed)."""
        self._inflight = [m for m in self._inflight if m[2].to != to]

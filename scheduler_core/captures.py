"""CaptureManager: the owner's view of capture membership and liveness.

A capture is Uninitialized when it joins (or when the owner starts), Initialized after
its first heartbeat response, and Stopping once it says it drains. The first capture
epoch the owner sees in a response is kept; responses with another epoch are ignored
(a restarted capture re-registers, which is a leave plus a join). Scheduling waits until
every alive capture is Initialized, so a new owner never re-adds a table that a capture it
has not heard from yet still holds (the no-double-write argument of TiCDC's design doc).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler_core.messages import HeartbeatResponse, Liveness, TableStatusBatch

log = logging.getLogger(__name__)


class CaptureState(enum.IntEnum):
    """Owner-side state of one capture."""

    UNINITIALIZED = 0  # alive in the registry, no response since it joined or the owner started
    INITIALIZED = 1  # has reported its tables; may receive tables
    STOPPING = 2  # draining: receives no new tables


@dataclass(slots=True)
class CaptureStatus:
    """What the owner knows of one capture."""

    capture_id: str
    registration: str  # registry token (lease / registration revision); a change = a restart
    state: CaptureState = CaptureState.UNINITIALIZED
    epoch: str = ""  # the capture's epoch, learnt from its first response
    last_seq: int = -1
    # The last full report, kept for the owner-switch rebuild.
    tables: TableStatusBatch | None = None

    @property
    def schedulable(self) -> bool:
        """May receive new tables."""
        return self.state == CaptureState.INITIALIZED


@dataclass(frozen=True, slots=True)
class CaptureChanges:
    """What a membership update changed."""

    joined: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


@dataclass(slots=True)
class CaptureManager:
    """Tracks alive captures, their epochs and their initialization."""

    captures: dict[str, CaptureStatus] = field(default_factory=dict)

    def update_alive(self, alive: Mapping[str, str]) -> CaptureChanges:
        """Apply the registry's alive set ``{capture_id: registration}``; returns joins/removals."""
        removed = [
            cid
            for cid, st in self.captures.items()
            if cid not in alive or alive[cid] != st.registration
        ]
        for cid in removed:
            log.info("capture %s left (or re-registered)", cid)
            del self.captures[cid]
        joined = [cid for cid in alive if cid not in self.captures]
        for cid in joined:
            self.captures[cid] = CaptureStatus(cid, alive[cid])
        return CaptureChanges(tuple(sorted(joined)), tuple(sorted(removed)))

    def accept(self, capture_id: str, epoch: str, seq: int) -> bool:
        """Whether a message from ``capture_id`` with this epoch and seq is current."""
        st = self.captures.get(capture_id)
        if st is None:
            log.debug("drop message from unknown capture %s", capture_id)
            return False
        if st.epoch and epoch != st.epoch:
            log.debug("drop message from %s with epoch %s (known %s)", capture_id, epoch, st.epoch)
            return False
        if st.epoch and seq <= st.last_seq:
            log.debug("drop stale message from %s seq %s <= %s", capture_id, seq, st.last_seq)
            return False
        return True

    def handle_response(self, resp: HeartbeatResponse) -> bool:
        """Record a heartbeat response that :meth:`accept` let through; False if ignored.

        The epoch is learnt only from a response of the current registration: a late
        report of a previous incarnation (same capture id, older lease) must not pin it.
        """
        st = self.captures[resp.sender]
        if not st.epoch:
            if resp.registration != st.registration:
                log.debug(
                    "drop report of %s from registration %r (current %r)",
                    resp.sender,
                    resp.registration,
                    st.registration,
                )
                return False
            st.epoch = resp.header.capture_epoch
        st.last_seq = resp.header.seq
        st.tables = resp.tables
        if resp.liveness == Liveness.STOPPING:
            st.state = CaptureState.STOPPING
        elif st.state == CaptureState.UNINITIALIZED:
            st.state = CaptureState.INITIALIZED
        return True

    def note_seq(self, capture_id: str, seq: int) -> None:
        """Record the seq of a dispatch response that :meth:`accept` let through."""
        st = self.captures[capture_id]
        st.last_seq = max(st.last_seq, seq)

    def all_initialized(self) -> bool:
        """True when every alive capture has reported since it joined (or the owner started)."""
        return bool(self.captures) and all(
            st.state != CaptureState.UNINITIALIZED for st in self.captures.values()
        )

    def epoch_of(self, capture_id: str) -> str:
        """The capture's epoch as known to the owner ("" if not yet known)."""
        return self.captures[capture_id].epoch

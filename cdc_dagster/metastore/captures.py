"""The capture registry: each capture's key lives under its own lease.

A registration takes a fresh lease, and the capture's epoch is that lease's id, so the
epoch rotates on every registration and dies with the lease. Capture-guarded writes
compare the registry key's lease with the session's, so a capture whose lease expired
(or that was replaced by a newer registration) has its writes refused.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from cdc_dagster.metastore.client import (
    Compare,
    CompareTarget,
    EtcdClient,
    LeaseGrant,
    Op,
    PrefixWatch,
    Put,
    RangeResult,
    TxnResult,
    WatchEvent,
    WatchEventType,
    create_revision_is,
    lease_is,
)
from cdc_dagster.metastore.errors import (
    CaptureNotRegisteredError,
    CorruptValueError,
    InvalidArgumentError,
)
from cdc_dagster.metastore.keys import KeyLayout, check_segment
from cdc_dagster.metastore.lease import LeaseKeeper
from cdc_dagster.secrets import redact_bytes

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CaptureInfo:
    """A registered capture: its id, the epoch of this registration, and where it runs."""

    capture_id: str
    epoch: str
    address: str = ""

    def __post_init__(self) -> None:
        check_segment("capture_id", self.capture_id)
        if not self.epoch:
            raise InvalidArgumentError(f"capture {self.capture_id!r} needs a non-empty epoch")

    def encode(self) -> bytes:
        """The registry value (JSON)."""
        return json.dumps(
            {"v": 1, "capture_id": self.capture_id, "epoch": self.epoch, "address": self.address},
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def decode(data: bytes) -> CaptureInfo:
        """Inverse of :meth:`encode`."""
        try:
            raw: Any = json.loads(data)
            return CaptureInfo(str(raw["capture_id"]), str(raw["epoch"]), str(raw["address"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptValueError(
                f"capture registry value {redact_bytes(data[:80])}: {exc}"
            ) from exc


class CaptureSession:
    """One registration of a capture; fenced by its lease."""

    def __init__(
        self, client: EtcdClient, layout: KeyLayout, info: CaptureInfo, keeper: LeaseKeeper
    ) -> None:
        self._client = client
        self._layout = layout
        self.info = info
        self.keeper = keeper

    @property
    def capture_id(self) -> str:
        """The capture's id."""
        return self.info.capture_id

    @property
    def epoch(self) -> str:
        """This registration's epoch (dispatches for another epoch are rejected)."""
        return self.info.epoch

    @property
    def lease_id(self) -> int:
        """The registration's lease; task status keys are attached to it too."""
        return self.keeper.lease_id

    def guard(self) -> Compare:
        """The compare that makes a write land only while this registration is current."""
        return lease_is(self._layout.capture(self.capture_id), self.lease_id)

    def keep_alive(self) -> int:
        """Refresh the lease once (a capture run does this each tick); returns the TTL."""
        return self.keeper.refresh()

    def alive(self) -> bool:
        """This process's belief that the registration is still held."""
        return self.keeper.alive()

    def txn(self, success: Sequence[Op]) -> TxnResult:
        """A capture-guarded transaction; raises CaptureNotRegisteredError when refused."""
        result = self._client.txn([self.guard()], success)
        if not result.succeeded:
            raise CaptureNotRegisteredError(
                f"capture {self.capture_id!r} epoch {self.epoch} is no longer registered (its "
                "lease expired or a newer registration replaced it); its write was refused: "
                "register again and wait for the owner's dispatches"
            )
        return result

    def deregister(self) -> None:
        """Leave the cluster now: revoking the lease deletes the registry and task keys."""
        self.keeper.stop()
        self._client.revoke_lease(self.lease_id)


class CaptureRegistry:
    """Register captures, list the alive ones, watch them come and go; and the captures the
    user asked for (desired state: the owner registers one again whose lease expired)."""

    def __init__(self, client: EtcdClient, layout: KeyLayout) -> None:
        self._client = client
        self._layout = layout

    def desire(self, capture_id: str, ttl_s: int) -> None:
        """Remember that the user wants ``capture_id`` (with this lease TTL) until removed."""
        value = json.dumps({"v": 1, "ttl_s": int(ttl_s)}, separators=(",", ":")).encode()
        self._client.put(self._layout.desired_capture(capture_id), value)

    def undesire(self, capture_id: str) -> None:
        """The user removed ``capture_id``: it is no longer registered again."""
        self._client.delete(self._layout.desired_capture(capture_id))

    def register_desired(self, capture_id: str, ttl_s: int) -> CaptureInfo | None:
        """Register ``capture_id`` again (a new lease, a new epoch) if it is still desired and
        has no registration; None when another process or a removal got there first."""
        grant = self._client.grant_lease(ttl_s)
        info = CaptureInfo(capture_id, f"{grant.lease_id:016x}")
        key = self._layout.capture(capture_id)
        result = self._client.txn(
            [
                Compare(self._layout.desired_capture(capture_id), CompareTarget.CREATE, ">", 0),
                create_revision_is(key, 0),
            ],
            [Put(key, info.encode(), grant.lease_id)],
        )
        if not result.succeeded:
            self._client.revoke_lease(grant.lease_id)
            return None
        _log.info("capture %s registered again with epoch %s", capture_id, info.epoch)
        return info

    def desired(self) -> dict[str, int]:
        """Capture id -> lease TTL of every capture the user asked for."""
        return desired_of(self._layout, self._client.get_prefix(self._layout.desired_captures).kvs)

    def register(
        self, capture_id: str, ttl_s: int, *, address: str = "", keepalive: bool = True
    ) -> CaptureSession:
        """Register (or re-register) a capture under a new lease and so a new epoch."""
        grant = self._client.grant_lease(ttl_s)
        info = CaptureInfo(capture_id, f"{grant.lease_id:016x}", address)
        self._client.put(self._layout.capture(capture_id), info.encode(), grant.lease_id)
        keeper = LeaseKeeper(self._client, grant)
        if keepalive:
            keeper.start()
        _log.info("capture %s registered with epoch %s", capture_id, info.epoch)
        return CaptureSession(self._client, self._layout, info, keeper)

    def attach(self, capture_id: str) -> CaptureSession:
        """The capture's current registration, for a later process of the same capture.

        A Dagster capture run is a new process each time: it attaches, renews the lease
        with :meth:`CaptureSession.keep_alive`, and writes under the same fencing.
        """
        kv = self._client.get(self._layout.capture(capture_id))
        if kv is None or not kv.lease:
            raise CaptureNotRegisteredError(
                f"capture {capture_id!r} is not registered (or its lease expired); register it"
            )
        info = CaptureInfo.decode(kv.value)
        lease = self._client.lease_ttl(kv.lease)
        if lease.ttl_s < 0:  # -1: gone (0: under a second left)
            raise CaptureNotRegisteredError(f"capture {capture_id!r}'s lease has just expired")
        grant = LeaseGrant(kv.lease, lease.granted_ttl_s)
        return CaptureSession(self._client, self._layout, info, LeaseKeeper(self._client, grant))

    def get(self, capture_id: str) -> CaptureInfo | None:
        """The capture's current registration, or None."""
        kv = self._client.get(self._layout.capture(capture_id))
        return CaptureInfo.decode(kv.value) if kv is not None else None

    def list_alive(self) -> list[CaptureInfo]:
        """Every registered capture whose lease has not expired, by id."""
        return list(_decode_all(self._client.get_prefix(self._layout.captures)).values())

    def watch(
        self, on_change: Callable[[MappingProxyType[str, CaptureInfo]], None]
    ) -> CaptureWatch:
        """Follow the alive set; ``on_change`` gets the whole set after every change."""
        return CaptureWatch(self._client, self._layout, on_change).start()


def desired_of(layout: KeyLayout, kvs: Sequence[Any]) -> dict[str, int]:
    """Capture id -> lease TTL, from a read of the desired captures (a bad value: 60 s)."""
    out = {}
    for kv in kvs:
        try:
            ttl = int(json.loads(kv.value)["ttl_s"])
        except (ValueError, KeyError, TypeError):
            _log.warning("desired capture %s: unreadable value; lease TTL 60 s", kv.key)
            ttl = 60
        out[layout.last_segment(kv.key)] = ttl
    return out


def _decode_all(snapshot: RangeResult) -> dict[str, CaptureInfo]:
    captures = {}
    for kv in snapshot.kvs:
        info = CaptureInfo.decode(kv.value)
        captures[info.capture_id] = info
    return captures


class CaptureWatch:
    """The alive captures, kept current by a watch that re-lists after etcd restarts."""

    def __init__(
        self,
        client: EtcdClient,
        layout: KeyLayout,
        on_change: Callable[[MappingProxyType[str, CaptureInfo]], None] | None = None,
    ) -> None:
        self._layout = layout
        self._on_change = on_change
        self._alive: dict[str, CaptureInfo] = {}
        self._changed = threading.Condition()
        self._watch = PrefixWatch(client, layout.captures, self._reset, self._apply)

    def start(self) -> CaptureWatch:
        """Start following (the first listing arrives shortly after)."""
        self._watch.start()
        return self

    def stop(self) -> None:
        """Stop following."""
        self._watch.stop()

    def alive(self) -> MappingProxyType[str, CaptureInfo]:
        """The alive captures as last seen."""
        with self._changed:
            return MappingProxyType(dict(self._alive))

    def wait_for(
        self, predicate: Callable[[MappingProxyType[str, CaptureInfo]], bool], timeout_s: float
    ) -> bool:
        """Block until ``predicate(alive)`` holds or the timeout passes; returns whether it held."""
        with self._changed:
            return self._changed.wait_for(
                lambda: predicate(MappingProxyType(dict(self._alive))), timeout_s
            )

    def _reset(self, snapshot: RangeResult) -> None:
        self._publish(_decode_all(snapshot))

    def _apply(self, events: list[WatchEvent]) -> None:
        alive = dict(self._alive)
        for event in events:
            capture_id = self._layout.last_segment(event.kv.key)
            if event.type is WatchEventType.DELETE:
                alive.pop(capture_id, None)
            else:
                alive[capture_id] = CaptureInfo.decode(event.kv.value)
        self._publish(alive)

    def _publish(self, alive: dict[str, CaptureInfo]) -> None:
        with self._changed:
            self._alive = alive
            self._changed.notify_all()
        if self._on_change is not None:
            self._on_change(MappingProxyType(dict(alive)))

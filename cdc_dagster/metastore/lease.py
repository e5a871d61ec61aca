"""Keeping a lease alive from a background thread, and knowing when it was lost."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cdc_dagster.metastore.client import EtcdClient, LeaseGrant
from cdc_dagster.metastore.errors import (
    ClientClosedError,
    EtcdUnavailableError,
    LeaseExpiredError,
)

_log = logging.getLogger(__name__)


class LeaseKeeper:
    """Refreshes one lease every ``ttl/3`` until stopped, or until etcd says it expired.

    :meth:`alive` is this process's own belief: false once etcd reported the lease gone,
    or once no refresh succeeded for a whole TTL (etcd may have expired it meanwhile).
    Fencing never relies on this belief: guarded writes are judged by etcd.
    """

    def __init__(
        self,
        client: EtcdClient,
        grant: LeaseGrant,
        *,
        on_lost: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.grant = grant
        self._on_lost = on_lost
        self._clock = clock
        self._last_ok = clock()
        self._expired = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lease_id(self) -> int:
        """The lease being kept."""
        return self.grant.lease_id

    def alive(self) -> bool:
        """True while the lease is believed held (see the class docstring)."""
        return not self._expired and self._clock() - self._last_ok < self.grant.ttl_s

    def refresh(self) -> int:
        """One keep-alive now; returns the new TTL or raises LeaseExpiredError."""
        try:
            ttl = self._client.keep_alive_once(self.lease_id)
        except LeaseExpiredError:
            self._mark_lost()
            raise
        self._last_ok = self._clock()
        return ttl

    def start(self) -> LeaseKeeper:
        """Refresh from a daemon thread until :meth:`stop` or the lease is lost."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"lease {self.lease_id:x}", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop refreshing (the lease then expires after its TTL unless revoked)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        interval = max(self.grant.ttl_s / 3, 0.2)
        while not self._stop.wait(interval):
            try:
                self.refresh()
            except LeaseExpiredError:
                _log.warning("lease %x expired; stopping its keep-alive", self.lease_id)
                return
            except ClientClosedError:
                return
            except EtcdUnavailableError as exc:
                _log.warning("keep-alive of lease %x failed: %s", self.lease_id, exc)

    def _mark_lost(self) -> None:
        if not self._expired:
            self._expired = True
            self._stop.set()
            if self._on_lost is not None:
                self._on_lost()

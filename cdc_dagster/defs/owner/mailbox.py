"""The sensor's outbox kept in etcd, where a capture's queued run can take it when it starts.

What :func:`~cdc_dagster.defs.owner.plan.plan` calls of an outbox, as the in-memory
:class:`~cdc_dagster.defs.owner.plan.Outbox` (planning without etcd: tests); the store and its ordering argument are in
``cdc_dagster/metastore/mailbox.py``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from cdc_dagster.metastore.mailbox import MailboxStore, merge


class MailboxOutbox:
    """Held messages in the capture mailboxes of etcd, written only by the owner sensor."""

    def __init__(self, store: MailboxStore) -> None:
        self.store = store
        self.owner_rev = 0
        self._present: set[str] = set()  # captures with a mailbox key (listed by forget)
        # capture -> the etcd revision of its mailbox after this outbox last put messages
        # there (the owner sensor waits for the capture's tick after it: owner/sensor.py)
        self.marks: dict[str, int] = {}

    def new_owner(self, owner_rev: int) -> None:
        """This tick's owner (mailboxes of older owners are dropped when read)."""
        self.owner_rev = owner_rev

    def forget(self, alive: Collection[str]) -> None:
        """Drop the mailboxes of captures that left; note which captures have one."""
        self._present = self.store.forget(alive)

    def hold(self, capture_id: str, work: Mapping[str, list[dict[str, Any]]]) -> None:
        """Keep ``work`` for the capture's queued run (or its next one)."""
        if self.store.hold(capture_id, self.owner_rev, work):
            self._present.add(capture_id)
            self.marks[capture_id] = self.store.revision(capture_id)

    def take(
        self, capture_id: str, work: Mapping[str, list[dict[str, Any]]]
    ) -> dict[str, list[dict[str, Any]]]:
        """What the capture's new run carries: whatever its last run did not take, then ``work``."""
        held = self.store.take(capture_id, self.owner_rev) if capture_id in self._present else {}
        self._present.discard(capture_id)
        return merge(held, work)

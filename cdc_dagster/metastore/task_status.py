"""Per-capture table statuses: one compact key per capture per changefeed.

A capture writes its key each tick (guarded by its registration and attached to its lease,
so it disappears with the capture); the owner reads all of a changefeed's keys with one
range read: O(captures) keys, whatever the number of tables.
"""

from __future__ import annotations

from collections.abc import Iterable

from cdc_dagster.metastore.captures import CaptureSession
from cdc_dagster.metastore.client import EtcdClient, KeyValue, Put
from cdc_dagster.metastore.keys import KeyLayout
from cdc_dagster.metastore.status_codec import TaskStatus, decode, encode


class TaskStatusStore:
    """Write a capture's table statuses; read a changefeed's from every capture."""

    def __init__(self, client: EtcdClient, layout: KeyLayout) -> None:
        self._client = client
        self._layout = layout

    def put(self, session: CaptureSession, changefeed_id: str, status: TaskStatus) -> int:
        """Write ``status`` for ``session``'s capture; refused once the registration is gone."""
        key = self._layout.task(changefeed_id, session.capture_id)
        return session.txn([Put(key, encode(status), session.lease_id)]).revision

    def read(self, changefeed_id: str) -> dict[str, TaskStatus]:
        """Every capture's latest status for the changefeed, by capture id."""
        return decode_tasks(
            self._layout, self._client.get_prefix(self._layout.tasks(changefeed_id)).kvs
        )


def decode_tasks(layout: KeyLayout, kvs: Iterable[KeyValue]) -> dict[str, TaskStatus]:
    """Decode task status keys (of one changefeed) by capture id."""
    return {layout.last_segment(kv.key): decode(kv.value) for kv in kvs}

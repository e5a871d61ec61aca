"""Owner messages waiting for a capture's next run: one key per capture, taken atomically.

A capture runs one tick at a time (one Dagster run per capture in the run queue). While a
run of a capture is queued, the owner sensor requests no other one; the messages of its
later ticks wait here (``{prefix}mailbox/{capture_id}``). Whoever comes first takes them,
all at once, in order:

- the queued run itself, when it starts (its receive op): it then acts on the owner's
  newest heartbeat (barriers, resolved ts) instead of the one of the tick that requested
  it, which is older by the run's wait in the queue and its launch;
- else the capture's next run, whose run config the sensor fills with them.

So every message reaches one run, in the order the owner sent it, and runs of a capture
execute one after another: the order a capture sees its messages never changes. A
heartbeat supersedes a waiting heartbeat of the same changefeed; dispatches are all kept.
Messages of an older owner (``owner_rev``) are dropped: captures refuse them anyway; a
stale owner cannot overwrite a newer owner's messages. Every change is a compare-and-swap
on the key's mod revision, retried on conflict.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from cdc_dagster.metastore.client import Delete, EtcdClient, Get, Put, mod_revision_is
from cdc_dagster.metastore.keys import KeyLayout

Work = dict[str, list[dict[str, Any]]]  # changefeed id -> encoded owner messages

_MAX_ATTEMPTS = 20


def merge(
    held: Mapping[str, list[dict[str, Any]]], work: Mapping[str, list[dict[str, Any]]]
) -> Work:
    """``held`` then ``work``: a heartbeat in ``work`` supersedes held heartbeats of its
    changefeed; every other message is kept, in order."""
    out: Work = {cf: list(msgs) for cf, msgs in held.items()}
    for cf, msgs in work.items():
        kept = out.setdefault(cf, [])
        if any(m.get("type") == "heartbeat" for m in msgs):
            kept[:] = [m for m in kept if m.get("type") != "heartbeat"]
        kept.extend(msgs)
    return {cf: msgs for cf, msgs in out.items() if msgs}


class MailboxStore:
    """Hold messages for a capture; take them (see the module docstring)."""

    def __init__(self, client: EtcdClient, layout: KeyLayout) -> None:
        self._client = client
        self._layout = layout

    @property
    def prefix(self) -> str:
        """Every capture's mailbox key starts with this."""
        return self._layout.mailboxes

    def key(self, capture_id: str) -> str:
        """``capture_id``'s mailbox key."""
        return self._layout.mailbox(capture_id)

    def _read(self, key: str) -> tuple[int, int, Work]:
        kv = self._client.get(key)
        if kv is None:
            return 0, 0, {}
        try:
            doc = json.loads(kv.value)
            return kv.mod_revision, int(doc["owner_rev"]), dict(doc["work"])
        except (ValueError, KeyError, TypeError):  # corrupt: nothing usable is held
            return kv.mod_revision, 0, {}

    def hold(
        self, capture_id: str, owner_rev: int, work: Mapping[str, list[dict[str, Any]]]
    ) -> bool:
        """Append ``work`` of owner ``owner_rev``; False (nothing written) when a newer owner
        already holds messages for the capture."""
        key = self.key(capture_id)
        for _ in range(_MAX_ATTEMPTS):
            rev, held_rev, held = self._read(key)
            if held_rev > owner_rev:
                return False
            merged = merge(held if held_rev == owner_rev else {}, work)
            value = json.dumps({"owner_rev": owner_rev, "work": merged}, separators=(",", ":"))
            ops = [Put(key, value.encode())] if merged else [Delete(key)]
            if self._client.txn([mod_revision_is(key, rev)], ops).succeeded:
                return True
        raise RuntimeError(f"mailbox of {capture_id}: {_MAX_ATTEMPTS} conflicting writers in a row")

    def take(self, capture_id: str, owner_rev: int) -> Work:
        """Remove and return what owner ``owner_rev`` holds for the capture (messages of an
        older owner are removed and dropped; a newer owner's are left alone)."""
        key = self.key(capture_id)
        for _ in range(_MAX_ATTEMPTS):
            rev, held_rev, held = self._read(key)
            if rev == 0 or held_rev > owner_rev:
                return {}
            if self._client.txn([mod_revision_is(key, rev)], [Delete(key)]).succeeded:
                return held if held_rev == owner_rev else {}
        raise RuntimeError(f"mailbox of {capture_id}: {_MAX_ATTEMPTS} conflicting writers in a row")

    def revision(self, capture_id: str) -> int:
        """The etcd revision of the capture's mailbox's last write (0: it has none)."""
        return self._read(self.key(capture_id))[0]

    def held(self, capture_id: str) -> int:
        """How many messages wait for ``capture_id`` (of any owner)."""
        return sum(len(m) for m in self._read(self.key(capture_id))[2].values())

    def forget(self, alive: Collection[str]) -> set[str]:
        """Remove the mailboxes of captures not in ``alive``; the alive captures that have one."""
        present = set()
        listing = self._client.txn([], [Get(self.prefix, prefix=True, keys_only=True)])
        for kv in listing.reads[0]:
            capture_id = self._layout.last_segment(kv.key)
            if capture_id in alive:
                present.add(capture_id)
            else:
                self._client.txn([mod_revision_is(kv.key, kv.mod_revision)], [Delete(kv.key)])
        return present

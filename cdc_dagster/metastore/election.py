"""Owner election: one key held under a lease; ``owner_rev`` is that key's create revision.

Every owner write is a transaction guarded on ``create_revision(owner key) == owner_rev``.
When the owner's lease expires etcd deletes the key, and a new owner re-creates it at a
higher revision, so a zombie owner (paused, partitioned) that wakes up has each write
refused by etcd itself -- no clock on the zombie's side is trusted.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cdc_dagster.metastore.client import (
    Compare,
    Delete,
    EtcdClient,
    Get,
    LeaseGrant,
    Op,
    Put,
    TxnResult,
    create_revision_is,
)
from cdc_dagster.metastore.errors import (
    CampaignTimeoutError,
    EtcdUnavailableError,
    NotOwnerError,
)
from cdc_dagster.metastore.keys import KeyLayout, check_segment
from cdc_dagster.metastore.lease import LeaseKeeper

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OwnerInfo:
    """Who holds the election key: the owner's id, its ``owner_rev`` and its lease."""

    owner_id: str
    owner_rev: int
    lease_id: int


class OwnerSession:
    """This process as the owner, until its lease is lost or it resigns.

    Invariant: every write made through :meth:`txn` / :meth:`put` lands only while the
    election key still has create revision ``owner_rev``; otherwise NotOwnerError.
    """

    def __init__(
        self, client: EtcdClient, layout: KeyLayout, info: OwnerInfo, keeper: LeaseKeeper
    ) -> None:
        self._client = client
        self._layout = layout
        self.info = info
        self.keeper = keeper

    @property
    def owner_id(self) -> str:
        """The owner's id (usually its capture id)."""
        return self.info.owner_id

    @property
    def owner_rev(self) -> int:
        """The election revision: higher wins; captures reject lower."""
        return self.info.owner_rev

    def guard(self) -> Compare:
        """The compare that makes a write land only while this session is the owner."""
        return create_revision_is(self._layout.owner, self.owner_rev)

    def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """An owner-guarded transaction.

        Raises NotOwnerError if the owner guard failed. If only the caller's own compares
        failed, returns the result with ``succeeded`` false and the ``failure`` reads.
        """
        owner_key = self._layout.owner
        result = self._client.txn([self.guard(), *compares], success, [Get(owner_key), *failure])
        if result.succeeded:
            return result
        owner_kvs, *rest = result.reads
        current_rev = owner_kvs[0].create_revision if owner_kvs else 0
        if current_rev != self.owner_rev:
            raise NotOwnerError(self.owner_id, self.owner_rev, current_rev)
        return TxnResult(False, result.revision, tuple(rest))

    def put(self, key: str, value: bytes) -> int:
        """An owner-guarded put; returns its revision."""
        return self.txn([], [Put(key, value)]).revision

    def is_owner(self) -> bool:
        """True if the lease is believed held and etcd still shows this session's key."""
        if not self.keeper.alive():
            return False
        kv = self._client.get(self._layout.owner)
        return kv is not None and kv.create_revision == self.owner_rev

    def resign(self) -> None:
        """Give up ownership now (another candidate can win at once)."""
        self.keeper.stop()
        self._client.txn([self.guard()], [Delete(self._layout.owner)])
        self._client.revoke_lease(self.info.lease_id)


class Election:
    """Campaign for and observe the owner key of one cluster."""

    def __init__(self, client: EtcdClient, layout: KeyLayout) -> None:
        self._client = client
        self._layout = layout

    def current_owner(self) -> OwnerInfo | None:
        """The owner now, or None while nobody holds the key."""
        kv = self._client.get(self._layout.owner)
        if kv is None:
            return None
        return OwnerInfo(kv.value.decode(), kv.create_revision, kv.lease)

    def attach(self, owner_id: str) -> OwnerSession | None:
        """``owner_id``'s current ownership, for a later process of the same owner.

        The owner loop is a Dagster sensor whose ticks may run in fresh processes: a tick
        attaches, renews the lease with ``session.keeper.refresh()``, and writes under
        the same ``owner_rev``. Returns None if ``owner_id`` is not the owner.
        """
        kv = self._client.get(self._layout.owner)
        if kv is None or kv.value.decode() != owner_id:
            return None
        lease = self._client.lease_ttl(kv.lease)
        if lease.ttl_s < 0:  # -1: gone (0: under a second left)
            return None
        info = OwnerInfo(owner_id, kv.create_revision, kv.lease)
        grant = LeaseGrant(kv.lease, lease.granted_ttl_s)
        return OwnerSession(self._client, self._layout, info, LeaseKeeper(self._client, grant))

    def try_campaign(self, owner_id: str, ttl_s: int) -> OwnerSession | None:
        """Become the owner if nobody is; returns None (and holds nothing) otherwise."""
        check_segment("owner_id", owner_id)
        grant = self._client.grant_lease(ttl_s)
        session = self._try_with_lease(owner_id, grant)
        if session is None:
            self._client.revoke_lease(grant.lease_id)
        return session

    def campaign(
        self, owner_id: str, ttl_s: int, timeout_s: float, poll_s: float | None = None
    ) -> OwnerSession:
        """Wait until this candidate is the owner, or raise CampaignTimeoutError.

        ``timeout_s`` bounds the whole call, also while etcd is down (the client's retries
        stop at the deadline).
        """
        check_segment("owner_id", owner_id)
        deadline = time.monotonic() + timeout_s
        try:
            with self._client.deadline(timeout_s):
                grant = self._client.grant_lease(ttl_s)
        except EtcdUnavailableError as exc:
            raise CampaignTimeoutError(
                f"{owner_id!r} did not become owner within {timeout_s:.1f}s: {exc}"
            ) from exc
        keeper = LeaseKeeper(self._client, grant).start()
        poll = poll_s if poll_s is not None else min(0.1 * ttl_s, 0.5)
        try:
            while True:
                try:
                    with self._client.deadline(max(deadline - time.monotonic(), 0.05)):
                        session = self._try_with_lease(owner_id, grant, keeper)
                except EtcdUnavailableError as exc:
                    raise CampaignTimeoutError(
                        f"{owner_id!r} did not become owner within {timeout_s:.1f}s: {exc}"
                    ) from exc
                if session is not None:
                    return session
                if time.monotonic() + poll > deadline:
                    raise CampaignTimeoutError(
                        f"{owner_id!r} did not become owner within {timeout_s:.1f}s; the owner "
                        f"is {self._owner_for_message()}"
                    )
                time.sleep(poll)
        except BaseException:
            keeper.stop()
            with contextlib.suppress(EtcdUnavailableError), self._client.deadline(1.0):
                self._client.revoke_lease(grant.lease_id)
            raise

    def _owner_for_message(self) -> str:
        try:
            with self._client.deadline(1.0):
                return str(self.current_owner())
        except EtcdUnavailableError:
            return "unknown (etcd did not answer)"

    def _try_with_lease(
        self, owner_id: str, grant: LeaseGrant, keeper: LeaseKeeper | None = None
    ) -> OwnerSession | None:
        key = self._layout.owner
        result = self._client.txn(
            [create_revision_is(key, 0)],
            [Put(key, owner_id.encode(), grant.lease_id), Get(key)],
            [Get(key)],
        )
        if not result.succeeded:
            return None
        kv = result.reads[0][0]
        info = OwnerInfo(owner_id, kv.create_revision, grant.lease_id)
        _log.info("%s is the owner with owner_rev %d", owner_id, info.owner_rev)
        return OwnerSession(
            self._client, self._layout, info, (keeper or LeaseKeeper(self._client, grant)).start()
        )

"""Our only door to etcd: a small wrapper around ``pyetcd`` that retries through restarts.

Nothing else in cdc_dagster imports ``pyetcd`` or ``grpc``. Calls that fail because etcd
cannot be reached are retried (the gRPC channel reconnects by itself, with a short backoff)
until ``retry_timeout_s``, then raise :class:`EtcdUnavailableError`. Every request and
response is counted in :attr:`EtcdClient.stats` (round trips and protobuf bytes), which the
benchmark reads.

A retried write may already have been applied by the attempt that failed; callers either
guard their writes with a compare that makes a second application a no-op, or (for CAS
updates) stamp a write id into the value and recognise their own write when they re-read.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import pyetcd
from pyetcd import etcdrpc
from pyetcd import events as pyetcd_events
from pyetcd import exceptions as pyetcd_exceptions
from pyetcd import watch as pyetcd_watch

from cdc_dagster.metastore.errors import (
    ClientClosedError,
    EtcdAuthError,
    EtcdUnavailableError,
    InvalidArgumentError,
    InvalidConnectionConfigError,
    InvalidEndpointError,
    InvalidLeaseTtlError,
    LeaseExpiredError,
    MetastoreError,
)
from cdc_dagster.metastore.keys import prefix_end

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Codes after which the request certainly or possibly did not reach a live server.
_TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}
_GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS to etcd: the CA that signed the servers' certificates, and an optional client pair.

    All three are file paths (PEM); they are checked for readability on construction.
    """

    ca_cert: str
    cert_cert: str | None = None
    cert_key: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_cert is None) != (self.cert_key is None):
            raise InvalidConnectionConfigError(
                "etcd TLS: give both the client certificate and its key (cert_cert and "
                "cert_key), or neither"
            )
        for name in ("ca_cert", "cert_cert", "cert_key"):
            path = getattr(self, name)
            if path is None:
                continue
            try:
                with open(path, "rb") as f:
                    head = f.read(64)
            except OSError as exc:
                raise InvalidConnectionConfigError(
                    f"etcd TLS {name} {path!r} cannot be read: {exc.strerror}"
                ) from exc
            if b"-----BEGIN" not in head:
                raise InvalidConnectionConfigError(
                    f"etcd TLS {name} {path!r} is not a PEM file (no '-----BEGIN' line)"
                )

    def credentials(self) -> grpc.ChannelCredentials:
        """The gRPC channel credentials."""

        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        return grpc.ssl_channel_credentials(
            read(self.ca_cert), read(self.cert_key), read(self.cert_cert)
        )


def parse_endpoints(endpoints: str | Sequence[str], *, tls: bool = False) -> list[tuple[str, int]]:
    """``"h1:2379,h2:2379"`` (or a list; an ``http://`` prefix is allowed) to ``[(host, port)]``.

    ``https://`` endpoints need ``tls`` (a :class:`TlsConfig` given to the client).
    """
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    parsed = []
    for item in (i.strip() for i in items):
        if item.startswith("https://") and not tls:
            raise InvalidEndpointError(
                f"etcd endpoint {item!r} is https: pass the CA certificate (connect(..., "
                "tls=TlsConfig(ca_cert='/path/ca.pem')), or use http://host:port"
            )
        if item.startswith("http://") and tls:
            raise InvalidEndpointError(
                f"etcd endpoint {item!r} is plain http but TLS is configured; use https:// or "
                "host:port"
            )
        hostport = item.removeprefix("http://").removeprefix("https://").rstrip("/")
        host, sep, port = hostport.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidEndpointError(
                f"etcd endpoint {item!r} is not host:port (e.g. 127.0.0.1:2379); separate several "
                "with commas"
            )
        parsed.append((host.strip("[]"), int(port)))
    if not parsed:
        raise InvalidEndpointError("no etcd endpoint given; pass --etcd host:port[,host:port...]")
    return parsed


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd stores it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @staticmethod
    def _of(kv: Any) -> KeyValue:
        return KeyValue(
            kv.key.decode(), kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease
        )


class CompareTarget(enum.Enum):
    """What of a key a :class:`Compare` looks at."""

    VERSION = etcdrpc.Compare.VERSION
    CREATE = etcdrpc.Compare.CREATE
    MOD = etcdrpc.Compare.MOD
    VALUE = etcdrpc.Compare.VALUE
    LEASE = etcdrpc.Compare.LEASE


_RESULTS = {
    "==": etcdrpc.Compare.EQUAL,
    "!=": etcdrpc.Compare.NOT_EQUAL,
    "<": etcdrpc.Compare.LESS,
    ">": etcdrpc.Compare.GREATER,
}
_TARGET_FIELD = {
    CompareTarget.VERSION: "version",
    CompareTarget.CREATE: "create_revision",
    CompareTarget.MOD: "mod_revision",
    CompareTarget.VALUE: "value",
    CompareTarget.LEASE: "lease",
}


@dataclass(frozen=True, slots=True)
class Compare:
    """A transaction guard: ``target(key) op value`` (over a range when ``range_end`` is set).

    An absent key compares as 0 (revisions, version, lease).
    """

    key: str
    target: CompareTarget
    op: str
    value: int | bytes
    range_end: str | None = None

    def __post_init__(self) -> None:
        if self.op not in _RESULTS:
            raise InvalidArgumentError(
                f"compare op must be one of {sorted(_RESULTS)}, got {self.op!r}"
            )

    def _message(self) -> Any:
        msg = etcdrpc.Compare(key=self.key.encode(), target=self.target.value)
        msg.result = _RESULTS[self.op]
        if self.range_end is not None:
            msg.range_end = self.range_end.encode()
        setattr(msg, _TARGET_FIELD[self.target], self.value)
        return msg


def create_revision_is(key: str, revision: int) -> Compare:
    """Guard: ``key`` was created at ``revision`` (0: the key does not exist)."""
    return Compare(key, CompareTarget.CREATE, "==", revision)


def mod_revision_is(key: str, revision: int) -> Compare:
    """Guard: ``key`` was last written at ``revision`` (0: the key does not exist)."""
    return Compare(key, CompareTarget.MOD, "==", revision)


def lease_is(key: str, lease_id: int) -> Compare:
    """Guard: ``key`` exists and is attached to ``lease_id``."""
    return Compare(key, CompareTarget.LEASE, "==", lease_id)


def prefix_unchanged_since(prefix: str, revision: int) -> Compare:
    """Guard: no key under ``prefix`` was created or written after ``revision``."""
    return Compare(prefix, CompareTarget.MOD, "<", revision + 1, range_end=prefix_end(prefix))


@dataclass(frozen=True, slots=True)
class Put:
    """Write ``value`` at ``key`` (attached to ``lease`` when non-zero)."""

    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete ``key`` (every key under it when ``prefix``)."""

    key: str
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    """Read ``key`` (every key under it when ``prefix``).

    ``keys_only``: no values (revisions only); ``min_mod_revision``: only keys written at
    or after that revision (both let the owner skip configs it already holds).
    """

    key: str
    prefix: bool = False
    keys_only: bool = False
    min_mod_revision: int = 0


Op = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class RangeResult:
    """The keys a read found, and the store revision it read at."""

    revision: int
    kvs: tuple[KeyValue, ...]


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Which branch ran, the revision after it, and the results of its ``Get`` ops in order."""

    succeeded: bool
    revision: int
    reads: tuple[tuple[KeyValue, ...], ...]


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """A lease: its id, the TTL etcd granted (may exceed the one asked for), what is left."""

    lease_id: int
    ttl_s: int
    granted_ttl_s: int = 0  # set by lease_ttl(); ttl_s is then the time left


class WatchEventType(enum.Enum):
    """What happened to a watched key."""

    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change under a watched prefix (for a delete, ``kv.value`` is empty); ``prev`` is
    the key before it, when the watch asked for it and the key existed."""

    type: WatchEventType
    kv: KeyValue
    prev: KeyValue | None = None


@dataclass(frozen=True, slots=True)
class RpcCounts:
    """Requests sent to etcd and protobuf bytes each way."""

    round_trips: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0

    def __sub__(self, other: RpcCounts) -> RpcCounts:
        return RpcCounts(
            self.round_trips - other.round_trips,
            self.bytes_sent - other.bytes_sent,
            self.bytes_received - other.bytes_received,
        )


class _Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = RpcCounts()

    def add(self, sent: int, received: int) -> None:
        with self._lock:
            c = self._counts
            self._counts = RpcCounts(
                c.round_trips + 1, c.bytes_sent + sent, c.bytes_received + received
            )

    def snapshot(self) -> RpcCounts:
        with self._lock:
            return self._counts


def _op_message(op: Op) -> Any:
    if isinstance(op, Put):
        req = etcdrpc.PutRequest(key=op.key.encode(), value=op.value, lease=op.lease)
        return etcdrpc.RequestOp(request_put=req)
    if isinstance(op, Delete):
        req = etcdrpc.DeleteRangeRequest(key=op.key.encode())
        if op.prefix:
            req.range_end = prefix_end(op.key).encode()
        return etcdrpc.RequestOp(request_delete_range=req)
    if isinstance(op, Get):
        req = _range_request(op.key, op.prefix)
        req.keys_only = op.keys_only
        req.min_mod_revision = op.min_mod_revision
        return etcdrpc.RequestOp(request_range=req)
    raise TypeError(f"not a transaction op: {op!r}")


def _range_request(key: str, prefix: bool) -> Any:
    req = etcdrpc.RangeRequest(key=key.encode())
    if prefix:
        req.range_end = prefix_end(key).encode()
        req.sort_order = etcdrpc.RangeRequest.ASCEND
        req.sort_target = etcdrpc.RangeRequest.KEY
    return req


class EtcdClient:
    """A connection to an etcd cluster (one or more endpoints) that survives etcd restarts."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        rpc_timeout_s: float = 5.0,
        retry_timeout_s: float = 15.0,
        user: str | None = None,
        password: str | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        parsed = parse_endpoints(endpoints, tls=tls is not None)
        self.endpoints = [f"{h}:{p}" for h, p in parsed]
        self.rpc_timeout_s = rpc_timeout_s
        self.retry_timeout_s = retry_timeout_s
        self._stats = _Stats()
        self._closed = False
        self._local = threading.local()
        if (user is None) != (password is None) or user == "":
            raise InvalidConnectionConfigError(
                "etcd authentication needs both a user name and a password (or neither)"
            )
        self._user, self._password = user, password
        self._metadata: tuple[tuple[str, str], ...] | None = None
        creds = tls.credentials() if tls is not None else None
        eps = [
            pyetcd.Endpoint(
                h, p, secure=tls is not None, creds=creds, time_retry=0.2, opts=_GRPC_OPTIONS
            )
            for h, p in parsed
        ]
        self._raw = pyetcd.MultiEndpointEtcd3Client(
            endpoints=eps, timeout=rpc_timeout_s, failover=True
        )
        if user is not None:
            self._authenticate()

    def __repr__(self) -> str:  # never shows the password
        who = f", user={self._user!r}" if self._user else ""
        return f"EtcdClient({self.endpoints!r}{who})"

    def _authenticate(self) -> None:
        req = etcdrpc.AuthenticateRequest(name=self._user, password=self._password)

        def attempt() -> str:
            return str(self._raw.authstub.Authenticate(req, self._rpc_timeout()).token)

        token = self._retrying(f"authenticate as {self._user!r}", attempt, reauth=False)
        self._metadata = (("token", token),)
        self._raw.metadata = self._metadata  # for the watch streams pyetcd opens
        watcher = self._raw._stubs.get("watcher")
        if watcher is not None:  # its next stream (after a break) carries the new token
            watcher._metadata = self._metadata

    @contextlib.contextmanager
    def deadline(self, timeout_s: float) -> Iterator[None]:
        """Within this block, this thread's calls give up after ``timeout_s`` in all.

        Retries through an outage stop at the deadline (EtcdUnavailableError) instead of
        after ``retry_timeout_s``; ``campaign(timeout_s=...)`` relies on it.
        """
        previous = getattr(self._local, "deadline", None)
        mine = time.monotonic() + timeout_s
        self._local.deadline = mine if previous is None else min(previous, mine)
        try:
            yield
        finally:
            self._local.deadline = previous

    def _deadline(self) -> float:
        own = getattr(self._local, "deadline", None)
        default = time.monotonic() + self.retry_timeout_s
        return default if own is None else min(own, default)

    def _rpc_timeout(self) -> float:
        own = getattr(self._local, "deadline", None)
        if own is None:
            return self.rpc_timeout_s
        return max(0.05, min(self.rpc_timeout_s, own - time.monotonic()))

    # --- plumbing ------------------------------------------------------------------------

    @property
    def stats(self) -> RpcCounts:
        """Round trips and bytes so far (subtract two snapshots to measure a span)."""
        return self._stats.snapshot()

    def close(self) -> None:
        """Close the channels; the client cannot be used afterwards."""
        self._closed = True
        self._raw.close()

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _retrying(self, what: str, attempt: Callable[[], _T], reauth: bool = True) -> _T:
        started = time.monotonic()
        deadline = self._deadline()
        delay = 0.05
        while True:
            if self._closed:
                raise ClientClosedError(f"etcd {what}: the client was closed")
            try:
                return attempt()
            except grpc.RpcError as exc:
                code = exc.code()
                if (
                    reauth
                    and self._user is not None
                    and "invalid auth token" in (exc.details() or "")
                ):
                    self._authenticate()  # simple tokens expire (5 min by default)
                    continue
                if code not in _TRANSIENT:
                    raise _translate(what, exc, self.endpoints) from exc
                self._mark_endpoint_failed()
                reason = f"{code.name}: {exc.details()}"
            except pyetcd_exceptions.NoServerAvailableError:
                reason = "every endpoint failed recently"
            except ValueError as exc:  # grpc: "Cannot invoke RPC: Channel closed!"
                if self._closed:
                    raise ClientClosedError(f"etcd {what}: the client was closed") from exc
                raise
            if time.monotonic() + delay > deadline:
                raise EtcdUnavailableError(
                    f"etcd {what} failed for {time.monotonic() - started:.1f}s at {self.endpoints} "
                    f"({reason}); check that etcd is running and reachable"
                )
            _log.debug("etcd %s failed (%s); retrying in %.2fs", what, reason, delay)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _mark_endpoint_failed(self) -> None:
        endpoint = self._raw.endpoint_in_use
        if endpoint is not None:
            endpoint.fail()

    def _unary(self, what: str, stub_name: str, method: str, request: Any) -> Any:
        def attempt() -> Any:
            stub = getattr(self._raw, stub_name)
            response = getattr(stub, method)(request, self._rpc_timeout(), metadata=self._metadata)
            self._stats.add(request.ByteSize(), response.ByteSize())
            return response

        return self._retrying(what, attempt)

    # --- key-value -----------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        """The key, or None if it does not exist."""
        resp = self._unary(f"get {key}", "kvstub", "Range", _range_request(key, prefix=False))
        return KeyValue._of(resp.kvs[0]) if resp.kvs else None

    def get_prefix(self, prefix: str) -> RangeResult:
        """Every key under ``prefix``, sorted by key, read at one revision."""
        resp = self._unary(f"get {prefix}*", "kvstub", "Range", _range_request(prefix, True))
        return RangeResult(resp.header.revision, tuple(KeyValue._of(kv) for kv in resp.kvs))

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Write unconditionally; returns the revision of the write."""
        req = etcdrpc.PutRequest(key=key.encode(), value=value, lease=lease)
        return int(self._unary(f"put {key}", "kvstub", "Put", req).header.revision)

    def delete(self, key: str, prefix: bool = False) -> int:
        """Delete ``key`` (or every key under it); returns how many keys went."""
        req = etcdrpc.DeleteRangeRequest(key=key.encode())
        if prefix:
            req.range_end = prefix_end(key).encode()
        return int(self._unary(f"delete {key}", "kvstub", "DeleteRange", req).deleted)

    def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """Run ``success`` if every compare holds, else ``failure``, atomically."""
        req = etcdrpc.TxnRequest(
            compare=[c._message() for c in compares],
            success=[_op_message(op) for op in success],
            failure=[_op_message(op) for op in failure],
        )
        resp = self._unary("txn", "kvstub", "Txn", req)
        reads = tuple(
            tuple(KeyValue._of(kv) for kv in r.response_range.kvs)
            for r in resp.responses
            if r.WhichOneof("response") == "response_range"
        )
        return TxnResult(bool(resp.succeeded), int(resp.header.revision), reads)

    # --- leases --------------------------------------------------------------------------

    def grant_lease(self, ttl_s: int) -> LeaseGrant:
        """A new lease; keys attached to it vanish ``ttl_s`` after its last keep-alive."""
        if type(ttl_s) is not int or ttl_s < 1:
            # etcd would silently grant its minimum TTL (about 2 s) for 0 or -1.
            raise InvalidLeaseTtlError(
                f"lease TTL {ttl_s!r} must be a whole number of seconds >= 1 (e.g. 10)"
            )
        resp = self._unary(
            "lease grant", "leasestub", "LeaseGrant", etcdrpc.LeaseGrantRequest(TTL=ttl_s)
        )
        if resp.error:
            raise MetastoreError(f"etcd refused a lease of {ttl_s}s: {resp.error}")
        return LeaseGrant(int(resp.ID), int(resp.TTL))

    def keep_alive_once(self, lease_id: int) -> int:
        """Refresh the lease once; returns its new TTL, or raises LeaseExpiredError if it is gone."""
        req = etcdrpc.LeaseKeepAliveRequest(ID=lease_id)

        def attempt() -> int:
            stream = self._raw.leasestub.LeaseKeepAlive(
                iter([req]), self._rpc_timeout(), metadata=self._metadata
            )
            try:
                resp = next(iter(stream))
            finally:
                stream.cancel()
            self._stats.add(req.ByteSize(), resp.ByteSize())
            return int(resp.TTL)

        ttl = self._retrying(f"keep-alive of lease {lease_id:x}", attempt)
        if ttl <= 0:
            raise LeaseExpiredError(
                f"lease {lease_id:x} has expired in etcd; whatever it held (election key, capture "
                "registration) is gone: register or campaign again"
            )
        return ttl

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke the lease (deleting its keys); a lease that is already gone is fine."""
        with contextlib.suppress(LeaseExpiredError):
            self._unary(
                "lease revoke", "leasestub", "LeaseRevoke", etcdrpc.LeaseRevokeRequest(ID=lease_id)
            )

    def lease_ttl(self, lease_id: int) -> LeaseGrant:
        """The lease's granted TTL, with ``ttl_s`` the whole seconds it has left (-1: gone)."""
        req = etcdrpc.LeaseTimeToLiveRequest(ID=lease_id)
        resp = self._unary("lease ttl", "leasestub", "LeaseTimeToLive", req)
        return LeaseGrant(lease_id, int(resp.TTL), int(resp.grantedTTL))

    # --- watches -------------------------------------------------------------------------

    def watch_prefix(
        self,
        prefix: str,
        start_revision: int,
        on_events: Callable[[list[WatchEvent]], None],
        on_broken: Callable[[str], None],
        *,
        prev_kv: bool = False,
    ) -> int:
        """Stream changes under ``prefix`` from ``start_revision`` (0: from now); returns a
        watch id. With ``prev_kv`` each event carries the key as it was before.

        ``on_broken`` is called once if the stream ends (etcd restarted, compaction): the
        caller re-reads and watches again (see :class:`PrefixWatch`).
        """

        def callback(response: Any) -> None:
            if isinstance(response, pyetcd_watch.WatchResponse):
                on_events([_watch_event(e) for e in response.events])
            else:
                on_broken(f"watch on {prefix} ended: {response!r}")

        def attempt() -> int:
            try:
                return int(
                    self._raw.add_watch_prefix_callback(
                        prefix, callback, start_revision=start_revision or None, prev_kv=prev_kv
                    )
                )
            except pyetcd_exceptions.RevisionCompactedError as exc:
                raise _CompactedError(exc.compacted_revision) from exc
            except (pyetcd_exceptions.Etcd3Exception, ValueError) as exc:
                raise _RetryableWatchError(str(exc)) from exc

        return self._retrying_watch(prefix, attempt)

    def _retrying_watch(self, prefix: str, attempt: Callable[[], int]) -> int:
        deadline = time.monotonic() + self.retry_timeout_s
        while True:
            try:
                return attempt()
            except _RetryableWatchError as exc:
                if time.monotonic() > deadline:
                    raise EtcdUnavailableError(
                        f"could not watch {prefix} for {self.retry_timeout_s:.0f}s at "
                        f"{self.endpoints} ({exc}); check that etcd is running"
                    ) from exc
                time.sleep(0.1)

    def cancel_watch(self, watch_id: int) -> None:
        """Stop a watch; a watch whose stream already ended (or etcd gone) is fine."""
        try:
            self._raw.cancel_watch(watch_id)
        except (grpc.RpcError, pyetcd_exceptions.Etcd3Exception, ValueError) as exc:
            _log.debug("cancelling watch %d: %s", watch_id, exc)


class _RetryableWatchError(Exception):
    pass


class _CompactedError(MetastoreError):
    def __init__(self, compacted_revision: int) -> None:
        self.compacted_revision = compacted_revision
        super().__init__(f"watch start revision compacted (now at {compacted_revision})")


def _watch_event(event: Any) -> WatchEvent:
    kind = (
        WatchEventType.DELETE
        if isinstance(event, pyetcd_events.DeleteEvent)
        else WatchEventType.PUT
    )
    raw = event._event
    prev = KeyValue._of(raw.prev_kv) if raw.HasField("prev_kv") else None
    return WatchEvent(kind, KeyValue._of(raw.kv), prev)


_AUTH_HINT = (
    "pass the etcd user and password (connect(..., user=..., password=...); the CLI's "
    "--etcd-user and the CDC_DAGSTER_ETCD_PASSWORD variable)"
)


def _translate(what: str, exc: grpc.RpcError, endpoints: Sequence[str] = ()) -> MetastoreError:
    details = exc.details() or ""
    if "user name is empty" in details:
        return EtcdAuthError(
            f"etcd at {list(endpoints)} has authentication enabled and no user was given "
            f"({what}: {details}); {_AUTH_HINT}"
        )
    if "authentication failed" in details or "permission denied" in details:
        return EtcdAuthError(
            f"etcd at {list(endpoints)} refused {what}: {details}; check the user's password "
            "and its role's permissions on the cluster prefix"
        )
    if exc.code() == grpc.StatusCode.NOT_FOUND and "lease" in details:
        return LeaseExpiredError(
            f"etcd {what}: {details}; the lease has expired: register or campaign again"
        )
    return MetastoreError(f"etcd {what} failed: {exc.code().name}: {details}")


class PrefixWatch:
    """Keeps a view of every key under a prefix current, re-listing after any break.

    ``on_reset(snapshot)`` gets the full set of keys at (re)start; ``on_events(events)``
    gets each change after it. Both run on this watch's threads, one at a time.
    """

    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        on_reset: Callable[[RangeResult], None],
        on_events: Callable[[list[WatchEvent]], None],
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._on_reset = on_reset
        self._on_events = on_events
        self._lock = threading.Lock()
        self._broken = threading.Event()
        self._stopped = threading.Event()
        self._generation = 0
        self._thread = threading.Thread(target=self._run, name=f"watch {prefix}", daemon=True)

    def start(self) -> PrefixWatch:
        """Start watching (returns once the first snapshot was delivered or failed)."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching and wait for the thread."""
        self._stopped.set()
        self._broken.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                watch_id = self._subscribe()
            except ClientClosedError:
                return
            except MetastoreError as exc:
                _log.warning("watch on %s: %s; retrying", self._prefix, exc)
                self._stopped.wait(0.5)
                continue
            self._broken.wait()
            self._broken.clear()
            try:
                self._client.cancel_watch(watch_id)
            except (grpc.RpcError, pyetcd_exceptions.Etcd3Exception, ValueError) as exc:
                _log.debug("cancelling a broken watch on %s: %s", self._prefix, exc)

    def _subscribe(self) -> int:
        snapshot = self._client.get_prefix(self._prefix)
        with self._lock:
            self._generation += 1
            generation = self._generation
            self._on_reset(snapshot)

        def on_events(events: list[WatchEvent]) -> None:
            with self._lock:
                if generation == self._generation:
                    self._on_events(events)

        def on_broken(reason: str) -> None:
            _log.info("%s; re-listing", reason)
            self._broken.set()

        return self._client.watch_prefix(self._prefix, snapshot.revision + 1, on_events, on_broken)

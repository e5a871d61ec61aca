"""The etcd metastore: owner election, capture registry, changefeeds, task statuses, GC safepoint.

Start here: ``start_private_etcd(state_dir)`` once (``cdc-dagster server start``), then
``with connect(None, state_dir) as ms: ...`` in any process attaches to that private etcd;
``connect(["host:2379", ...], ...)`` uses an external cluster. The key layout is in :mod:`cdc_dagster.metastore.keys`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Self

from cdc_dagster.metastore.captures import CaptureInfo, CaptureRegistry, CaptureSession
from cdc_dagster.metastore.changefeeds import (
    Changefeed,
    ChangefeedInfo,
    ChangefeedState,
    ChangefeedStatus,
    ChangefeedStore,
    wall_ms,
)
from cdc_dagster.metastore.client import EtcdClient, RpcCounts, TlsConfig
from cdc_dagster.metastore.ddl_state import DdlState
from cdc_dagster.metastore.election import Election, OwnerInfo, OwnerSession
from cdc_dagster.metastore.errors import *  # noqa: F403 - the error hierarchy is public API
from cdc_dagster.metastore.errors import EtcdNotRunningError, InvalidEndpointError
from cdc_dagster.metastore.etcd_binary import EtcdBinary, choose_etcd_binary
from cdc_dagster.metastore.etcd_process import EtcdTuning
from cdc_dagster.metastore.keys import KeyLayout
from cdc_dagster.metastore.mailbox import MailboxStore
from cdc_dagster.metastore.owner_tick import (
    ChangefeedProgress,
    ConfigCache,
    OwnerSnapshot,
    TickCommit,
    commit_owner_tick,
    read_owner_snapshot,
)
from cdc_dagster.metastore.private_etcd import (
    PrivateEtcdStatus,
    private_etcd_status,
    start_private_etcd,
    stop_private_etcd,
)
from cdc_dagster.metastore.problems import Problem, ProblemStore
from cdc_dagster.metastore.status_codec import TaskStatus
from cdc_dagster.metastore.task_status import TaskStatusStore

_log = logging.getLogger(__name__)

__all__ = [
    "CaptureInfo",
    "CaptureRegistry",
    "CaptureSession",
    "Changefeed",
    "ChangefeedInfo",
    "ChangefeedProgress",
    "ChangefeedState",
    "ChangefeedStatus",
    "ChangefeedStore",
    "ConfigCache",
    "DdlState",
    "Election",
    "EtcdBinary",
    "EtcdClient",
    "EtcdTuning",
    "KeyLayout",
    "Metastore",
    "OwnerInfo",
    "OwnerSession",
    "OwnerSnapshot",
    "PrivateEtcdStatus",
    "Problem",
    "RpcCounts",
    "TaskStatus",
    "TaskStatusStore",
    "TickCommit",
    "TlsConfig",
    "choose_etcd_binary",
    "connect",
    "private_etcd_status",
    "start_private_etcd",
    "stop_private_etcd",
]


class Metastore:
    """One cluster's metastore over one etcd connection."""

    def __init__(
        self,
        client: EtcdClient,
        layout: KeyLayout,
        *,
        now_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.client = client
        self.layout = layout
        self.election = Election(client, layout)
        self.captures = CaptureRegistry(client, layout)
        self.changefeeds = ChangefeedStore(client, layout, now_ms=now_ms)
        self.task_statuses = TaskStatusStore(client, layout)
        self.mailbox = MailboxStore(client, layout)
        self.problems = ProblemStore(client, layout)

    def read_owner_snapshot(self, cache: ConfigCache | None = None) -> OwnerSnapshot:
        """The owner's tick input, read at one revision in one round trip.

        Pass the owner's :class:`ConfigCache` to read only the configs written since.
        """
        return read_owner_snapshot(self.client, self.layout, cache=cache)

    def commit_owner_tick(
        self,
        session: OwnerSession,
        snapshot: OwnerSnapshot,
        progress: Mapping[str, ChangefeedProgress],
        ddl: Mapping[str, DdlState] | None = None,
    ) -> TickCommit:
        """Persist the tick in owner-guarded writes (NotOwnerError if ownership was lost)."""
        return commit_owner_tick(session, self.client, self.layout, snapshot, progress, ddl)

    def gc_safepoint(self) -> int:
        """The GC safepoint (0 before any owner set one)."""
        kv = self.client.get(self.layout.gc_safepoint)
        return int(kv.value) if kv is not None else 0

    def close(self) -> None:
        """Close the connection (a private etcd keeps running for the other processes)."""
        self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    endpoints: str | Sequence[str] | None,
    state_dir: str | os.PathLike[str] | None = None,
    *,
    cluster_id: str = "default",
    start_etcd: bool = False,
    now_ms: Callable[[], int] = wall_ms,
    rpc_timeout_s: float = 5.0,
    retry_timeout_s: float = 15.0,
    user: str | None = None,
    password: str | None = None,
    tls: TlsConfig | None = None,
) -> Metastore:
    """Open the metastore on ``endpoints`` (``--etcd host:port,...``), or on a private etcd.

    With no endpoints, attaches to the private etcd of ``state_dir``; if none runs, raises
    EtcdNotRunningError, or with ``start_etcd`` starts it (:func:`start_private_etcd`: it
    then keeps running after this process, until :func:`stop_private_etcd`).

    For an external cluster with authentication, pass ``user`` and ``password``; with TLS,
    ``tls=TlsConfig(ca_cert=..., cert_cert=..., cert_key=...)`` (file paths) and
    ``https://`` or ``host:port`` endpoints.
    """
    if not endpoints:
        if state_dir is None:
            raise InvalidEndpointError(
                "connect() needs etcd endpoints (--etcd host:port,...) or a state_dir whose "
                "private etcd to use"
            )
        status = private_etcd_status(state_dir)
        if not status.running:
            if not start_etcd:
                raise EtcdNotRunningError(
                    f"no private etcd runs for state dir {state_dir}; start it with "
                    f"`cdc-dagster server start --state-dir {state_dir}` (in Python: "
                    "start_private_etcd(state_dir)), or pass --etcd host:port,..."
                )
            status = start_private_etcd(state_dir)
        endpoints = status.endpoints
        _log.info("attaching to the private etcd at %s", endpoints)
    client = EtcdClient(
        endpoints,
        rpc_timeout_s=rpc_timeout_s,
        retry_timeout_s=retry_timeout_s,
        user=user,
        password=password,
        tls=tls,
    )
    return Metastore(client, KeyLayout(cluster_id), now_ms=now_ms)

"""The in-process driver: the owner and N captures in one process, with the very same functions.

One ``Driver.tick()`` = ``OwnerLoop.tick()``; carry out ready DDLs and syncpoints
(``apply_ready_ddl`` / ``apply_syncpoint``, as the gated Dagster runs do); then, for each
capture and changefeed, the owner's messages through the wire codec (as run config) into
``capture_prepare`` then ``capture_commit``. Admin hooks go through :mod:`admin` keys and
the registry, as the Dagster admin jobs do. Tests and benchmarks use it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cdc_dagster import admin
from cdc_dagster.metastore import Metastore, connect
from cdc_dagster.metastore.errors import ChangefeedNotFoundError
from cdc_dagster.runtime.capture import (
    CaptureContext,
    CaptureTick,
    CommitOutcome,
    PrepareOutcome,
)
from cdc_dagster.runtime.health import HealthConfig
from cdc_dagster.runtime.owner import OwnerLoop, OwnerTick, owner_step
from cdc_dagster.runtime.spec import ExecutorFactory
from cdc_dagster.sinks.uri import open_sink
from cdc_dagster.testing.fake_runtime import fake_executor_factory
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.uri import changelog_uri
from scheduler_core.coordinator import CoordinatorConfig

log = logging.getLogger(__name__)

CaptureRunner = Callable[[CaptureContext, dict], None]


@dataclass(frozen=True, slots=True)
class DriverTick:
    """One driver step: the owner tick and each capture's two halves."""

    owner: OwnerTick
    prepares: list[PrepareOutcome] = field(default_factory=list)
    commits: list[CommitOutcome] = field(default_factory=list)
    failed: dict[tuple[str, str], str] = field(default_factory=dict)  # (capture, cf) -> why


class Driver:
    """Owner + captures in one process over a real etcd (see the module docstring)."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        changelog_root: str | os.PathLike[str],
        sink_uri: str,
        captures: int = 3,
        executor_factory: ExecutorFactory = fake_executor_factory,
        *,
        metastore: Metastore | None = None,
        endpoints: Sequence[str] | None = None,
        cluster_id: str = "default",
        changefeed_id: str = "cf",
        start_ts: int | None = None,
        table_filter: Sequence[str] = ("*.*",),
        sync_point_interval_s: int = 0,
        target_ts: int = 0,
        owner_id: str = "owner-0",
        lease_ttl_s: int = 10,
        owner_lease_ttl_s: int | None = None,
        config: CoordinatorConfig | None = None,
        health: HealthConfig | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.staging_root = self.state_dir / "staging"
        self.changelog_root = Path(changelog_root).resolve()
        self.changelog = ChangeLog(self.changelog_root)
        self.sink_uri = sink_uri
        self.executor_factory = executor_factory
        self.lease_ttl_s = lease_ttl_s
        self._own_ms = metastore is None
        self.ms = metastore or connect(endpoints, self.state_dir, cluster_id=cluster_id)
        self.changefeed_id = changefeed_id
        self.changefeed_ids = [changefeed_id]
        self._ensure_changefeed(start_ts, table_filter, sync_point_interval_s, target_ts)
        self.sink = open_sink(sink_uri)
        owner_ttl = owner_lease_ttl_s or lease_ttl_s
        self.owner = OwnerLoop(
            self.ms, owner_id, lease_ttl_s=owner_ttl, config=config, health=health
        )
        self.capture_ids: list[str] = []
        for i in range(captures):
            self.add_capture(f"capture-{i}")

    def _ensure_changefeed(
        self, start_ts: int | None, table_filter: Sequence[str], interval_s: int, target_ts: int
    ) -> None:
        try:
            self.ms.changefeeds.get(self.changefeed_id)
        except ChangefeedNotFoundError:
            self.ms.changefeeds.create(
                self.changefeed_id,
                self.sink_uri,
                table_filter=table_filter,
                start_ts=start_ts,
                target_ts=target_ts,
                sync_point_interval_s=interval_s,
                upstream_uri=changelog_uri(self.changelog_root),
            )

    def context(self, capture_id: str, changefeed_id: str | None = None) -> CaptureContext:
        """The capture context a capture run would build."""
        return CaptureContext(
            self.ms,
            capture_id,
            changefeed_id or self.changefeed_id,
            self.staging_root,
            self.executor_factory,
            self.lease_ttl_s,
        )

    # -------------------------------------------------------------- the step
    def tick(
        self, *, skip: Sequence[str] = (), runner: dict[str, CaptureRunner] | None = None
    ) -> DriverTick:
        """One owner tick, its DDLs and syncpoints, then every capture's two halves.

        ``runner`` may run some captures elsewhere (a test runs one in a subprocess it
        kills); it gets the capture's context and its run config, as a Dagster run would.
        """
        owner = owner_step(self.owner, apply_gated=True).tick
        step = DriverTick(owner)
        for cid in list(self.capture_ids):
            if cid in skip:
                continue
            config = owner.run_config(cid)  # what the capture run receives (JSON)
            if runner and cid in runner:
                runner[cid](self.context(cid), config)
                continue
            # As a capture run: every changefeed the driver runs, each isolated from the others.
            work = {cf: config.get(cf, []) for cf in sorted(set(config) | set(self.changefeed_ids))}
            tick = CaptureTick(
                self.ms,
                cid,
                work,
                staging_root=self.staging_root,
                executor_factory=self.executor_factory,
                lease_ttl_s=self.lease_ttl_s,
            )
            tick.prepare()
            tick.commit()
            step.prepares.extend(tick.prepared.values())
            step.commits.extend(tick.committed.values())
            step.failed.update({(cid, cf): why for cf, why in tick.failed.items()})
        return step

    def add_changefeed(self, changefeed_id: str, sink_uri: str, **options: object) -> None:
        """Run one more changefeed over the same change log (on the same captures)."""
        self.ms.changefeeds.create(
            changefeed_id, sink_uri, upstream_uri=changelog_uri(self.changelog_root), **options
        )
        self.changefeed_ids.append(changefeed_id)

    def run_until(self, done: Callable[[DriverTick], bool], max_ticks: int = 100) -> int:
        """Tick until ``done(tick)``; returns the ticks taken (raises if never)."""
        for n in range(1, max_ticks + 1):
            if done(self.tick()):
                return n
        raise TimeoutError(f"not done after {max_ticks} driver ticks")

    def caught_up(self, tick: DriverTick, upto_ts: int) -> bool:
        """Every table replicates with its checkpoint at ``upto_ts`` or beyond."""
        cf = tick.owner.changefeeds.get(self.changefeed_id)
        if cf is None or not cf.tables:
            return False
        return cf.checkpoint_ts >= upto_ts and all(
            t.replicating and t.checkpoint_ts >= upto_ts for t in cf.tables
        )

    # -------------------------------------------------------------- admin hooks
    def add_capture(self, capture_id: str) -> None:
        """Scale out: register a capture (unless registered: a second driver carries on)."""
        if self.ms.captures.get(capture_id) is None:
            # Directly: tests use leases shorter than admin.add_capture allows.
            self.ms.captures.desire(capture_id, self.lease_ttl_s)
            self.ms.captures.register(capture_id, self.lease_ttl_s, keepalive=False)
        self.capture_ids.append(capture_id)

    def move_table(self, table_id: int, capture_id: str) -> str:
        """Ask the owner to move a table (the admin job's call)."""
        return admin.move_table(self.ms, self.changefeed_id, table_id, capture_id)

    def drain_capture(self, capture_id: str) -> str:
        """Ask the owner to move every table off a capture (the admin job's call)."""
        return admin.drain_capture(self.ms, capture_id, self.changefeed_id)[0]

    def remove_capture(self, capture_id: str) -> None:
        """Scale in: deregister a (drained) capture and stop running it."""
        admin.remove_capture(self.ms, capture_id)
        self.capture_ids.remove(capture_id)

    def close(self) -> None:
        """Close the metastore if the driver opened it."""
        if self._own_ms:
            self.ms.close()

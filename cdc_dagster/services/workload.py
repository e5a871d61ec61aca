"""The demo's workload: the embedded generator in a thread, and the demo changefeed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_log = logging.getLogger(__name__)


class GeneratorThread:
    """Steps the embedded generator (wall-clock commit ts) every ``interval_s`` until stopped.

    The change log at ``root`` is opened with ``Workload.open``: a fresh one is started, an
    existing one (a second demo) is resumed where it stopped. The workload holds the log's
    writer lock (``.writer.lock``) until :meth:`stop`.
    """

    def __init__(
        self,
        root: Path,
        bank_tables: int,
        interval_s: float = 1.0,
        txns_per_step: int = 20,
        # ~one DDL per 2 min at 20 txns/s: each DDL holds its table at a barrier for a few
        # run cycles (capture run, gated DDL run, capture run), ~30-40 s on 2 cores.
        ddl_every: int = 2400,
    ) -> None:
        self.root = root
        self.bank_tables = bank_tables
        self.interval_s = interval_s
        self.txns_per_step = txns_per_step
        self.ddl_every = ddl_every  # 0: no DDLs
        self.workload: Any = None
        self.first_ts = 0  # the change log's first commit ts (its first CREATE TABLE)
        self.start_ts = 0  # where the demo's changefeed starts (see start())
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cdc-generator", daemon=True)

    def config(self) -> Any:
        """The workload's config (a resumed log must have been written with the same)."""
        from cdc_dagster.upstream.generator import WorkloadConfig

        return WorkloadConfig(
            bank_tables=self.bank_tables,
            wall_clock=True,
            txns_per_step=self.txns_per_step,
            fsync=False,
            odd_identifiers=False,
            ddls=self.ddl_every > 0,
            ddl_every=max(1, self.ddl_every),
        )

    def start(self) -> None:
        """Open (or resume) the change log and start stepping."""
        from cdc_dagster.upstream.changelog import ChangeLog
        from cdc_dagster.upstream.generator import Workload

        self.root.mkdir(parents=True, exist_ok=True)
        self.workload = Workload.open(self.config(), self.root)
        self.first_ts = first_commit_ts(self.root)
        self.start_ts = self.first_ts
        if self.workload.resumed_from is None:
            # A fresh log holds only the bootstrap CREATEs so far, and the first row change
            # comes after the last of them: a changefeed starting there has every table in
            # its initial set (one barrier, not one per CREATE) and misses no row.
            self.start_ts = ChangeLog(self.root).ddl_records()[-1].commit_ts
        self._thread.start()

    def describe(self) -> str:
        """One line for the progress output."""
        w = self.workload
        how = "fresh change log"
        if w is not None and w.resumed_from is not None:
            how = f"resumed the change log at {w.resumed_from}"
        return f"{how}; {self.txns_per_step} transactions every {self.interval_s:.0f} s"

    def _run(self) -> None:
        w = self.workload
        try:
            while not self._stop.wait(self.interval_s):
                w.step()
                w.advance_resolved()
        except Exception as exc:  # reported by stop() and the demo; must not die silently
            self.error = exc
            _log.exception("the generator stopped")

    def alive(self) -> bool:
        """Whether it still steps (False once stopped or failed: see ``error``)."""
        return self._thread.is_alive()

    def request_stop(self) -> None:
        """Ask it to stop after the current step (:meth:`stop` then releases the log)."""
        self._stop.set()

    def stop(self) -> None:
        """Stop stepping and release the change log (which stays)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if self.workload is not None and not self._thread.is_alive():
            self.workload.close()
            self.workload = None


def ensure_captures(
    etcd: str, state_dir: Path, captures: Sequence[str], cluster_id: str = "default"
) -> str:
    """The captures a server starts with (desired state, registered now); one line."""
    from cdc_dagster import admin
    from cdc_dagster.metastore import connect

    with connect(etcd.split(","), state_dir, cluster_id=cluster_id) as ms:
        added = admin.ensure_captures(ms, captures)
        known = sorted(ms.captures.desired())
    if added:
        return f"registered captures {', '.join(added)} (desired: {', '.join(known)})"
    return f"captures {', '.join(known) or '(none)'} already registered"


def ensure_demo_changefeed(
    etcd: str,
    state_dir: Path,
    changefeed_id: str,
    lake: Path,
    captures: Sequence[str],
    changelog: Path,
    start_ts: int,
    sync_point_interval_s: int = 60,
) -> str:
    """Create the demo changefeed (every table, from ``start_ts``) and register its captures
    unless they exist; one line."""
    from cdc_dagster import admin
    from cdc_dagster.metastore import connect
    from cdc_dagster.metastore.errors import ChangefeedNotFoundError
    from cdc_dagster.upstream.uri import changelog_uri

    lake.mkdir(parents=True, exist_ok=True)
    with connect(etcd.split(","), state_dir) as ms:
        try:
            ms.changefeeds.get(changefeed_id)
            what = f"changefeed {changefeed_id} exists (reused)"
        except ChangefeedNotFoundError:
            admin.create_changefeed(
                ms,
                changefeed_id,
                f"delta://{lake}",
                table_filter=("*.*",),
                start_ts=start_ts,
                sync_point_interval_s=sync_point_interval_s,
                upstream_uri=changelog_uri(changelog),
            )
            what = f"created changefeed {changefeed_id} into delta://{lake}"
        added = admin.ensure_captures(ms, captures)
    return what + (f"; registered captures {', '.join(added)}" if added else "")


def first_commit_ts(changelog: Path) -> int:
    """The commit ts of the change log's first DDL (the generator's first CREATE TABLE).

    A changefeed starting there sees that table from the start and every later table as
    its CREATE passes: it replicates every row without a snapshot.
    """
    from cdc_dagster.upstream.changelog import ChangeLog

    records = ChangeLog(changelog).ddl_records()
    if not records:
        raise RuntimeError(f"change log {changelog} holds no DDL: no table was ever created")
    return records[0].commit_ts


def what_to_look_at(ui: str, changefeed_id: str, lake: Path) -> list[str]:
    """The demo's closing lines."""
    if not ui:
        return ["Dagster not started (--no-dagster)"]
    return [
        f"open {ui}",
        f"  {ui}/automation          the owner sensor (cdc_owner) ticking every ~5 s",
        f"  {ui}/runs                capture runs, one ticking per capture (receive > prepare > commit > report > follow: 5 min of ticks; the next one starts 20 s before and waits in receive)",
        f"  {ui}/assets              replicated tables: checkpoint/resolved ts, lag_seconds plot, lineage",
        f"  {ui}/jobs                admin jobs: move_table, drain_capture, pause/resume_changefeed, ...",
        f"Delta tables under {lake}; `cdc-dagster changefeed query -c {changefeed_id}` shows progress",
        "Ctrl-C stops everything this demo started",
    ]

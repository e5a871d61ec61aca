"""Changefeed create for a MySQL/MariaDB upstream: check, refuse keyless tables, snapshot.

Runs in the process that creates the changefeed (the CLI, or a Dagster admin run), which
resolves the URI's ``${VAR}`` references from its own environment. The initial snapshot is
written into the changefeed's own change log; the binlog puller runs (as Dagster runs) then
stream from the snapshot's position. Nothing is left behind when a step fails.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cdc_dagster.mysql.checks import validate_changefeed
from cdc_dagster.mysql.puller import PullerConfig, run_puller
from cdc_dagster.secrets import redact_uri
from cdc_dagster.upstream.uri import UpstreamError, parse_uri, with_changelog

Progress = Callable[[str, int, int], None]  # (db.table, rows done, rows total)


@dataclass(frozen=True, slots=True)
class InitialSnapshot:
    """What the snapshot produced: the URI to store, where the changefeed starts, and what."""

    upstream_uri: str  # the given URI with changelog=<root> (its ${VAR}s unresolved)
    changelog_root: str
    start_ts: int  # above every table's CREATE record, just below the snapshot rows
    tables: tuple[str, ...]
    rows: int
    position: str  # the binlog position the pullers stream from

    def __repr__(self) -> str:
        return f"InitialSnapshot({redact_uri(self.upstream_uri)!r}, start_ts={self.start_ts})"


def take_initial_snapshot(
    upstream_uri: str,
    changelog_root: str | Path,
    table_filter: Sequence[str],
    progress: Progress | None = None,
    checked: Callable[[Sequence[str]], None] | None = None,
) -> InitialSnapshot:
    """Check the upstream (settings, privileges, keys), then snapshot into ``changelog_root``.

    Raises UpstreamError (or PullerError) saying what to change; the change-log root is
    removed again if the snapshot fails, and refused if it already holds a change log.
    ``checked`` is told the tables once the checks passed (before the snapshot starts).
    """
    root = Path(changelog_root).resolve()
    parse_uri(upstream_uri)  # a bad URI fails before anything connects
    names = validate_changefeed(upstream_uri, table_filter)
    if root.exists() and any(root.iterdir()):
        raise UpstreamError(
            f"{root} already holds files (a change log?): remove it, or give another directory"
        )
    if checked is not None:
        checked(names)
    created = not root.exists()
    try:
        # MariaDB: create records and the start position only; the rows come in chunks
        # from the Dagster snapshot runs (mysql.snapshots), so create returns at once
        cfg = PullerConfig(upstream_uri, str(root), tuple(table_filter), progress=progress,
                           chunked_snapshot=True)  # fmt: skip
        stats = run_puller(cfg, stop_after=lambda s: True)  # the Dagster runs stream
    except BaseException:
        _remove(root, created)
        raise
    return InitialSnapshot(
        with_changelog(upstream_uri, str(root)),
        str(root),
        stats.start_ts,
        tuple(names),
        stats.snapshot_rows,
        stats.position,
    )


def discard_snapshot(snapshot: InitialSnapshot) -> None:
    """Remove a snapshot's change log (its changefeed could not be created)."""
    _remove(Path(snapshot.changelog_root), True)


def _remove(root: Path, created: bool) -> None:
    if created:
        shutil.rmtree(root, ignore_errors=True)
    else:  # an empty directory the user gave: empty it again, keep it
        for child in root.iterdir():
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)

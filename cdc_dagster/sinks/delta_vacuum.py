"""Reclaiming the Delta sink's replaced files: Delta's VACUUM on each table the sink
writes, at most every ``VACUUM_EVERY_S``, by whichever process writes it next.

Every batch rewrites the files its keys fall in (copy on write: ``delta_layout``, the
MERGE); the files it replaced stay on disk for readers of older versions. Without a vacuum
a steady 50 transactions/s on four 250k-row sysbench tables grew the lake by ~5 GB a
table in 20 minutes. Kept by the vacuum:

- the current version's files;
- the files of every version a recorded syncpoint names, however old (dbt builds read
  them: ``cdc_dagster.dbt.pin``);
- files removed less than the retention ago (the sink URI's ``?vacuum_retention_hours=``,
  default ``DEFAULT_RETENTION_HOURS``): a reader that loaded a version before it was
  replaced, and time travel within the retention, still find their files.

Only files the log removed are candidates (VACUUM's lite mode): a file a writer wrote but
has not committed yet, or a failed commit's, is never deleted here.

How often: ``CDC_DAGSTER_VACUUM_EVERY_S`` (read when a write asks; default
``VACUUM_EVERY_S``). When a table is next due is kept on disk, so the short capture runs
and bulk workers that write it share it: the mtime of ``<root>/_cdc_dagster/vacuum/<location>``
is its last vacuum (or when a writer first saw the table). A vacuum that fails (a concurrent
commit, a syncpoint version that cannot be read, a file it cannot delete) is logged and tried
again at the next interval; it never fails the write it follows. It is recorded in
``<root>/_cdc_dagster/vacuum-failed/<location>`` (JSON: the message, since when, how many
times in a row) until a vacuum of the table succeeds: the owner shows it in the changefeed's
state (``failures``; the lake grows meanwhile), without holding anything up. Each vacuum is
two commits in the table's history (``VACUUM START``/``VACUUM END``, with the files
deleted), which change no data.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from cdc_dagster.sinks.base import SinkError
from cdc_dagster.sinks.delta_paths import META_DIR
from cdc_dagster.sinks.delta_syncpoint_file import syncpoint_record

log = logging.getLogger(__name__)

VACUUM_EVERY_S = 600.0  # a table's vacuums at most this often (CDC_DAGSTER_VACUUM_EVERY_S)
EVERY_ENV = "CDC_DAGSTER_VACUUM_EVERY_S"
DEFAULT_RETENTION_HOURS = 1  # replaced files are kept this long (whole hours: delta-rs)


def marker_path(root: str, location: str) -> str:
    """The file whose mtime says when the table at ``location`` was last vacuumed."""
    return os.path.join(root, META_DIR, "vacuum", location)


def failure_path(root: str, location: str) -> str:
    """The file that says the table at ``location``'s vacuums fail, while they do."""
    return os.path.join(root, META_DIR, "vacuum-failed", location)


@dataclass(frozen=True, slots=True)
class VacuumFailure:
    """A table whose vacuums fail: the last failure's message, since when (epoch ms) and how
    many vacuums in a row failed."""

    location: str  # the table's directory under the root (``delta_paths.table_location``)
    message: str
    since_ms: int
    attempts: int
    last_ms: int


def _record_failure(root: str, location: str, message: str, now_ms: int) -> None:
    """Note a failed vacuum of the table (the first of a streak keeps its ``since``)."""
    path = failure_path(root, location)
    before = _read_failure(path, location)
    doc = {
        "message": message,
        "since_ms": before.since_ms if before else now_ms,
        "attempts": before.attempts + 1 if before else 1,
        "last_ms": now_ms,
    }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)  # a reader sees the old record or the new one, never half


def _read_failure(path: str, location: str) -> VacuumFailure | None:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        return VacuumFailure(
            location,
            str(doc["message"]),
            int(doc["since_ms"]),
            int(doc["attempts"]),
            int(doc["last_ms"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("vacuum failure record %s unreadable (%s); ignored", path, exc)
        return None


def forget(root: str, location: str) -> None:
    """The table at ``location`` is gone (dropped): its vacuum clock and failure record too."""
    for path in (marker_path(root, location), failure_path(root, location)):
        try:
            Path(path).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("vacuum state %s of a dropped table not removed: %s", path, exc)


def failures(root: str) -> list[VacuumFailure]:
    """Every table under ``root`` whose vacuums fail now (their last one failed), by location."""
    base = os.path.join(root, META_DIR, "vacuum-failed")
    out = []
    for dirpath, _dirs, files in os.walk(base):
        for name in files:
            if ".tmp-" in name:
                continue
            path = os.path.join(dirpath, name)
            location = os.path.relpath(path, base).replace(os.sep, "/")
            failure = _read_failure(path, location)
            if failure is not None:
                out.append(failure)
    return sorted(out, key=lambda f: f.location)


def vacuum_every_s() -> float:
    """The interval between a table's vacuums: ``CDC_DAGSTER_VACUUM_EVERY_S`` or the default;
    a value that is not a number of seconds (0 or more) is a ``SinkError`` naming it."""
    raw = os.environ.get(EVERY_ENV, "")
    if not raw:
        return VACUUM_EVERY_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise SinkError(
            f"{EVERY_ENV}={raw!r} is not a number of seconds (0 or more), e.g. 600; fix or "
            "unset it (the Delta sink's writes wait for it)"
        )
    return value


def due(root: str, location: str, every_s: float) -> bool:
    """Whether the table at ``location`` is due a vacuum (its last ``every_s`` or more ago);
    a table seen for the first time is not (its clock starts now: the marker is created)."""
    marker = marker_path(root, location)
    now = time.time()
    try:
        return now - os.stat(marker).st_mtime >= every_s
    except FileNotFoundError:
        _touch(marker, now)
        return False


def _touch(marker: str, now: float) -> None:
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    Path(marker).touch()
    os.utime(marker, (now, now))


# Syncpoint files are written once (renamed into place): each process parses one once, not
# once per table per vacuum (tables x syncpoints files otherwise). Rebuildable: a cache of
# what is on disk, keyed by the file's path and mtime (a changefeed removed and created
# again may write another file at the same path); a file gone (a syncpoint past its
# retention) leaves it at the next scan of its root.
_PARSED: dict[tuple[str, int], dict[str, int]] = {}  # (file, mtime) -> {location: version}


def pinned_versions(root: str, location: str) -> list[int]:
    """The versions of the table at ``location`` that recorded syncpoints name (of every
    changefeed under ``root``), ascending; a syncpoint file that cannot be read is skipped
    with a warning (it pins nothing a build could read either)."""
    out: set[int] = set()
    base = os.path.join(root, META_DIR, "syncpoints")
    try:
        changefeeds = [e.path for e in os.scandir(base) if e.is_dir()]
    except FileNotFoundError:
        return []
    seen = set()
    for cf in changefeeds:
        for entry in os.scandir(cf):
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            key = (entry.path, entry.stat().st_mtime_ns)
            seen.add(key)
            pins = _PARSED.get(key)
            if pins is None:
                try:
                    with open(entry.path, encoding="utf-8") as fh:
                        rec = syncpoint_record(json.load(fh))
                except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                    log.warning(
                        "vacuum: syncpoint %s unreadable (%s); it pins nothing", entry.path, exc
                    )
                    continue
                pins = {rec.locations[t]: v for t, v in rec.versions.items()}
                _PARSED[key] = pins
            if location in pins:
                out.add(pins[location])
    under = base + os.sep
    for key in [k for k in _PARSED if k[0].startswith(under) and k not in seen]:
        del _PARSED[key]
    return sorted(out)


def vacuum(path: str, keep_versions: list[int], retention_hours: int) -> list[str]:
    """VACUUM the table at ``path`` (lite: only files its log removed), keeping the files
    of ``keep_versions`` and of removals younger than ``retention_hours``; the files
    deleted. A kept version the table cannot load (newer than the table: a table dropped
    and created again; its log cleaned up) is left out, with a warning."""
    dt = DeltaTable(path)
    # the current one is kept anyway; ascending, as delta-rs needs them ("Cannot downgrade
    # snapshot" otherwise: delta-rs#4286)
    keep = sorted(v for v in keep_versions if v < dt.version())

    def run(versions: list[int]) -> list[str]:
        return dt.vacuum(
            retention_hours=retention_hours,
            dry_run=False,
            enforce_retention_duration=False,
            keep_versions=versions or None,
        )

    try:
        return run(keep)
    except DeltaError:
        if not keep:
            raise
    loadable = []
    for v in keep:
        try:
            DeltaTable(path, version=v)
            loadable.append(v)
        except DeltaError as exc:
            log.warning(
                "vacuum of %s: syncpoint version %d cannot be read (%s); not kept", path, v, exc
            )
    return run(loadable)


def maybe_vacuum(
    root: str, location: str, path: str, retention_hours: int | None, every_s: float
) -> list[str]:
    """After a commit into the table at ``path``: vacuum it if it is due (``due``) and
    vacuuming is on (``retention_hours`` not None). Never raises: a failure is logged and
    the table is tried again ``every_s`` later."""
    if retention_hours is None:
        return []
    started = time.monotonic()
    try:  # a vacuum never fails the write it follows (its marker's directory neither)
        if not due(root, location, every_s):
            return []
        _touch(marker_path(root, location), time.time())  # others writing it now skip it
        deleted = vacuum(path, pinned_versions(root, location), retention_hours)
    except (DeltaError, OSError) as exc:
        log.warning("vacuum of %s failed (%s); tried again in %.0f s", path, exc, every_s)
        message = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000]
        try:
            _record_failure(root, location, message, int(time.time() * 1000))
        except OSError as rec_exc:
            log.warning("vacuum failure of %s not recorded: %s", path, rec_exc)
        return []
    try:
        Path(failure_path(root, location)).unlink(missing_ok=True)  # healed: shown no more
    except OSError as exc:
        log.warning("vacuum failure record of %s not cleared: %s", path, exc)
    log.info(
        "vacuum of %s: %d replaced file(s) deleted in %.2f s",
        path,
        len(deleted),
        time.monotonic() - started,
    )
    return deleted

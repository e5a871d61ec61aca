"""Where a stream starts: a consistent snapshot's binlog position (MariaDB, MySQL).

MariaDB reports the binlog position of ``START TRANSACTION WITH CONSISTENT SNAPSHOT``
(``binlog_snapshot_file/position``), which ``BINLOG_GTID_POS`` turns into the GTID to
stream from: no lock. MySQL needs mysqldump's brief ``FLUSH TABLES WITH READ LOCK``.
"""

from __future__ import annotations

from typing import Any

import pymysql

from cdc_dagster.mysql.errors import PullerError
from cdc_dagster.mysql.state import PullerState, parse_gtid_pos


def mariadb_snapshot_state(cur: Any) -> PullerState:
    """Open the snapshot on ``cur``; a state at its binlog position (no lock needed)."""
    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
    cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
    status = {k.lower(): v for k, v in cur.fetchall()}
    if "binlog_snapshot_file" not in status:
        raise PullerError("the upstream gives no binlog_snapshot_file (not MariaDB?)")
    cur.execute(
        "SELECT BINLOG_GTID_POS(%s, %s)",
        (status["binlog_snapshot_file"], int(status["binlog_snapshot_position"])),
    )
    return PullerState(parse_gtid_pos(cur.fetchone()[0] or ""), 0)


Coords = tuple[int, str, int]  # (server id, binlog file, offset)


def parse_coords(text: str) -> Coords:
    """``server_id:file:offset`` (``COORDS_SQL``'s text) as a tuple."""
    sid, rest = text.split(":", 1)
    log_file, offset = rest.rsplit(":", 1)
    return int(sid), log_file, int(offset)


# The session's consistent snapshot: its binlog file (f) and offset (p)
_SNAPSHOT_STATUS = (
    "FROM information_schema.SESSION_STATUS f JOIN information_schema.SESSION_STATUS p "
    "ON f.VARIABLE_NAME = 'BINLOG_SNAPSHOT_FILE' AND p.VARIABLE_NAME = 'BINLOG_SNAPSHOT_POSITION'"
)
# ... as binlog coordinates in one text (no BINLOG_GTID_POS: no binlog read)
COORDS_SQL = (
    f"SELECT CONCAT(@@server_id, ':', f.VARIABLE_VALUE, ':', p.VARIABLE_VALUE) {_SNAPSHOT_STATUS}"
)
# ... as GTIDs (BINLOG_GTID_POS reads the binlog file up to the offset)
GTIDS_SQL = f"SELECT BINLOG_GTID_POS(f.VARIABLE_VALUE, p.VARIABLE_VALUE) {_SNAPSHOT_STATUS}"


def mariadb_snapshot_coords(cur: Any) -> Coords:
    """Open the snapshot on ``cur``; its server id, binlog file and offset (no lock, and no
    binlog read: ``BINLOG_GTID_POS`` reads the file up to the offset)."""
    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
    cur.execute(COORDS_SQL)
    row = cur.fetchone()
    if not row or not row[0]:
        raise PullerError(
            "the upstream gives no binlog_snapshot_file (not MariaDB, or log_bin OFF?)"
        )
    return parse_coords(row[0])


def mysql_snapshot_state(cur: Any) -> PullerState:
    """Open the snapshot at a known MySQL binlog position (mysqldump's --single-transaction
    --source-data sequence): the global read lock is held only while the transaction starts
    and the position is read, not while the rows are read. Needs RELOAD.

    UNTESTED against a MySQL server (none can be installed here; docs/mysql-postgres.md).
    """
    cur.execute("FLUSH TABLES WITH READ LOCK")
    try:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        status = binary_log_status(cur)
        cur.execute("SELECT @@GLOBAL.gtid_mode")
        gtid_mode = str(cur.fetchone()[0]).upper()
    finally:
        cur.execute("UNLOCK TABLES")
    if status is None:
        raise PullerError("the upstream reports no binary log status: start it with --log-bin")
    return mysql_state_at(status, gtid_mode)


def binary_log_status(cur: Any) -> dict[str, Any] | None:
    """``SHOW BINARY LOG STATUS`` (MySQL >= 8.2) or ``SHOW MASTER STATUS``, as a dict."""
    for stmt in ("SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"):
        try:
            cur.execute(stmt)
        except pymysql.err.ProgrammingError:
            continue
        row = cur.fetchone()
        if row is None:
            return None
        return {d[0]: v for d, v in zip(cur.description, row, strict=True)}
    return None


def mysql_state_at(status: dict[str, Any], gtid_mode: str) -> PullerState:
    """The puller's start state from MySQL's binary log status: resume by GTID set when
    ``gtid_mode=ON`` and the set is not empty, else by file:pos."""
    gtids = "".join(str(status.get("Executed_Gtid_Set") or "").split())
    file, pos = str(status["File"]), int(status["Position"])
    if gtid_mode == "ON" and gtids:
        return PullerState({}, 0, flavor="mysql_gtid", gtid_set=gtids, log_file=file,
                           log_pos=pos)  # fmt: skip
    return PullerState({}, 0, flavor="mysql_file", log_file=file, log_pos=pos)


__all__ = [
    "COORDS_SQL",
    "GTIDS_SQL",
    "Coords",
    "binary_log_status",
    "mariadb_snapshot_coords",
    "mariadb_snapshot_state",
    "mysql_snapshot_state",
    "mysql_state_at",
    "parse_coords",
]

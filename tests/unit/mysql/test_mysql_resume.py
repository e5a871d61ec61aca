"""MySQL (not MariaDB) resume by GTID set or file:pos, tested without a MySQL server.

No MySQL server can be installed here (Debian ships only MariaDB; docs/mysql-postgres.md
says what stays untested). These pin the parts that need no server: the start state from
MySQL's binary log status, the dump request and session settings per flavor, how a
committed transaction moves the position, the snapshot's statement order, and the
start-up checks.
"""

from __future__ import annotations

import struct
from typing import Any

import pymysql
import pytest
from pymysqlreplication.gtid import GtidSet

from cdc_dagster.mysql.binlog_wire import (
    COM_BINLOG_DUMP,
    COM_BINLOG_DUMP_GTID,
    dump_request,
    session_settings,
)
from cdc_dagster.mysql.position import binary_log_status, mysql_snapshot_state, mysql_state_at
from cdc_dagster.mysql.puller import Puller, PullerConfig, PullerError
from cdc_dagster.mysql.state import PullerState, TsAllocator, add_mysql_gtid
from cdc_dagster.mysql.upstream import upstream_problems

UUID_A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
UUID_B = "4e11fa47-71ca-11e1-9e33-c80aa9429562"
GOOD = {"log_bin": "1", "binlog_format": "ROW", "binlog_row_image": "FULL"}
GOOD_8 = GOOD | {"binlog_row_metadata": "FULL"}


def test_gtid_mode_on_with_executed_set_resumes_by_gtid_set() -> None:
    status = {
        "File": "binlog.000007",
        "Position": 157,
        "Executed_Gtid_Set": f"{UUID_A}:1-42,\n{UUID_B}:1-3",
    }
    state = mysql_state_at(status, "ON")
    assert state.flavor == "mysql_gtid"
    assert state.gtid == f"{UUID_A}:1-42,{UUID_B}:1-3"  # MySQL breaks long sets with newlines
    req = dump_request(state, 4242)
    assert req[4] == COM_BINLOG_DUMP_GTID
    assert struct.unpack_from("<HIIQI", req, 5)[:4] == (0x04, 4242, 0, 4)
    assert req[27:] == GtidSet(f"{UUID_A}:1-42,{UUID_B}:1-3").encoded()
    assert int.from_bytes(req[:3], "little") == len(req) - 4


@pytest.mark.parametrize("mode,gtids", [("OFF", ""), ("ON", ""), ("OFF_PERMISSIVE", f"{UUID_A}:1")])
def test_without_usable_gtids_resumes_by_file_and_position(mode: str, gtids: str) -> None:
    state = mysql_state_at(
        {"File": "binlog.000002", "Position": 4711, "Executed_Gtid_Set": gtids}, mode
    )
    assert state.flavor == "mysql_file" and state.gtid == "binlog.000002:4711"
    req = dump_request(state, 7)
    assert req[4] == COM_BINLOG_DUMP
    assert struct.unpack_from("<IHI", req, 5) == (4711, 0, 7)
    assert req[15:] == b"binlog.000002"


def test_mariadb_state_streams_by_domain_server_seq() -> None:
    state = PullerState({0: "0-1-5", 1: "1-2-9"}, 0)
    req = dump_request(state, 4242)
    assert req[4] == COM_BINLOG_DUMP and struct.unpack_from("<IHI", req, 5) == (4, 0, 4242)
    assert len(req) == 4 + 11  # no file name: MariaDB starts from @slave_connect_state
    settings = dict(session_settings(state, 1.0))
    assert settings["SET @slave_connect_state = %s"] == ("0-1-5,1-2-9",)
    assert settings["SET @master_heartbeat_period = %s"] == (1_000_000_000,)
    mysql = dict(session_settings(PullerState({}, 0, flavor="mysql_gtid", gtid_set="x:1"), 1.0))
    assert "SET @slave_connect_state = %s" not in mysql


def test_an_empty_gtid_set_is_refused_not_read_as_start_from_now() -> None:
    with pytest.raises(PullerError, match="empty MySQL GTID set"):
        dump_request(PullerState({}, 0, flavor="mysql_gtid"), 1)


def test_gtid_set_grows_by_one_transaction_and_merges_intervals() -> None:
    assert add_mysql_gtid(f"{UUID_A}:1-5:7-9", f"{UUID_A}:6") == f"{UUID_A}:1-9"
    assert add_mysql_gtid(f"{UUID_A}:1-9", f"{UUID_B}:1") == f"{UUID_A}:1-9,{UUID_B}:1"


def test_mysql_state_round_trips_and_old_states_read_as_mariadb() -> None:
    state = PullerState({}, 77, flavor="mysql_file", log_file="binlog.000003", log_pos=99)
    back = PullerState.from_json(state.to_json())
    assert (back.flavor, back.gtid, back.last_ts) == ("mysql_file", "binlog.000003:99", 77)
    old = state.to_json()
    for k in ("flavor", "gtid_set", "log_file", "log_pos"):
        old.pop(k)
    old["position"] = {"0": "0-1-5"}
    assert PullerState.from_json(old).gtid == "0-1-5"


def _puller(tmp_path: Any, state: PullerState, log_file: str = "") -> Puller:
    p = Puller(PullerConfig("mysql://cdc@127.0.0.1:1/?server-id=9", str(tmp_path)))
    p.state, p.alloc, p.log_file = state, TsAllocator(0), log_file
    return p


def test_committed_transaction_moves_the_file_position_past_its_xid(tmp_path: Any) -> None:
    state = PullerState({}, 0, flavor="mysql_file", log_file="binlog.000004", log_pos=4)
    p = _puller(tmp_path, state, log_file="binlog.000004")
    p._commit(1_700_000_000.0, log_pos=1234)  # the XID event's header: the next position
    assert p.state.gtid == "binlog.000004:1234"  # a reconnect starts there: nothing replayed


def test_committed_transaction_adds_its_gtid_to_the_set_a_reconnect_sends(tmp_path: Any) -> None:
    state = PullerState({}, 0, flavor="mysql_gtid", gtid_set=f"{UUID_A}:1-5")
    p = _puller(tmp_path, state, log_file="binlog.000004")
    p.trx_gtid = f"{UUID_A}:6"
    p._commit(1_700_000_000.0, log_pos=900)
    assert p.state.gtid == f"{UUID_A}:1-6"
    assert dump_request(p.state, 9)[27:] == GtidSet(f"{UUID_A}:1-6").encoded()
    assert (p.state.log_file, p.state.log_pos) == ("binlog.000004", 900)


class _Cursor:
    """Records statements; answers the binary log status and gtid_mode like MySQL 8.0."""

    def __init__(self, new_syntax: bool) -> None:
        self.statements: list[str] = []
        self.new_syntax = new_syntax
        self.description: list[tuple[str]] = []
        self._row: tuple = ()

    def execute(self, stmt: str, args: Any = None) -> None:
        self.statements.append(stmt)
        if stmt == "SHOW BINARY LOG STATUS" and not self.new_syntax:
            raise pymysql.err.ProgrammingError(1064, "You have an error in your SQL syntax")
        if stmt.startswith("SHOW"):
            self.description = [
                ("File",),
                ("Position",),
                ("Binlog_Do_DB",),
                ("Binlog_Ignore_DB",),
                ("Executed_Gtid_Set",),
            ]
            self._row = ("binlog.000009", 4242, "", "", f"{UUID_A}:1-100")
        elif "gtid_mode" in stmt:
            self._row = ("ON",)

    def fetchone(self) -> tuple:
        return self._row


@pytest.mark.parametrize("new_syntax", [True, False])
def test_mysql_snapshot_holds_the_read_lock_only_to_start_and_read_the_position(
    new_syntax: bool,
) -> None:
    cur = _Cursor(new_syntax)
    state = mysql_snapshot_state(cur)
    assert cur.statements[0] == "FLUSH TABLES WITH READ LOCK"
    assert cur.statements[1] == "START TRANSACTION WITH CONSISTENT SNAPSHOT"
    assert cur.statements[-1] == "UNLOCK TABLES"  # before any row is read
    assert (state.flavor, state.gtid, state.log_file, state.log_pos) == (
        "mysql_gtid",
        f"{UUID_A}:1-100",
        "binlog.000009",
        4242,
    )
    assert binary_log_status(_Cursor(new_syntax))["File"] == "binlog.000009"


def test_mysql_57_is_refused_with_what_to_use() -> None:
    (problem,) = upstream_problems("5.7.44-log", GOOD, "GRANT ALL PRIVILEGES ON *.* TO `cdc`@`%`")
    assert "MySQL 5.7.44-log is too old" in problem and "8.0" in problem


def test_mysql_8_needs_row_metadata_and_reload_for_the_snapshot() -> None:
    grants = "GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `cdc`@`%`"
    problems = upstream_problems("8.0.36", GOOD | {"binlog_row_metadata": "MINIMAL"}, grants)
    assert problems == [
        "binlog_row_metadata is MINIMAL, need FULL: SET GLOBAL binlog_row_metadata=FULL and put "
        "binlog_row_metadata=FULL under [mysqld] in the server's config (sessions opened before "
        "keep the old value)",
        "the user lacks RELOAD: GRANT RELOAD ON *.* TO the puller's user",
    ]
    assert upstream_problems("8.0.36", GOOD_8, grants.replace("SELECT,", "SELECT, RELOAD,")) == []


def test_mariadb_needs_no_reload() -> None:
    grants = "GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `cdc`@`%`"
    assert upstream_problems("10.11.6-MariaDB-0+deb12u1-log", GOOD_8, grants) == []

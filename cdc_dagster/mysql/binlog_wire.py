"""The binlog dump connection, read thin: raw events off the socket as fast as it gives them.

A replica connection (``COM_BINLOG_DUMP`` with MariaDB's ``@slave_connect_state``, MySQL's
``COM_BINLOG_DUMP_GTID`` with its executed GTID set, or a binlog file:pos) whose events
are cut from large socket reads and handed on as ``(type, timestamp, server_id, log_pos,
body)``: the body after the 19-byte common header, its CRC32 checked and cut. Nothing is
decoded here; a table map or a row image stays bytes (``upstream.binlog_rows`` mounts
them later, in the data plane). mysql-replication spends ~60 µs per event in its event
objects, which caps a sysbench-shaped stream (ten events per transaction) near 7k row
changes/s; this reads ~250k events/s on one core.

pymysql opens and authenticates the connection; its socket is then read directly.
"""

from __future__ import annotations

import select
import struct
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pymysql
from pymysql.constants import CR
from pymysqlreplication.gtid import GtidSet

from cdc_dagster.mysql.errors import PullerError
from cdc_dagster.mysql.position import binary_log_status
from cdc_dagster.mysql.state import PullerState
from cdc_dagster.mysql.upstream import connect
from cdc_dagster.upstream.uri import UpstreamConfig

COM_BINLOG_DUMP = 0x12
COM_BINLOG_DUMP_GTID = 0x1E
MAX_PACKET = 0xFFFFFF
HEADER = struct.Struct("<IBIIIH")  # timestamp, type, server id, event size, log pos, flags
# A packet's length (3 bytes) and sequence number, its OK byte, then the event's HEADER
EVENT_HEAD = struct.Struct("<IBIBIIIH")
PACKET_LENGTH = struct.Struct("<I")
READ_CHUNK = 1 << 20
# No byte for this long: the server has sent what it had. Reading a backlog, a reader
# faster than the server's dump thread finds the socket empty for moments (tens of ms seen).
DRAINED_WAIT_S = 0.02  # at the live edge (the last event is at most a second old)
DRAINED_BEHIND_WAIT_S = 0.1  # behind it

RawEvent = tuple[int, int, int, int, bytes]  # type, timestamp, server id, log pos, body


def dump_request(state: PullerState, server_id: int) -> bytes:
    """The dump command for where ``state`` says the stream resumes (with its header)."""
    if state.flavor == "mariadb":
        body = struct.pack("<BIHI", COM_BINLOG_DUMP, 4, 0, server_id)  # file: from the GTID
    elif state.flavor == "mysql_gtid":
        if not state.gtid_set:
            # An empty set would stream the whole binlog history
            raise PullerError("the puller state holds an empty MySQL GTID set; re-snapshot")
        gtids = GtidSet(state.gtid_set)
        body = struct.pack("<BHIIQ", COM_BINLOG_DUMP_GTID, 0x04, server_id, 0, 4)
        body += struct.pack("<I", gtids.encoded_length) + gtids.encoded()
    elif state.flavor == "mysql_file":
        if not state.log_file:
            raise PullerError("the puller state holds no binlog file:pos; re-snapshot")
        body = struct.pack("<BIHI", COM_BINLOG_DUMP, state.log_pos, 0, server_id)
        body += state.log_file.encode()
    else:
        raise PullerError(f"unknown upstream flavor {state.flavor!r} in the puller state")
    return struct.pack("<I", len(body))[:3] + b"\0" + body


def session_settings(state: PullerState, heartbeat_s: float) -> list[tuple[str, tuple]]:
    """The session variables a replica sets before its dump (checksums, heartbeats, GTIDs)."""
    out: list[tuple[str, tuple]] = [
        ("SET @master_binlog_checksum = @@global.binlog_checksum", ()),
        ("SET @master_heartbeat_period = %s", (int(heartbeat_s * 1e9),)),
        ("SET @mariadb_slave_capability = 4", ()),  # real GTID events, not dummies
    ]
    if state.flavor == "mariadb":
        out += [
            ("SET @slave_connect_state = %s", (state.gtid,)),
            ("SET @slave_gtid_strict_mode = 1", ()),
            ("SET @slave_gtid_ignore_duplicates = 0", ()),
        ]
    return out


def binlog_end(cur: Any) -> tuple[str, int] | None:
    """Where the server's binlog ends now, ``(file, position)``; None: not known (no
    ``BINLOG MONITOR`` / ``REPLICATION CLIENT`` grant, binlog off)."""
    try:
        status = binary_log_status(cur)
    except pymysql.MySQLError:
        return None
    return None if status is None else (str(status["File"]), int(status["Position"]))


class BinlogStream:
    """One dump connection; ``events()`` yields raw events until it fails or is closed.

    ``end`` is where the server's binlog ended as the dump began (``binlog_end``): the
    events up to it are a backlog, all there to read at once; those after it came live.

    A lost or silent connection (no event, not even a heartbeat, for ``read_timeout_s``)
    raises ``pymysql.err.OperationalError`` (``CR_SERVER_LOST``); a server error packet
    raises ``OperationalError`` with the server's code (1236: the binlog is gone).
    """

    def __init__(
        self,
        upstream: UpstreamConfig,
        state: PullerState,
        heartbeat_s: float = 1.0,
        read_timeout_s: float = 30.0,
    ) -> None:
        self.conn = connect(upstream)
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT @@global.binlog_checksum, @@server_id")
                checksum, self.server_id = cur.fetchone()  # the server streaming its binlog
                self.checksum = str(checksum or "NONE").upper() != "NONE"
                for sql, args in session_settings(state, heartbeat_s):
                    cur.execute(sql, args)
                self.end = binlog_end(cur)
            self.conn._write_bytes(dump_request(state, upstream.server_id))
            self.sock = self.conn._sock
            self.sock.settimeout(read_timeout_s)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            self.conn.close()
        except pymysql.MySQLError:
            self.conn._force_close()  # the server is gone already

    def drained(self, last_event_time: float) -> bool:
        """Whether the server has sent nothing more for now: no byte waits on the socket
        (nor in its TLS layer), nor comes within DRAINED_WAIT_S, or DRAINED_BEHIND_WAIT_S
        when the last event read (its binlog timestamp, ``last_event_time``) is more than a
        second old. Between two of ``batches()``'s lists: the end of a backlog."""
        pending = getattr(self.sock, "pending", None)  # an SSLSocket's decrypted bytes
        if pending is not None and pending():
            return False
        behind = time.time() - last_event_time > 1.0
        try:
            readable, _, _ = select.select(
                [self.sock], [], [], DRAINED_BEHIND_WAIT_S if behind else DRAINED_WAIT_S
            )
        except (OSError, ValueError):  # closed: the next read says how
            return False
        return not readable

    def events(self) -> Iterator[RawEvent]:
        """Raw events: ``(type, timestamp, server_id, log_pos, body)``."""
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[list[RawEvent]]:
        """Raw events, a list per socket read: every whole event the read completed.

        The framing runs in one loop over the read buffer, so the per-event Python work is
        one header unpack, the CRC32 and one copy of the body (a generator switch or a
        second copy per event cost a third of a busy puller's time). Packets that continue
        (payload of 16 MiB - 1), are too short for an event header, or are not events take
        the general path.
        """
        trailer = 4 if self.checksum else 0
        head = EVENT_HEAD.unpack_from
        length = PACKET_LENGTH.unpack_from
        crc32 = zlib.crc32
        parts: list[bytes] = []  # a payload split over several packets, so far
        buf, pos = b"", 0
        while True:
            out: list[RawEvent] = []
            have, view, need = len(buf), memoryview(buf), 4
            while have - pos >= 4:
                n = length(buf, pos)[0] & MAX_PACKET
                stop = pos + 4 + n
                if stop > have:
                    need = stop - have  # the rest of this packet
                    break
                if n < 20 + trailer or n == MAX_PACKET or parts or buf[pos + 4] != 0:
                    parts.append(buf[pos + 4 : stop])
                    pos = stop
                    if n == MAX_PACKET:
                        continue
                    payload = b"".join(parts)
                    parts = []
                    if payload[:1] != b"\0":
                        if out:
                            yield out
                        self._not_an_event(payload)
                        return
                    out.append(self._event(payload, trailer))
                    continue
                _, _, ts, typ, server_id, size, log_pos, _ = head(buf, pos)
                end = stop - trailer
                if size != n - 1 or (
                    trailer
                    and crc32(view[pos + 5 : end]) != int.from_bytes(buf[end:stop], "little")
                ):
                    raise _corrupt(typ, log_pos)
                out.append((typ, ts, server_id, log_pos, buf[pos + 24 : end]))
                pos = stop
            if out:
                yield out
            buf, pos = buf[pos:] + self._recv(need), 0

    @staticmethod
    def _event(payload: bytes, trailer: int) -> RawEvent:
        """An event packet's payload (its OK byte first) as a raw event, checked."""
        if len(payload) < 20 + trailer:
            raise PullerError(
                f"a binlog packet of {len(payload)} bytes is too short for an event: the stream "
                "is corrupt (the puller reconnects next run)"
            )
        ts, typ, server_id, size, log_pos, _ = HEADER.unpack_from(payload, 1)
        end = len(payload) - trailer
        if size != len(payload) - 1 or (
            trailer
            and zlib.crc32(memoryview(payload)[1:end]) != int.from_bytes(payload[end:], "little")
        ):
            raise _corrupt(typ, log_pos)
        return typ, ts, server_id, log_pos, payload[20:end]

    @staticmethod
    def _not_an_event(packet: bytes) -> None:
        if packet[0] == 0xFE:  # EOF: a non-blocking dump ended
            return
        if packet[0] == 0xFF:
            code = int.from_bytes(packet[1:3], "little")
            message = packet[9:].decode("utf-8", "replace")
            raise pymysql.err.OperationalError(code, message)
        raise PullerError(f"unexpected packet 0x{packet[0]:02x} in the binlog stream")

    def _recv(self, want: int) -> bytes:
        try:
            chunk = self.sock.recv(max(READ_CHUNK, want))
        except OSError as exc:  # a timeout too: not even a heartbeat came
            raise pymysql.err.OperationalError(
                CR.CR_SERVER_LOST, f"binlog stream lost: {exc!r}"
            ) from None
        if not chunk:
            raise pymysql.err.OperationalError(CR.CR_SERVER_LOST, "binlog stream closed")
        return chunk


def _corrupt(typ: int, log_pos: int) -> PullerError:
    return PullerError(
        f"binlog event of type {typ} at log position {log_pos} fails its size or "
        "CRC32 check: the stream is corrupt (the puller reconnects next run)"
    )


def mariadb_gtid(server_id: int, body: bytes) -> tuple[int, str, bool]:
    """A MariaDB GTID event: its domain, ``domain-server-seq``, whether FL_STANDALONE."""
    seq, domain, flags = struct.unpack_from("<QIB", body)
    return domain, f"{domain}-{server_id}-{seq}", bool(flags & 1)


def mysql_gtid(body: bytes) -> str:
    """A MySQL GTID event: ``uuid:gno``."""
    sid = body[1:17].hex()
    gno = int.from_bytes(body[17:25], "little")
    return f"{sid[:8]}-{sid[8:12]}-{sid[12:16]}-{sid[16:20]}-{sid[20:]}:{gno}"


def query_event(body: bytes) -> tuple[str, str]:
    """(default database, statement) of a query event."""
    db_len, status_len = body[8], int.from_bytes(body[11:13], "little")
    p = 13 + status_len
    db = body[p : p + db_len].decode("utf-8", "replace")
    return db, body[p + db_len + 1 :].decode("utf-8", "replace")


def rotate_event(body: bytes) -> tuple[str, int]:
    """(next binlog file, position in it) of a rotate event."""
    return body[8:].decode("utf-8", "replace"), int.from_bytes(body[:8], "little")


__all__: list[Any] = [
    "BinlogStream",
    "dump_request",
    "mariadb_gtid",
    "mysql_gtid",
    "query_event",
    "rotate_event",
    "session_settings",
]

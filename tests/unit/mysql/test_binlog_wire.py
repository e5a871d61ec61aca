"""The dump stream's framing: events cut from socket reads of any size, checked, batched."""

from __future__ import annotations

import random
import struct
import zlib

import pymysql
import pytest

from cdc_dagster.mysql.binlog_wire import MAX_PACKET, BinlogStream
from cdc_dagster.mysql.errors import PullerError


def event(typ: int, body: bytes, *, ts: int = 1700000000, server_id: int = 1, log_pos: int = 0,
          checksum: bool = True) -> bytes:  # fmt: skip
    """One event packet's payload: OK byte, 19-byte header, body, CRC32."""
    size = 19 + len(body) + (4 if checksum else 0)
    header = struct.pack("<IBIIIH", ts, typ, server_id, size, log_pos, 0)
    raw = header + body
    return b"\0" + raw + (struct.pack("<I", zlib.crc32(raw)) if checksum else b"")


def packets(payload: bytes, seq: int = 1) -> bytes:
    """``payload`` framed as MySQL packets (split at 16 MiB - 1, as the server does)."""
    out, i = [], 0
    while True:
        part = payload[i : i + MAX_PACKET]
        out.append(struct.pack("<I", len(part))[:3] + bytes([seq & 0xFF]) + part)
        seq, i = seq + 1, i + MAX_PACKET
        if len(part) < MAX_PACKET:
            return b"".join(out)


class _Socket:
    """Hands out ``data`` in reads of the given sizes (then the rest, then nothing)."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data, self.sizes = data, list(sizes)

    def recv(self, n: int) -> bytes:
        take = min(n, self.sizes.pop(0) if self.sizes else len(self.data))
        chunk, self.data = self.data[:take], self.data[take:]
        return chunk


def stream(data: bytes, sizes: list[int], checksum: bool = True) -> BinlogStream:
    s = object.__new__(BinlogStream)  # no server: the socket is a fake
    s.sock, s.checksum = _Socket(data, sizes), checksum
    return s


EVENTS = [(19, b"m" * 40, 100), (23, b"r" * 300, 200), (16, b"x" * 8, 300)] * 50
EOF_PACKET = packets(b"\xfe\0\0\0\0")


def wire(events=EVENTS, checksum: bool = True) -> bytes:
    return b"".join(packets(event(t, b, log_pos=p, checksum=checksum)) for t, b, p in events)


@pytest.mark.parametrize("checksum", [True, False])
def test_events_read_the_same_whatever_the_socket_reads_cut(checksum: bool) -> None:
    data = wire(checksum=checksum) + EOF_PACKET
    rng = random.Random(7)
    for sizes in ([len(data)], [1] * 64, [rng.randint(1, 700) for _ in range(400)]):
        got = list(stream(data, sizes, checksum).events())
        assert [(t, p, b) for t, _, _, p, b in got] == [(t, p, b) for t, b, p in EVENTS]


def test_batches_hold_every_whole_event_of_a_read() -> None:
    data = wire() + EOF_PACKET
    batches = list(stream(data, [len(data)]).batches())
    assert len(batches) == 1 and len(batches[0]) == len(EVENTS)


def test_an_event_longer_than_one_packet_is_joined() -> None:
    big = b"b" * (MAX_PACKET + 1000)  # the payload continues in a second packet
    data = wire(EVENTS[:3]) + packets(event(23, big, log_pos=9)) + wire(EVENTS[:3]) + EOF_PACKET
    got = list(stream(data, [4096] * 10000).events())
    assert [len(b) for *_, b in got] == [40, 300, 8, len(big), 40, 300, 8]
    assert got[3][3] == 9 and got[3][4] == big


def test_a_corrupt_event_is_refused_naming_its_position() -> None:
    payload = bytearray(event(23, b"r" * 300, log_pos=4242))
    payload[100] ^= 0xFF
    data = wire(EVENTS[:3]) + packets(bytes(payload))
    with pytest.raises(PullerError, match="at log position 4242 fails its size or CRC32"):
        list(stream(data, [len(data)]).events())


def test_a_packet_too_short_for_an_event_is_refused() -> None:
    data = wire(EVENTS[:3]) + packets(b"\0" + b"z" * 10)
    with pytest.raises(PullerError, match="too short for an event"):
        list(stream(data, [len(data)]).events())


def test_an_error_packet_raises_the_servers_error_after_the_events_before_it() -> None:
    err = packets(b"\xff" + struct.pack("<H", 1236) + b"#HY000" + b"binlog purged")
    data = wire(EVENTS[:3]) + err
    got = []
    with pytest.raises(pymysql.err.OperationalError) as exc:
        for e in stream(data, [len(data)]).events():
            got.append(e)
    assert exc.value.args == (1236, "binlog purged") and len(got) == 3


def test_a_closed_connection_is_a_lost_server() -> None:
    data = wire(EVENTS[:3])
    with pytest.raises(pymysql.err.OperationalError, match="binlog stream closed"):
        list(stream(data, [len(data)]).events())

"""The two chunk clients (``cdc_dagster.mysql.chunk_select``): connectorx and pymysql give the
same rows in the same layout for every column type, chunk the same keys the same way, and
each chunk's rows are the table exactly at the binlog position read with them."""

from __future__ import annotations

import threading
from decimal import Decimal

import connectorx
import pyarrow as pa
import pytest

from cdc_dagster.mysql.catalog import IdRegistry, build_schema, read_table
from cdc_dagster.mysql.chunk_select import (
    ArrowClient,
    RowClient,
    arrow_keys,
    arrow_select,
    client_for,
)
from cdc_dagster.mysql.state import parse_gtid_pos
from cdc_dagster.schema import TableSchema
from cdc_dagster.upstream.uri import parse_uri


def execute(mariadb, db: str, *statements: str, args: tuple = ()) -> None:
    c = mariadb.connect(database=db)
    with c.cursor() as cur:
        for s in statements:
            cur.execute(s, args or None)
    c.close()


def schema_of(mariadb, db: str, table: str) -> TableSchema:
    c = mariadb.connect()
    try:
        raw = read_table(c, db, table)
    finally:
        c.close()
    assert raw is not None
    return build_schema(raw, 1, IdRegistry(), None)


def read_all(client, limit: int) -> tuple[pa.Table, list[tuple]]:
    """Every row in ``limit``-row chunks (keyset from each chunk's last key); the chunks' ends."""
    parts, ends, lo = [], [], None
    while True:
        got = client.select((lo, None), limit, snapshot=True)
        parts.append(got.rows)
        if got.rows.num_rows < limit:
            return pa.concat_tables(parts), ends
        lo = got.last_key
        ends.append(lo)


WIDE = """CREATE TABLE w (
  id INT PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED,
  mi MEDIUMINT, mu MEDIUMINT UNSIGNED, ii INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED,
  d1 DECIMAL(10,2), d2 DECIMAL(65,30), f FLOAT, dbl DOUBLE, ch CHAR(5), vc VARCHAR(50),
  tx TEXT, bn BINARY(4), vb VARBINARY(10), bl BLOB, js JSON, en ENUM('a','b','c'),
  st SET('x','y','z'), b1 BIT(5), b64 BIT(64), yr YEAR, dt DATE, dtm DATETIME(6),
  ts TIMESTAMP(3) NULL DEFAULT NULL, tm TIME(6), vbin VARCHAR(10) COLLATE utf8mb4_bin
)"""

WIDE_ROWS = [
    "INSERT INTO w VALUES (1, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, "
    "4294967295, -9223372036854775808, 18446744073709551615, -12345678.90, "
    "12345678901234567890123456789012345.123456789012345678901234567891, 3.14159, "
    "2.718281828459045, 'ab', 'héllo 😀', 'long text', X'00010203', X'ff00', X'000102', "
    "'{\"k\": [1, 2.5, \"v\"]}', 'b', 'x,z', b'10101', b'1111111111111111111111111111111111111111111111111111111111111111', "
    "2024, '2024-02-29', '2024-02-29 23:59:59.123456', '2038-01-19 03:14:07.999', "
    "'-838:59:59.000000', 'ÄÖÜ')",
    "INSERT INTO w (id) VALUES (2)",
    "INSERT INTO w VALUES (3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -0.5, -1e300, '', '', '', "
    "X'', X'', X'', 'null', 'a', '', b'0', b'0', 0, '1000-01-01', '1970-01-01 00:00:00', "
    "'1970-01-01 00:00:01', '00:00:00.5', '')",
    "INSERT INTO w VALUES (4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0.01, 0.1, 1e-30, 5e-324, "
    "'x y ', 'trailing  ', 'tab\there\nnewline', X'41', X'42', X'43', '[]', 'c', 'x,y,z', "
    "b'1', b'1', 1901, '9999-12-31', '9999-12-31 23:59:59.999999', "
    "'2000-06-15 12:00:00.5', '838:59:59.000000', 'b')",
]


def test_both_clients_give_every_column_type_the_same_values_and_layout(mariadb, mydb):
    execute(mariadb, mydb, "SET SESSION sql_mode = ''", WIDE, *WIDE_ROWS)
    # zero dates, as a lax sql_mode lets them in
    execute(mariadb, mydb, "SET SESSION sql_mode = ''",
            "INSERT INTO w (id, dt, dtm) VALUES (5, '0000-00-00', '2024-00-10 00:00:00')")  # fmt: skip
    schema = schema_of(mariadb, mydb, "w")
    upstream = parse_uri(mariadb.uri())
    arrow, rows = ArrowClient(upstream, schema, 7), RowClient(upstream, schema, 7)
    try:
        a, r = read_all(arrow, 2), read_all(rows, 2)
    finally:
        rows.close()
    assert a[0].schema == r[0].schema
    assert a[0].to_pylist() == r[0].to_pylist()
    assert a[1] == r[1] == [(2,), (4,)]
    got = {row["c1"]: row for row in a[0].to_pylist()}
    by_name = {c.name: f"c{c.id}" for c in schema.columns}
    assert got[1][by_name["bu"]] == Decimal(18446744073709551615)
    assert got[1][by_name["b64"]] == Decimal(2**64 - 1)
    assert got[1][by_name["d2"]] == Decimal(
        "12345678901234567890123456789012345.123456789012345678901234567891"
    )
    assert got[1][by_name["tm"]] == -(838 * 3600 + 59 * 60 + 59) * 1_000_000
    assert got[5][by_name["dt"]] is None and got[5][by_name["dtm"]] is None
    assert got[2][by_name["ii"]] is None


@pytest.mark.parametrize(
    "ddl, values",
    [
        ("k VARCHAR(20) COLLATE utf8mb4_general_ci", ["a", "B", "c", "é", "z", "😀", "ß", "ñ2"]),
        ("k VARBINARY(8)", [b"\x00", b"\x00\x01", b"\x7f", b"\x80", b"\xff", b"a", b"B", b"'"]),
        ("k DECIMAL(8,3)", [Decimal("-1.5"), Decimal("0.001"), Decimal("2"), Decimal("99999.999")]),
        ("k BIGINT UNSIGNED", [0, 1, 2**63, 2**64 - 1, 2**63 - 1, 5]),
    ],
)
def test_keyset_chunks_over_awkward_keys_read_every_row_once(mariadb, mydb, ddl, values):
    execute(mariadb, mydb, f"CREATE TABLE k ({ddl} PRIMARY KEY, n INT)")
    c = mariadb.connect(database=mydb)
    with c.cursor() as cur:
        cur.executemany("INSERT INTO k VALUES (%s, %s)", [(v, i) for i, v in enumerate(values)])
    c.close()
    schema = schema_of(mariadb, mydb, "k")
    assert arrow_keys(schema)
    upstream = parse_uri(mariadb.uri())
    rows = RowClient(upstream, schema, 1)
    try:
        a, r = read_all(ArrowClient(upstream, schema, 1), 3), read_all(rows, 3)
    finally:
        rows.close()
    assert a[0].to_pylist() == r[0].to_pylist()
    assert a[1] == r[1]  # the same chunk ends: a range resumed by the other client goes on
    assert sorted(a[0].column(f"c{schema.columns[1].id}").to_pylist()) == list(range(len(values)))


def test_composite_key_chunks_and_a_date_key_takes_the_rows_client(mariadb, mydb):
    execute(mariadb, mydb, "CREATE TABLE ck (a INT, b VARCHAR(5), v INT, PRIMARY KEY (a, b))",
            "INSERT INTO ck SELECT seq % 3, CONCAT('k', seq), seq FROM seq_1_to_20",
            "CREATE TABLE dk (d DATETIME PRIMARY KEY, v INT)")  # fmt: skip
    upstream = parse_uri(mariadb.uri())
    schema = schema_of(mariadb, mydb, "ck")
    got, ends = read_all(ArrowClient(upstream, schema, 1), 6)
    assert sorted(got.column(f"c{schema.columns[2].id}").to_pylist()) == list(range(1, 21))
    assert len(ends) == 3
    dk = schema_of(mariadb, mydb, "dk")
    assert not arrow_keys(dk)
    client = client_for(upstream, dk, 1)
    assert isinstance(client, RowClient)
    client.close()
    with pytest.raises(ValueError, match="rows client"):
        client_for(upstream, dk, 1, prefer="arrow")


@pytest.mark.parametrize("gtid_positions", [True, False], ids=["gtids", "coordinates"])
@pytest.mark.parametrize("client_class", [ArrowClient, RowClient])
def test_chunk_rows_are_the_table_exactly_at_the_position_read_with_them(
    mariadb, mydb, client_class, gtid_positions
):
    """One writer increments a counter row, one transaction (one GTID) per increment, and
    nothing else writes: a snapshot at GTID sequence s shows the counter at s - s0. Read
    as binlog coordinates, the position is this server's, and MariaDB's own
    ``BINLOG_GTID_POS`` of them is that GTID."""
    execute(mariadb, mydb, "CREATE TABLE c (id INT PRIMARY KEY, n INT)",
            "INSERT INTO c VALUES (1, 0)")  # fmt: skip
    c = mariadb.connect()
    with c.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos, @@gtid_domain_id")
        pos, domain = cur.fetchone()
    c.close()
    s0 = int(parse_gtid_pos(pos)[domain].rsplit("-", 1)[1])
    stop = threading.Event()

    def write() -> None:
        w = mariadb.connect(database=mydb)
        with w.cursor() as cur:
            while not stop.is_set():
                cur.execute("UPDATE c SET n = n + 1 WHERE id = 1")
        w.close()

    schema = schema_of(mariadb, mydb, "c")
    client = client_class(parse_uri(mariadb.uri()), schema, 1, gtid_positions)
    th = threading.Thread(target=write, daemon=True)
    th.start()
    seen = set()
    ask = mariadb.connect()
    try:
        for _ in range(60):
            got = client.select((None, None), 10, snapshot=True)
            if gtid_positions:
                assert got.binlog is None
                text = got.position[domain]
            else:
                assert got.position == {}
                server_id, log_file, offset = got.binlog
                with ask.cursor() as cur:
                    cur.execute("SELECT @@server_id, BINLOG_GTID_POS(%s, %s)", (log_file, offset))
                    sid, gtids = cur.fetchone()
                assert server_id == sid
                text = parse_gtid_pos(gtids)[domain]
            seq = int(text.rsplit("-", 1)[1])
            n = got.rows.column(f"c{schema.columns[1].id}")[0].as_py()
            assert n == seq - s0, (n, seq, s0)
            seen.add(n)
    finally:
        stop.set()
        th.join(10)
        client.close()
        ask.close()
    assert len(seen) > 10  # the writer moved on between the reads


@pytest.mark.parametrize("gtid_positions", [True, False], ids=["gtids", "coordinates"])
def test_a_many_row_chunk_carries_its_position_once_and_every_chunk_has_one(
    mariadb, mydb, gtid_positions
):
    """connectorx's chunk SELECT sends the snapshot's position on its first row only (a
    string on every row cost ~25% more client CPU per row); each SELECT of the client still
    gets its own (the marker variable is reset before each), and the rows never carry it."""
    execute(mariadb, mydb, "CREATE TABLE m (id INT PRIMARY KEY, v VARCHAR(10))",
            "INSERT INTO m SELECT seq, 'v' FROM seq_1_to_500")  # fmt: skip
    schema = schema_of(mariadb, mydb, "m")
    client = ArrowClient(parse_uri(mariadb.uri()), schema, 1, gtid_positions)
    sql = client.snapshot_sql
    assert any("@cdc_snapshot_pos_sent = NULL" in s for s in sql)
    last = None
    for _ in range(5):  # chunks of 100 rows, one after another on the same client
        got = client.select((last, None), 100, snapshot=True)
        assert got.rows.num_rows == 100
        assert "_pos" not in got.rows.column_names
        if gtid_positions:
            assert got.position and got.binlog is None
        else:
            assert got.position == {} and got.binlog is not None
        last = got.last_key
    assert last == (500,)
    raw = connectorx.read_sql(client.url, arrow_select(schema, (None, None), 100, position=True,
                                                      gtids=gtid_positions),
                              return_type="arrow", pre_execution_query=sql)  # fmt: skip
    assert raw.column("_pos").null_count == 99

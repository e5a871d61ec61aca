"""PostgresSink against a private PostgreSQL: round trip, fencing, replay, DDL, identifiers, edges."""

from __future__ import annotations

import datetime as dt
import pickle
import threading
from decimal import Decimal

import psycopg
import pyarrow as pa
import pytest

from cdc_dagster.schema import ColumnSchema, DdlRecord, IndexSchema, TableSchema
from cdc_dagster.sinks.base import (
    COMMIT_TS_COLUMN,
    OP_COLUMN,
    Committed,
    FencedError,
    SinkDDLError,
    SinkError,
    SinkGapError,
    SinkSchemaError,
)
from cdc_dagster.sinks.postgres import PostgresSink, redact_uri
from scheduler_core.ddl import DDLKind

CF = "cf1"


def accounts(table_id: int = 7, **kw) -> TableSchema:
    cols = kw.pop(
        "columns",
        (
            ColumnSchema(1, "id", "int64", False),
            ColumnSchema(2, "balance", "decimal(18,2)", False, "0.00"),
            ColumnSchema(3, "name", "string", True),
        ),
    )
    return TableSchema(
        table_id, kw.pop("database", "bank"), kw.pop("table", "accounts"), cols, (1,), **kw
    )


def batch(t: TableSchema, rows: list[dict], ts: int = 100) -> pa.Table:
    """Rows as dicts (plus optional ``op``: 0 upsert, 1 delete) in the sink batch layout."""
    data = {c.name: [r.get(c.name) for r in rows] for c in t.columns}
    arrays = [pa.array(data[c.name], type=c.arrow) for c in t.columns]
    arrays += [
        pa.array([r.get("op", 0) for r in rows], pa.int8()),
        pa.array([ts] * len(rows), pa.int64()),
    ]
    names = [c.name for c in t.columns] + [OP_COLUMN, COMMIT_TS_COLUMN]
    return pa.Table.from_arrays(arrays, names=names)


def rows_of(conn: psycopg.Connection, t: TableSchema) -> list[tuple]:
    q = psycopg.sql.SQL("SELECT * FROM {}.{} ORDER BY 1").format(
        psycopg.sql.Identifier(t.database), psycopg.sql.Identifier(t.table)
    )
    return conn.execute(q).fetchall()


def test_round_trip_upserts_updates_deletes(pg_uri, pg_conn):
    sink, t = PostgresSink(pg_uri), accounts()
    token = sink.acquire(CF, t)
    rows = [{"id": 1, "balance": Decimal("1.50"), "name": "a"}, {"id": 2, "balance": Decimal("2")}]
    assert sink.write(CF, t, batch(t, rows), 0, 100, token) == 100
    assert rows_of(pg_conn, t) == [(1, Decimal("1.50"), "a"), (2, Decimal("2.00"), None)]
    change = [{"id": 1, "balance": Decimal("9.99"), "name": "b"}, {"id": 2, "op": 1}, {"id": 3}]
    change[2]["balance"] = Decimal("3")
    assert sink.write(CF, t, batch(t, change, 200), 100, 200, token) == 200
    assert rows_of(pg_conn, t) == [(1, Decimal("9.99"), "b"), (3, Decimal("3.00"), None)]
    assert sink.committed(CF, t).committed_ts == 200
    assert sink.committed(CF, t).token == token


def test_replayed_batch_is_a_noop(pg_uri, pg_conn):
    sink, t = PostgresSink(pg_uri), accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1)}]), 0, 100, token)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(2)}], 200), 100, 200, token)
    # the first batch again (a crash before the pipeline noted its commit): nothing changes
    assert sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1)}]), 0, 100, token) == 200
    assert rows_of(pg_conn, t) == [(1, Decimal("2.00"), None)]


def test_batch_above_committed_is_a_gap(pg_uri):
    sink, t = PostgresSink(pg_uri), accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1)}]), 0, 100, token)
    with pytest.raises(SinkGapError, match="starts above the committed ts 100"):
        sink.write(CF, t, batch(t, [{"id": 2, "balance": Decimal(1)}]), 150, 200, token)


def test_stale_token_is_refused_and_changes_nothing(pg_uri, pg_conn):
    sink, t = PostgresSink(pg_uri), accounts()
    old = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1)}]), 0, 100, old)
    new = PostgresSink(pg_uri).acquire(CF, t)
    assert new > old
    with pytest.raises(FencedError, match=f"token {old} refused.*token is {new}"):
        sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(5)}], 200), 100, 200, old)
    assert rows_of(pg_conn, t) == [(1, Decimal("1.00"), None)]
    assert sink.committed(CF, t).committed_ts == 100


def test_racing_acquire_and_stale_write_never_both_pass(pg_uri, pg_conn):
    """A zombie writes while a new owner acquires: either the write lands before the bump or
    it is refused; the new owner's token is always the larger and its writes pass."""
    t = accounts()
    zombie, owner = PostgresSink(pg_uri), PostgresSink(pg_uri)
    old = zombie.acquire(CF, t)
    zombie.write(CF, t, batch(t, [{"id": 0, "balance": Decimal(0)}], 1), 0, 1, old)
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def write_zombie() -> None:
        barrier.wait()
        for i in range(20):
            try:
                b = batch(t, [{"id": 1, "balance": Decimal(i)}], 10 + i)
                zombie.write(CF, t, b, 9 + i if i else 1, 10 + i, old)
                outcomes.append("ok")
            except FencedError:
                outcomes.append("fenced")

    th = threading.Thread(target=write_zombie)
    th.start()
    barrier.wait()
    new = owner.acquire(CF, t)
    th.join()
    assert "fenced" in outcomes
    first_fenced = outcomes.index("fenced")
    assert all(o == "fenced" for o in outcomes[first_fenced:])
    c = owner.committed(CF, t)
    assert c.token == new
    assert owner.write(CF, t, batch(t, [{"id": 2, "balance": Decimal(2)}], 500), c.committed_ts,
                       500, new) == 500  # fmt: skip


def test_uri_env_reference_resolved_at_connect_and_password_redacted(pg_server, pg_db, monkeypatch):
    uri = f"postgresql://postgres:${{CDC_T_PW}}@127.0.0.1:{pg_server.port}/{pg_db}"
    sink = PostgresSink(uri)
    monkeypatch.delenv("CDC_T_PW", raising=False)
    with pytest.raises(SinkError, match=r"CDC_T_PW.*does not set"):
        sink.committed(CF, accounts())
    monkeypatch.setenv("CDC_T_PW", "anything")  # trust auth: any password works
    assert sink.committed(CF, accounts()).committed_ts == 0
    literal = f"postgresql://u:s3cr%40t@127.0.0.1:{pg_server.port}/{pg_db}"
    assert "s3cr" not in repr(PostgresSink(literal))
    assert redact_uri(literal) == f"postgresql://u:***@127.0.0.1:{pg_server.port}/{pg_db}"
    assert "s3cr" not in str(pickle.loads(pickle.dumps(PostgresSink(literal))))
    bad = f"postgresql://nobody:s3cret@127.0.0.1:{pg_server.port}/nodb_{pg_db}"
    with pytest.raises(SinkError) as err:
        PostgresSink(bad).committed(CF, accounts())
    assert "s3cret" not in str(err.value) and "***" in str(err.value)


def test_batch_not_fitting_schema_is_refused(pg_uri):
    sink, t = PostgresSink(pg_uri), accounts()
    token = sink.acquire(CF, t)
    b = batch(t, [{"id": 1, "balance": Decimal(1)}]).drop_columns(["name"])
    with pytest.raises(SinkSchemaError, match="missing \\['name'\\]"):
        sink.write(CF, t, b, 0, 100, token)


WEIRD = [
    ('we"ird', 'ta"ble; DROP TABLE x; --', "co`l"),
    ("ünïcødé", "表格😀", "列😀"),
    ("a b", "Robert'); DROP TABLE bank.accounts;--", 'x"; select 1; --'),
]


@pytest.mark.parametrize(("db", "table", "col"), WEIRD)
def test_weird_identifiers_land_faithfully_and_inject_nothing(pg_uri, pg_conn, db, table, col):
    cols = (ColumnSchema(1, "id", "int64", False), ColumnSchema(2, col, "string", True, "d'ef"))
    t = TableSchema(9, db, table, cols, (1,), (IndexSchema(f"i;{col}", (2,)),))
    sink = PostgresSink(pg_uri)
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, col: "v'; --"}]), 0, 100, token)
    assert rows_of(pg_conn, t) == [(1, "v'; --")]
    got = pg_conn.execute(
        "SELECT table_schema, table_name, column_name FROM information_schema.columns "
        "WHERE ordinal_position = 2 AND table_schema = %s",
        (db,),
    ).fetchall()
    assert got == [(db, table, col)]
    add = TableSchema(9, db, table, (*cols, ColumnSchema(3, col + "2", "int32", True, "7")), (1,),
                      t.indexes)  # fmt: skip
    rec = DdlRecord(200, DDLKind.ALTER_TABLE, "add_column", "ALTER ...", (9,), tables={9: add})
    sink.apply_ddl(CF, rec, {9: t})
    assert rows_of(pg_conn, add) == [(1, "v'; --", 7)]
    n = pg_conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema "
                        "NOT IN ('pg_catalog', 'information_schema')").fetchone()[0]  # fmt: skip
    assert n == 4  # the table + cdc_dagster's checkpoints, ddl_applied, syncpoints


def test_identifier_longer_than_postgres_keeps_is_refused(pg_uri):
    t = accounts(table="x" * 64)
    sink = PostgresSink(pg_uri)
    token = sink.acquire(CF, t)
    with pytest.raises(SinkSchemaError, match="64 bytes"):
        sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1)}]), 0, 100, token)


EDGE_COLUMNS = (
    ColumnSchema(1, "id", "int64", False),
    ColumnSchema(2, "i8", "int8", True),
    ColumnSchema(3, "i64", "int64", True),
    ColumnSchema(4, "u64", "uint64", True),
    ColumnSchema(5, "u32", "uint32", True),
    ColumnSchema(6, "d65", "decimal(65,30)", True),
    ColumnSchema(7, "f64", "float64", True),
    ColumnSchema(8, "s", "string", True),
    ColumnSchema(9, "b", "binary", True),
    ColumnSchema(10, "j", "json", True),
    ColumnSchema(11, "d", "date", False),
    ColumnSchema(12, "dt", "datetime", True),
    ColumnSchema(13, "ts", "timestamp", True),
    ColumnSchema(14, "t", "time", True),
    ColumnSchema(15, "bl", "bool", True),
    ColumnSchema(16, "f32", "float32", True),
)

D65 = Decimal("-" + "9" * 35 + "." + "9" * 30)
D65P = Decimal("9" * 35 + "." + "9" * 30)  # (-D65 would round to 28 digits)
EDGE_ROWS = [
    {
        "id": 1, "i8": -128, "i64": -(2**63), "u64": Decimal(2**64 - 1), "u32": 2**32 - 1,
        "d65": D65, "f64": 1.7976931348623157e308, "s": "😀 4-byte ü", "b": b"\x00\xff\x00",
        "j": '{"a": [1, 2.5, null], "b": "😀"}', "d": dt.date(1000, 1, 1),
        "dt": dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        "ts": dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC), "t": -(838 * 3600 + 59 * 60 + 59) * 10**6,
        "bl": True, "f32": 3.5,
    },
    {"id": 2, "i8": 127, "i64": 2**63 - 1, "u64": Decimal(0), "u32": 0, "d65": D65P,
     "t": 838 * 3600 * 10**6 + 1, "s": "", "b": b"", "d": None},
    {"id": 3},  # NULLs everywhere (a zero date upstream arrives as NULL)
]  # fmt: skip


def test_edge_values_replicate_exactly(pg_uri, pg_conn):
    t = TableSchema(11, "edge", "types", EDGE_COLUMNS, (1,))
    sink = PostgresSink(pg_uri)
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, EDGE_ROWS), 0, 100, token)
    got = rows_of(pg_conn, t)
    r1 = got[0]
    assert r1[:7] == (1, -128, -(2**63), Decimal(2**64 - 1), 2**32 - 1, D65, 1.7976931348623157e308)
    assert r1[7] == "😀 4-byte ü" and r1[8] == b"\x00\xff\x00"
    assert r1[9] == {"a": [1, 2.5, None], "b": "😀"}
    assert r1[10:13] == (
        dt.date(1000, 1, 1),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC),
    )
    assert r1[13] == -dt.timedelta(hours=838, minutes=59, seconds=59)
    assert r1[14:] == (True, 3.5)
    assert got[1][:7] == (2, 127, 2**63 - 1, Decimal(0), 0, D65P, None)
    assert got[1][13] == dt.timedelta(hours=838, microseconds=1)
    assert got[1][8] == b"" and got[1][7] == "" and got[1][10] is None
    assert got[2] == (3,) + (None,) * 15
    types = dict(pg_conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema='edge'"
    ).fetchall())  # fmt: skip
    assert types["u64"] == "numeric" and types["t"] == "interval" and types["j"] == "jsonb"


def _ddl(ts, kind, action, tables, before_ids=None, **kw):
    ids = before_ids if before_ids is not None else tuple(tables)
    return DdlRecord(ts, kind, action, f"-- {action}", ids, tables=tables, **kw)


def test_each_ddl_kind_applies_once(pg_uri, pg_conn):
    sink, t = PostgresSink(pg_uri), accounts()
    create = _ddl(50, DDLKind.CREATE_TABLE, "create_table", {7: t}, (), creates=(7,))
    sink.apply_ddl(CF, create, {7: None})
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1), "name": "a"}]), 50, 100, token)

    def step(ts, action, new, before, kind=DDLKind.ALTER_TABLE):
        rec = _ddl(ts, kind, action, {7: new})
        sink.apply_ddl(CF, rec, {7: before})
        sink.apply_ddl(CF, rec, {7: before})  # replay: skipped
        return new

    cols = t.columns
    # add column with a default: existing rows get it
    t2 = step(
        200,
        "add_column",
        accounts(columns=(*cols, ColumnSchema(4, "note", "string", False, "x"))),
        t,
    )
    assert rows_of(pg_conn, t2) == [(1, Decimal("1.00"), "a", "x")]
    # add NOT NULL column without default: MySQL's implicit zero
    t3 = step(
        210, "add_column", accounts(columns=(*t2.columns, ColumnSchema(5, "n", "int32", False))), t2
    )
    assert rows_of(pg_conn, t3) == [(1, Decimal("1.00"), "a", "x", 0)]
    t4 = step(300, "drop_column", accounts(columns=t3.columns[:2] + t3.columns[3:]), t3)
    assert rows_of(pg_conn, t4) == [(1, Decimal("1.00"), "x", 0)]
    renamed = (
        t4.columns[0],
        t4.columns[1],
        ColumnSchema(4, "memo", "string", False, "x"),
        t4.columns[3],
    )
    t5 = step(400, "rename_column", accounts(columns=renamed), t4)
    t6 = step(
        500,
        "modify_column",
        accounts(columns=(*t5.columns[:3], ColumnSchema(5, "n", "int64", True))),
        t5,
    )
    t7 = step(
        600, "add_index", accounts(columns=t6.columns, indexes=(IndexSchema("ix", (4,), True),)), t6
    )
    t8 = step(650, "drop_index", accounts(columns=t7.columns), t7)
    t9 = step(700, "truncate_table", t8, t8, DDLKind.TRUNCATE_TABLE)
    assert rows_of(pg_conn, t9) == []
    moved = accounts(columns=t9.columns, database="bank2", table="acc")
    rec = _ddl(800, DDLKind.RENAME_TABLES, "rename_table", {7: moved})
    sink.apply_ddl(CF, rec, {7: t9})
    sink.apply_ddl(CF, rec, {7: t9})
    sink.write(CF, moved, batch(moved, [{"id": 5, "balance": Decimal(5), "memo": "m", "n": 1}], 900),
               100, 900, token)  # fmt: skip
    assert rows_of(pg_conn, moved) == [(5, Decimal("5.00"), "m", 1)]
    info = pg_conn.execute(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_schema = 'bank2' AND table_name = 'acc' ORDER BY ordinal_position"
    ).fetchall()
    assert [r[0] for r in info] == ["id", "balance", "memo", "n"]
    assert info[3][1:] == ("bigint", "YES")
    idx = pg_conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname='bank2'").fetchall()
    assert sorted(i[0] for i in idx) == ["acc__pkey"]
    drop = _ddl(1000, DDLKind.DROP_TABLE, "drop_table", {7: None})
    sink.apply_ddl(CF, drop, {7: moved})
    sink.apply_ddl(CF, drop, {7: moved})
    assert pg_conn.execute("SELECT to_regclass('bank2.acc')").fetchone() == (None,)
    applied = pg_conn.execute("SELECT count(*) FROM cdc_dagster.ddl_applied").fetchone()[0]
    assert applied == 11


def test_unappliable_ddl_is_an_error_and_applies_nothing(pg_uri, pg_conn):
    sink, t = PostgresSink(pg_uri), accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1), "name": "abc"}]), 0, 100, token)
    bad = accounts(columns=(*t.columns[:2], ColumnSchema(3, "name", "int32", True)))
    with pytest.raises(SinkDDLError, match=r"bank\.accounts.*nothing was applied"):
        sink.apply_ddl(CF, _ddl(200, DDLKind.ALTER_TABLE, "modify_column", {7: bad}), {7: t})
    assert pg_conn.execute("SELECT count(*) FROM cdc_dagster.ddl_applied").fetchone()[0] == 0


def test_syncpoint_table(pg_uri, pg_conn):
    sink, t = PostgresSink(pg_uri), accounts()
    rec = sink.record_syncpoint(CF, 1234, [t])
    sink.record_syncpoint(CF, 1234, [t])
    assert rec.locations == {7: "bank.accounts"}
    rows = pg_conn.execute(
        "SELECT changefeed, upstream_ts, tables FROM cdc_dagster.syncpoints"
    ).fetchall()
    assert rows == [(CF, 1234, {"7": "bank.accounts"})]


def test_write_ending_at_a_syncpoint_copies_a_registered_table_that_then_moves_on(pg_uri, pg_conn):
    """Syncpoints hold nothing back: the write ending at one copies the table (if a reader
    registered it) in its own transaction; the record, made after the table moved on, keeps
    that copy; an unregistered table gets none."""
    from cdc_dagster.sinks import pg_syncpoint

    sink, t, other = PostgresSink(pg_uri), accounts(), accounts(8, table="other")
    pg_syncpoint.register(pg_conn, CF, [("bank", "accounts")])
    tokens = {x.table_id: sink.acquire(CF, x) for x in (t, other)}
    for x in (t, other):
        sink.write(CF, x, batch(x, [{"id": 1, "balance": Decimal(1)}]), 0, 100, tokens[x.table_id],
                   at_syncpoint=True)  # fmt: skip
        sink.write(CF, x, batch(x, [{"id": 1, "balance": Decimal(9)}], 150), 100, 150,
                   tokens[x.table_id])  # fmt: skip
    sink.record_syncpoint(CF, 100, [t, other])
    name = pg_syncpoint.copy_table_name(CF, 100, 7)
    copied = pg_conn.execute(f'SELECT id, balance FROM cdc_syncpoint."{name}"').fetchall()
    assert copied == [(1, Decimal("1.00"))]  # the state at 100, not the live 9
    assert pg_conn.execute(
        "SELECT upstream_ts, table_id FROM cdc_dagster.syncpoint_copies"
    ).fetchall() == [(100, 7)]
    assert rows_of(pg_conn, t) == [(1, Decimal("9.00"), None)]


def test_the_validators_feed_reads_a_syncpoint_once_it_is_recorded_not_before(
    pg_server, pg_db, pg_uri, pg_conn
):
    """One table's write ended at the syncpoint (its copy made), the other's did not yet (a
    frozen capture): the syncpoint is a partial set until recorded, and the feed the fault
    matrix validates shows it only then, with every table."""
    from cdc_dagster.sinks import pg_syncpoint
    from cdc_dagster.testing.validators import PostgresFeed

    sink, t, other = PostgresSink(pg_uri), accounts(), accounts(8, table="other")
    pg_syncpoint.register(pg_conn, CF, [("bank", "accounts"), ("bank", "other")])
    tokens = {x.table_id: sink.acquire(CF, x) for x in (t, other)}
    feed = PostgresFeed(pg_server.dsn(pg_db), CF)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1)}]), 0, 100, tokens[7],
               at_syncpoint=True)  # fmt: skip
    assert feed.syncpoints() == []  # table 8 not at 100 yet: nothing to read
    sink.write(CF, other, batch(other, [{"id": 2, "balance": Decimal(2)}]), 0, 100, tokens[8],
               at_syncpoint=True)  # fmt: skip
    sink.record_syncpoint(CF, 100, [t, other])
    [(ts, pinned)] = feed.syncpoints()
    assert ts == 100 and sorted(pinned) == [7, 8]


def test_record_copies_a_registered_table_not_past_the_syncpoint(pg_uri, pg_conn):
    """A table idle since before the syncpoint (its last write ended at 50 < 100) is at 100
    as it is: the record copies it. A syncpoint with a table already past it and no copy of
    it gets no copies at all (it cannot be built)."""
    from cdc_dagster.sinks import pg_syncpoint

    sink, t, late = PostgresSink(pg_uri), accounts(), accounts(8, table="late")
    pg_syncpoint.register(pg_conn, CF, [("bank", "accounts"), ("bank", "late")])
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(5)}], 50), 0, 50, sink.acquire(CF, t))
    sink.record_syncpoint(CF, 100, [t])
    name = pg_syncpoint.copy_table_name(CF, 100, 7)
    copied = pg_conn.execute(f'SELECT id, balance FROM cdc_syncpoint."{name}"').fetchall()
    assert copied == [(1, Decimal("5.00"))]
    sink.write(CF, late, batch(late, [], 250), 0, 250, sink.acquire(CF, late))
    sink.record_syncpoint(CF, 200, [t, late])
    assert pg_conn.execute(
        "SELECT upstream_ts, table_id FROM cdc_dagster.syncpoint_copies ORDER BY 1, 2"
    ).fetchall() == [(100, 7)]


@pytest.mark.slow
def test_postgres_restart_between_commits_loses_and_doubles_nothing(pg_server, pg_db, pg_uri):
    sink, t = PostgresSink(pg_uri), accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1)}]), 0, 100, token)
    pg_server.restart()  # the sink's connection is dead now
    sink.write(CF, t, batch(t, [{"id": 2, "balance": Decimal(2)}], 200), 100, 200, token)
    # a batch whose commit outcome the writer never learned is simply replayed
    sink.write(CF, t, batch(t, [{"id": 2, "balance": Decimal(2)}], 200), 100, 200, token)
    with psycopg.connect(pg_server.dsn(pg_db)) as conn:
        assert rows_of(conn, t) == [(1, Decimal("1.00"), None), (2, Decimal("2.00"), None)]
    assert sink.committed(CF, t) == Committed(200, token)


def test_killed_connection_is_reopened_for_the_next_write(pg_server, pg_db, pg_uri):
    sink, t = PostgresSink(pg_uri), accounts()
    token = sink.acquire(CF, t)
    conn = sink._connect()
    pid = conn.info.backend_pid
    with psycopg.connect(pg_server.dsn(pg_db), autocommit=True) as killer:
        killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1)}]), 0, 100, token)
    assert sink.committed(CF, t).committed_ts == 100


def test_open_sink_builds_a_working_postgres_sink(pg_uri):
    from cdc_dagster.sinks.uri import open_sink

    sink = open_sink(pg_uri)
    assert isinstance(sink, PostgresSink)
    t = accounts()
    assert sink.write(CF, t, batch(t, []), 0, 10, sink.acquire(CF, t)) == 10


@pytest.mark.slow
def test_connection_killed_during_a_commit_applies_the_batch_exactly_once(pg_server, pg_db, pg_uri):
    sink, t = PostgresSink(pg_uri), accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1)}]), 0, 100, token)
    with psycopg.connect(pg_server.dsn(pg_db), autocommit=True) as admin:
        # a slow statement trigger holds the batch's transaction open mid-MERGE
        admin.execute("CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS "
                      "$$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$")  # fmt: skip
        admin.execute('CREATE TRIGGER slow AFTER INSERT ON "bank"."accounts" '
                      "FOR EACH STATEMENT EXECUTE FUNCTION slow()")  # fmt: skip
        pid = sink._connect().info.backend_pid
        killer = threading.Timer(0.4, lambda: psycopg.connect(pg_server.dsn(pg_db), autocommit=True)
                                 .execute("SELECT pg_terminate_backend(%s)", (pid,)))  # fmt: skip
        killer.start()
        b = batch(t, [{"id": 2, "balance": Decimal(2)}, {"id": 1, "op": 1}], 200)
        try:
            sink.write(CF, t, b, 100, 200, token)  # killed mid-transaction, then retried
        except SinkError:
            sink.write(CF, t, b, 100, 200, token)  # the caller's replay
        killer.join()
        sink.write(CF, t, b, 100, 200, token)  # and once more: a no-op
        assert rows_of(admin, t) == [(2, Decimal("2.00"), None)]
    assert sink.committed(CF, t) == Committed(200, token)


def test_first_writes_of_two_tables_of_a_new_schema_at_once_both_create_their_table(
    pg_uri, pg_conn
):
    # Two Spark tasks writing two tables of one upstream database for the first time: each
    # creates the schema (IF NOT EXISTS) and its table; unserialized, one of them failed with
    # a unique violation in pg_namespace and its table stopped in error.
    for attempt in range(5):
        tables = [
            accounts(100 + 10 * attempt + i, database=f"race{attempt}", table=f"t{i}")
            for i in range(4)
        ]
        sinks = [PostgresSink(pg_uri) for _ in tables]
        tokens = [s.acquire(CF, t) for s, t in zip(sinks, tables, strict=True)]
        start = threading.Barrier(len(tables))
        errors: list[BaseException] = []

        def first_write(
            sink: PostgresSink,
            t: TableSchema,
            token: int,
            start: threading.Barrier = start,
            errors: list[BaseException] = errors,
        ) -> None:
            start.wait()
            try:
                sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1)}]), 0, 100, token)
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=first_write, args=a)
            for a in zip(sinks, tables, tokens, strict=True)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert errors == []
        for t in tables:
            assert rows_of(pg_conn, t) == [(1, Decimal("1.00"), None)]


@pytest.mark.slow
def test_postgres_restart_during_a_commit_applies_the_batch_exactly_once(pg_server, pg_db, pg_uri):
    sink, t = PostgresSink(pg_uri), accounts()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"id": 1, "balance": Decimal(1)}]), 0, 100, token)
    with psycopg.connect(pg_server.dsn(pg_db), autocommit=True) as admin:
        # a slow statement trigger holds the batch's transaction open mid-MERGE
        admin.execute("CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS "
                      "$$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$")  # fmt: skip
        admin.execute('CREATE TRIGGER slow AFTER INSERT ON "bank"."accounts" '
                      "FOR EACH STATEMENT EXECUTE FUNCTION slow()")  # fmt: skip
    restarted = threading.Event()

    def crash_and_restart() -> None:
        pg_server.stop("immediate")  # the server dies with the batch's transaction open
        pg_server.start()
        restarted.set()

    b = batch(t, [{"id": 2, "balance": Decimal(2)}, {"id": 1, "op": 1}], 200)
    threading.Timer(0.5, crash_and_restart).start()
    try:
        sink.write(CF, t, b, 100, 200, token)
        raise AssertionError("the write finished although the server died under it")
    except SinkError:
        pass  # the outcome is unknown to the writer: it replays
    assert restarted.wait(60)
    sink.write(CF, t, b, 100, 200, token)  # the replay commits it
    sink.write(CF, t, b, 100, 200, token)  # and once more: a no-op
    with psycopg.connect(pg_server.dsn(pg_db)) as conn:
        assert rows_of(conn, t) == [(2, Decimal("2.00"), None)]
    assert sink.committed(CF, t) == Committed(200, token)

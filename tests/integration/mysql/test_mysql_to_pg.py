"""MariaDB -> puller -> change log -> PostgresSink: every type at its edges, DDLs, equal tables.

``replicate`` is a minimal stand-in for the pipeline (cut at DDLs, collapse per key, one
batch per table and segment), enough to check the two ends against each other.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import psycopg
import pyarrow as pa
from test_binlog_puller import ddls, execute, pull_until_caught_up

from cdc_dagster.schema import TableSchema
from cdc_dagster.sinks.base import COMMIT_TS_COLUMN, OP_COLUMN
from cdc_dagster.sinks.postgres import PostgresSink
from cdc_dagster.upstream.changelog import ChangeLog
from scheduler_core.ts import MAX_TS

CF = "e2e"


def _rows(root: Path, tid: int) -> list[dict]:
    """The table's change-log rows (binlog event files mounted), in (ts, seq) order."""
    log = ChangeLog(root)
    files = log.data_files(tid, 0, MAX_TS) if (root / "tables" / str(tid)).exists() else []
    if not files:
        return []
    t = pa.concat_tables([log.read_data_file(f) for f in files], promote_options="permissive")
    return sorted(t.to_pylist(), key=lambda r: (r["_commit_ts"], r["_seq"]))


def _batch(t: TableSchema, rows: list[dict]) -> pa.Table:
    """Collapse to the last change per key (a key-changing update deletes the old key)."""
    last: dict[tuple, tuple[int, dict]] = {}
    key = t.primary_key
    for r in rows:
        if r[f"b{key[0]}"] is not None:
            old = tuple(r[f"b{k}"] for k in key)
            new = tuple(r[f"c{k}"] for k in key) if r["_op"] != 3 else None
            if old != new:
                last[old] = (
                    1,
                    {f"c{k}": r[f"b{k}"] for k in key} | {"_commit_ts": r["_commit_ts"]},
                )
        if r["_op"] != 3:
            last[tuple(r[f"c{k}"] for k in key)] = (0, r)
    items = list(last.values())
    arrays = [pa.array([row.get(f"c{c.id}") for _, row in items], c.arrow) for c in t.columns]
    arrays += [pa.array([op for op, _ in items], pa.int8()),
               pa.array([row["_commit_ts"] for _, row in items], pa.int64())]  # fmt: skip
    return pa.Table.from_arrays(
        arrays, names=[c.name for c in t.columns] + [OP_COLUMN, COMMIT_TS_COLUMN]
    )


def replicate(root: Path, sink: PostgresSink, upto: int) -> None:
    schemas: dict[int, TableSchema] = {}
    done: dict[int, int] = {}
    tokens: dict[int, int] = {}

    def flush(before_ts: int) -> None:
        for tid, t in schemas.items():
            rows = [r for r in _rows(root, tid) if done[tid] < r["_commit_ts"] < before_ts]
            if tid not in tokens:
                tokens[tid] = sink.acquire(CF, t)
            sink.write(CF, t, _batch(t, rows), done[tid], before_ts - 1, tokens[tid])
            done[tid] = before_ts - 1

    for rec in ddls(root):
        flush(rec.commit_ts)
        sink.apply_ddl(CF, rec, {tid: schemas.get(tid) for tid in rec.tables})
        for tid, s in rec.tables.items():
            if s is None:
                schemas.pop(tid, None)
            else:
                schemas[tid] = s
                done.setdefault(tid, rec.commit_ts)
    flush(upto + 1)


EDGE_TABLE = """CREATE TABLE edge (
 id INT PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, mu MEDIUMINT UNSIGNED,
 i INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED, d65 DECIMAL(65,30), f FLOAT,
 dd DOUBLE, c CHAR(5), vc VARCHAR(100), tx TEXT, en ENUM('a','b c'), st SET('x','y','z'),
 bn BINARY(4), vb VARBINARY(10), bl BLOB, j JSON, bt BIT(10), b64 BIT(64), yr YEAR,
 d DATE, dtm DATETIME(6), ts TIMESTAMP(6) NULL DEFAULT NULL, tm TIME(6))"""

D65 = "-" + "9" * 35 + "." + "9" * 30


def _edge_rows(base: int) -> list[str]:
    return [
        f"({base + 1}, -128, 255, -32768, 16777215, -2147483648, 4294967295, "
        f"-9223372036854775808, 18446744073709551615, {D65}, 1.5, -1.7976931348623157e308, "
        f"'abc', '😀 4-byte ü', REPEAT('x', 1000), 'b c', 'x,z', X'00FF0000', X'0000', "
        f"X'00010200', '{{\"a\": [1, 2.5, null]}}', b'1111111111', b'{'1' * 64}', 2155, "
        f"'1000-01-01', '9999-12-31 23:59:59.999999', '2038-01-19 03:14:07.999999', "
        f"'-838:59:59.000000')",
        f"({base + 2}, 127, 0, 32767, 0, 2147483647, 0, 9223372036854775807, 0, "
        f"{D65.lstrip('-')}, -0.25, 0, '', '', '', 'a', 'y', X'', X'', X'', '[]', b'0', b'0', "
        f"1901, '0000-00-00', '0000-00-00 00:00:00', '1970-01-01 00:00:01', '838:59:59.000000')",
        f"({base + 3}" + ", NULL" * 27 + ")",
    ]


def _norm(v):
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(v, str) and v.startswith("0000-00-00"):
        return None
    if isinstance(v, Decimal) and v == v.to_integral_value() and abs(v) < 2**70:
        return int(v)
    if isinstance(v, memoryview):
        return bytes(v)
    return v


def _upstream(mariadb, db: str) -> list[tuple]:
    c = mariadb.connect(database=db)
    with c.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SELECT * FROM edge ORDER BY id")
        rows = cur.fetchall()
        cur.execute("SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE "
                    "TABLE_SCHEMA = %s AND TABLE_NAME = 'edge' ORDER BY ORDINAL_POSITION", (db,))  # fmt: skip
        types = [t for _, t in cur.fetchall()]
    c.close()
    out = []
    for r in rows:
        vals = []
        for v, t in zip(r, types, strict=True):
            if t == "bit" and v is not None:
                v = int.from_bytes(v, "big")
            elif t == "set" and v is not None:
                v = ",".join(sorted(v.split(",")))
            elif t == "float" and v is not None:
                v = float(v)
            vals.append(_norm(v))
        out.append(tuple(vals))
    return out


def test_edge_values_and_ddls_replicate_to_postgres_exactly(mariadb, mydb, pg_server, tmp_path):
    root = tmp_path / "cl"
    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{mydb}"')
    sink = PostgresSink(pg_server.uri(mydb))
    execute(mariadb, mydb, "SET SESSION sql_mode = ''", EDGE_TABLE,
            f"INSERT INTO edge VALUES {', '.join(_edge_rows(0))}")  # fmt: skip
    pull_until_caught_up(mariadb, root, mydb)  # snapshot path
    execute(mariadb, mydb, "SET SESSION sql_mode = ''",
            f"INSERT INTO edge VALUES {', '.join(_edge_rows(10))}",
            "UPDATE edge SET id = 21, vc = 'moved' WHERE id = 12", "DELETE FROM edge WHERE id = 1")  # fmt: skip
    execute(mariadb, mydb, "ALTER TABLE edge ADD COLUMN extra VARCHAR(10) NOT NULL DEFAULT 'dflt'")
    execute(mariadb, mydb, "UPDATE edge SET extra = 'set' WHERE id = 11")
    execute(mariadb, mydb, "ALTER TABLE edge DROP COLUMN tx, RENAME COLUMN vc TO vchar")
    execute(mariadb, mydb, "CREATE TABLE `we\"ird``t;x` (`k;` INT PRIMARY KEY, `v\"` TEXT)",
            "INSERT INTO `we\"ird``t;x` VALUES (1, 'x''); DROP TABLE edge; --')")  # fmt: skip
    stats = pull_until_caught_up(mariadb, root, mydb)  # binlog path
    replicate(root, sink, stats.resolved_ts)
    replicate(root, sink, stats.resolved_ts)  # a replay changes nothing

    with psycopg.connect(pg_server.dsn(mydb)) as pg:
        pg.execute("SET TIME ZONE 'UTC'")
        got = [tuple(_norm(v) for v in r)
               for r in pg.execute(f'SELECT * FROM "{mydb}"."edge" ORDER BY id').fetchall()]  # fmt: skip
        weird = pg.execute(f'SELECT * FROM "{mydb}"."we""ird`t;x"').fetchall()
    want = _upstream(mariadb, mydb)
    tm_col = 25  # TIME: MariaDB gives timedelta, PostgreSQL interval -> timedelta too
    assert len(got) == len(want) == 5
    for g, w in zip(got, want, strict=True):
        for i, (a, b) in enumerate(zip(g, w, strict=True)):
            if i == 19 and a is not None:  # JSON (LONGTEXT on MariaDB) -> text
                assert json.loads(a) == json.loads(b)
            else:
                assert a == b, (g[0], i, a, b)
    assert tm_col
    assert weird == [(1, "x'); DROP TABLE edge; --")]

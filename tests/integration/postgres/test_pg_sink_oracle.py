"""The embedded workload (every type, odd names, DDLs) through PostgresSink equals the oracle."""

from __future__ import annotations

import datetime as dt
import json

import psycopg
import pyarrow as pa
from psycopg import sql

from cdc_dagster.schema import TableSchema
from cdc_dagster.sinks.base import COMMIT_TS_COLUMN, OP_COLUMN
from cdc_dagster.sinks.postgres import PostgresSink
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.generator import Workload, WorkloadConfig
from cdc_dagster.upstream.oracle import Oracle, fingerprint

CF = "oracle"


def _rows(log: ChangeLog, tid: int, after: int, upto: int) -> list[dict]:
    out = []
    for f in log.data_files(tid, after, upto):
        out += [r for r in log.read_data_file(f).to_pylist() if after < r["_commit_ts"] <= upto]
    return sorted(out, key=lambda r: (r["_commit_ts"], r["_seq"]))


def _batch(t: TableSchema, rows: list[dict]) -> pa.Table:
    """Last change per key; a key-changing update also deletes the old key."""
    last: dict[tuple, tuple[int, dict]] = {}
    key = t.primary_key
    for r in rows:
        old = tuple(r.get(f"b{k}") for k in key)
        if old[0] is not None:
            last[old] = (1, r | {f"c{k}": v for k, v in zip(key, old, strict=True)})
        if r["_op"] != 3:
            last[tuple(r[f"c{k}"] for k in key)] = (0, r)
    items = list(last.values())
    arrays = [pa.array([row.get(f"c{c.id}") for _, row in items], c.arrow) for c in t.columns]
    arrays += [pa.array([op for op, _ in items], pa.int8()),
               pa.array([row["_commit_ts"] for _, row in items], pa.int64())]  # fmt: skip
    names = [c.name for c in t.columns] + [OP_COLUMN, COMMIT_TS_COLUMN]
    return pa.Table.from_arrays(arrays, names=names)


def replicate(log: ChangeLog, sink: PostgresSink, upto: int) -> dict[int, TableSchema]:
    """A minimal pipeline: cut at DDLs, one collapsed batch per table and segment."""
    schemas: dict[int, TableSchema] = {}
    done: dict[int, int] = {}

    def flush(end: int) -> None:
        for tid, t in schemas.items():
            if end > done[tid]:
                token = sink.committed(CF, t).token or sink.acquire(CF, t)
                batch = _batch(t, _rows(log, tid, done[tid], end))
                sink.write(CF, t, batch, done[tid], end, token)
                done[tid] = end

    for rec in log.ddl_records(0, upto):
        flush(rec.commit_ts - 1)
        sink.apply_ddl(CF, rec, {tid: schemas.get(tid) for tid in rec.tables})
        for tid, s in rec.tables.items():
            if s is None:
                schemas.pop(tid, None)
            else:
                schemas[tid] = s
                done.setdefault(tid, rec.commit_ts)
    flush(upto)
    return schemas


def _pg_table(conn: psycopg.Connection, t: TableSchema) -> pa.Table:
    q = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(sql.Identifier(c.name) for c in t.columns),
        sql.Identifier(t.database),
        sql.Identifier(t.table),
    )
    rows = conn.execute(q).fetchall()
    cols = []
    for i, c in enumerate(t.columns):
        values = [r[i] for r in rows]
        if c.type == "time":
            values = [None if v is None else v // dt.timedelta(microseconds=1) for v in values]
        elif c.type == "json":
            values = [None if v is None else json.dumps(v) for v in values]
        cols.append(pa.array(values, c.arrow))
    return pa.Table.from_arrays(cols, names=[c.name for c in t.columns])


def test_workload_with_every_type_and_ddls_matches_the_oracle(pg_uri, pg_server, pg_db, tmp_path):
    root = tmp_path / "cl"
    w = Workload(WorkloadConfig(seed=7, rows_per_table=20, txns_per_step=40, ddl_every=15,
                                fsync=False), root)  # fmt: skip
    for _ in range(6):
        w.step()
    upto = w.advance_resolved()
    log, sink = ChangeLog(root), PostgresSink(pg_uri)
    schemas = replicate(log, sink, upto)
    replicate(ChangeLog(root), sink, upto)  # replay: no-op
    oracle = Oracle(root)
    with psycopg.connect(pg_server.dsn(pg_db)) as conn:
        for tid, t in schemas.items():
            want = oracle.table_at(tid, upto)
            json_cols = [c.name for c in t.columns if c.type == "json"]
            got = _pg_table(conn, t)
            assert fingerprint(got, json_cols) == fingerprint(want, json_cols), t.qualified_name
            key = t.column(t.primary_key[0]).name
            for name in json_cols:  # jsonb normalises text: compare the values
                g = sorted(zip(got[key].to_pylist(), got[name].to_pylist(), strict=True))
                o = sorted(zip(want[key].to_pylist(), want[name].to_pylist(), strict=True))
                assert [(k, v and json.loads(v)) for k, v in g] == [
                    (k, v and json.loads(v)) for k, v in o
                ]
    assert len(schemas) >= 5

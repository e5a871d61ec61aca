"""Binlog -> change log and change log -> PostgreSQL throughput, each beside its baseline.

    python bench/mysql_pg_bench.py [--rows 100000] [--txn-rows 1000]

Starts a private MariaDB and PostgreSQL under a temp dir, writes ``--rows`` rows in
transactions of ``--txn-rows``, then measures:
  1. the binlog puller (binlog -> change log, row events as read) and mounting its events
     into rows (what the data plane's tasks do), against ``mariadb-binlog -v`` decoding the
     same binlog's row events to /dev/null;
  2. the PostgreSQL sink (change log -> COPY + MERGE + checkpoint) against a plain COPY of
     the same rows into an empty table.
The last line is one JSON object with every figure and both ratios.
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cdc_dagster.mysql.puller import PullerConfig, run_puller
from cdc_dagster.mysql.state import load_state
from cdc_dagster.sinks.base import COMMIT_TS_COLUMN, OP_COLUMN
from cdc_dagster.sinks.postgres import PostgresSink
from cdc_dagster.testing.servers import PrivateMariaDB, PrivatePostgres
from cdc_dagster.upstream.changelog import ChangeLog


def _workload(my: PrivateMariaDB, rows: int, txn_rows: int) -> None:
    c = my.connect(autocommit=False)
    with c.cursor() as cur:
        for start in range(0, rows, txn_rows):
            vals = [
                (i, i % 1000, f"name-{i}-ünï", f"{i % 100000}.{i % 100:02d}", "2024-05-06 07:08:09")
                for i in range(start, min(rows, start + txn_rows))
            ]
            cur.executemany("INSERT INTO bench.t VALUES (%s, %s, %s, %s, %s)", vals)
            c.commit()
    c.close()


def _gtid(my: PrivateMariaDB) -> str:
    c = my.connect()
    with c.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        pos = cur.fetchone()[0]
    c.close()
    return pos


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--txn-rows", type=int, default=1000)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mysql_pg_bench-", dir="/tmp"))
    my, pg = PrivateMariaDB(base / "my"), PrivatePostgres(base / "pg")
    try:
        my.start()
        pg.start()
        c = my.connect()
        with c.cursor() as cur:
            cur.execute("CREATE DATABASE bench")
            cur.execute(
                "CREATE TABLE bench.t (id BIGINT PRIMARY KEY, a INT, b VARCHAR(64), "
                "c DECIMAL(12,2), d DATETIME)"
            )
        c.close()
        root = base / "changelog"
        cfg = PullerConfig(my.uri(), str(root), ("bench.*",), heartbeat_s=0.5)
        target = _gtid(my)
        run_puller(cfg, stop_after=lambda s: s.position == target)  # bootstrap
        _workload(my, args.rows, args.txn_rows)
        target = _gtid(my)

        t0 = time.perf_counter()
        stats = run_puller(cfg, stop_after=lambda s: s.position == target)
        puller_s = time.perf_counter() - t0
        assert stats.transactions == -(-args.rows // args.txn_rows), stats

        binlogs = sorted(glob.glob(str(my.datadir / "binlog.[0-9]*")))
        tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
        t0 = time.perf_counter()
        subprocess.run([tool, "--no-defaults", "--base64-output=decode-rows", "-v", *binlogs],
                       stdout=subprocess.DEVNULL, check=True)  # fmt: skip
        binlog_tool_s = time.perf_counter() - t0

        state = load_state(root)
        schema = next(iter(state.tables.values()))
        log = ChangeLog(root)
        t0 = time.perf_counter()  # mounting the binlog events (the data plane's tasks do it)
        files = log.data_files(schema.table_id, 0, state.last_ts)
        log_rows = pa.concat_tables([log.read_data_file(f) for f in files])
        mount_s = time.perf_counter() - t0
        assert log_rows.num_rows == args.rows, log_rows.num_rows
        arrays = [log_rows.column(f"c{c.id}") for c in schema.columns]
        names = [c.name for c in schema.columns]
        batch = pa.Table.from_arrays(
            [*arrays, pa.array([0] * log_rows.num_rows, pa.int8()), log_rows.column("_commit_ts")],
            names=[*names, OP_COLUMN, COMMIT_TS_COLUMN],
        )
        sink = PostgresSink(pg.uri())
        token = sink.acquire("bench", schema)
        t0 = time.perf_counter()
        sink.write("bench", schema, batch, 0, state.last_ts, token)
        sink_s = time.perf_counter() - t0

        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE plain (id bigint, a integer, b text, c numeric(12,2), "
                         "d timestamp)")  # fmt: skip
            cols = [batch.column(n).to_pylist() for n in names]
            t0 = time.perf_counter()
            with (
                conn.transaction(),
                conn.cursor() as cur,
                cur.copy("COPY plain (id, a, b, c, d) FROM STDIN") as cp,
            ):
                for row in zip(*cols, strict=True):
                    cp.write_row(row)
            copy_s = time.perf_counter() - t0
            n_pg = conn.execute('SELECT count(*) FROM "bench"."t"').fetchone()[0]
        assert n_pg == args.rows

        n = args.rows
        res = {
            "rows": n,
            "puller_rows_per_s": round(n / puller_s),
            "mariadb_binlog_rows_per_s": round(n / binlog_tool_s),
            "puller_vs_mariadb_binlog": round(puller_s / binlog_tool_s, 2),
            "mount_rows_per_s": round(n / mount_s),
            "pg_sink_rows_per_s": round(n / sink_s),
            "plain_copy_rows_per_s": round(n / copy_s),
            "pg_sink_vs_plain_copy": round(sink_s / copy_s, 2),
        }
        print(f"{'stage':<34}{'seconds':>10}{'rows/s':>12}")
        for name, s in [("binlog -> change log (puller)", puller_s),
                        ("mount the change log's events", mount_s),
                        ("mariadb-binlog -v (decode only)", binlog_tool_s),
                        ("change log -> PostgreSQL (sink)", sink_s),
                        ("plain COPY into empty table", copy_s)]:  # fmt: skip
            print(f"{name:<34}{s:>10.2f}{n / s:>12.0f}")
        print(f"puller takes {res['puller_vs_mariadb_binlog']}x mariadb-binlog's time; "
              f"the sink takes {res['pg_sink_vs_plain_copy']}x a plain COPY's")  # fmt: skip
        print(json.dumps(res))
    finally:
        my.cleanup()
        pg.cleanup()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

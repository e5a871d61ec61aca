"""The demo's workload: the generator thread resumes its change log, and a changefeed at the
generator's first ts replicates every table (the wide one included)."""

from __future__ import annotations

import time
from pathlib import Path

from cdc_dagster.metastore import Metastore
from cdc_dagster.services.workload import GeneratorThread
from cdc_dagster.testing.driver import Driver
from cdc_dagster.testing.fake_runtime import FileDownstream
from cdc_dagster.upstream.changelog import ChangeLog, ChangeLogWriter


def _run_a_little(gen: GeneratorThread, steps: int = 2) -> int:
    gen.start()
    deadline = time.monotonic() + 20
    resolved = 0
    while time.monotonic() < deadline:
        resolved = ChangeLog(gen.root).ddl_resolved_ts()
        if resolved and gen.workload.rows_written and steps <= 0:
            break
        steps -= 1 if resolved else 0
        time.sleep(gen.interval_s)
    gen.stop()
    assert gen.error is None
    return resolved


def test_second_generator_resumes_the_change_log_and_releases_its_lock(tmp_path: Path) -> None:
    root = tmp_path / "changelog"
    first = GeneratorThread(root, 2, interval_s=0.2, txns_per_step=5, ddl_every=0)
    resolved = _run_a_little(first)
    ChangeLogWriter(root).close()  # stop() released the writer lock
    second = GeneratorThread(root, 2, interval_s=0.2, txns_per_step=5, ddl_every=0)
    second.start()
    try:
        assert second.workload.resumed_from is not None
        assert "resumed" in second.describe()
        assert second.first_ts == first.first_ts
    finally:
        second.stop()
    assert ChangeLog(root).ddl_resolved_ts() >= resolved


def test_changefeed_at_the_generators_first_ts_replicates_every_table(
    tmp_path: Path, metastore: Metastore
) -> None:
    root = tmp_path / "changelog"
    gen = GeneratorThread(root, 2, interval_s=0.2, txns_per_step=5, ddl_every=0)
    resolved = _run_a_little(gen)
    log = ChangeLog(root)
    tables = log.tables_at(resolved)
    assert any(s.table == "wide" for s in tables.values())
    sink_uri = f"file://{tmp_path / 'downstream'}"
    driver = Driver(
        tmp_path / "state", root, sink_uri, captures=2, metastore=metastore, start_ts=gen.first_ts
    )
    assert driver.run_until(lambda t: driver.caught_up(t, resolved), max_ticks=60) < 60
    cf = driver.tick().owner.changefeeds["cf"]
    assert {t.table_id for t in cf.tables} == set(tables)
    ds = FileDownstream(sink_uri[len("file://") :])
    assert all(ds.committed(t) >= resolved for t in tables)

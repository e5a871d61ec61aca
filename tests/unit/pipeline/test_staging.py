"""The staging manifest: atomic round trip, orphans of a crash removed, the executor protocol."""

from __future__ import annotations

from pathlib import Path

from cdc_dagster.pipeline.executor import SparkTableExecutor
from cdc_dagster.pipeline.staging import StagedFile, Staging, TableRecord
from scheduler_core.executor import TableExecutor
from scheduler_core.messages import Barrier
from scheduler_core.model import TableState


def test_manifest_round_trips_tables_and_barrier(tmp_path: Path) -> None:
    st = Staging(tmp_path, "cf", "c1")
    rec = TableRecord(TableState.REPLICATING, 5, 9, 3, 9, token=2, error="bad file x")
    rec.files.append(StagedFile("a.parquet", 3, 9))
    st.save({7: rec}, Barrier(100, {7: 8}))
    tables, barrier = st.load()  # type: ignore[misc]
    assert tables == {7: rec}
    assert barrier == Barrier(100, {7: 8})
    assert [p.name for p in Path(st.root).iterdir()] == ["manifest.json"]  # no temp left


def test_no_manifest_loads_as_none(tmp_path: Path) -> None:
    assert Staging(tmp_path, "cf", "c1").load() is None


def test_files_the_manifest_does_not_name_are_removed(tmp_path: Path) -> None:
    st = Staging(tmp_path, "cf", "c1")
    rec = TableRecord(TableState.PREPARED, 1, 1, 1, 1, files=[StagedFile("keep.parquet", 1, 2)])
    for table_id, name in [(7, "keep.parquet"), (7, "orphan.parquet"), (8, "x.parquet")]:
        d = Path(st.table_dir(table_id))
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(b"")
    assert st.remove_orphans({7: rec}) == 2
    assert sorted(p.name for p in Path(st.root, "tables").rglob("*")) == ["7", "keep.parquet"]


def test_the_executor_implements_the_table_executor_protocol() -> None:
    assert issubclass(SparkTableExecutor, TableExecutor)

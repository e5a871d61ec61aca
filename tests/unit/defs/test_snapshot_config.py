"""The snapshot job's defaults are the chunk readers' (the job module does not import them:
the code location loads without the readers' clients)."""

from cdc_dagster.defs.mysql.snapshot_job import SnapshotConfig
from cdc_dagster.mysql.chunk_reader import CHUNK_ROWS


def test_the_snapshot_job_reads_chunks_of_the_readers_default_size() -> None:
    assert SnapshotConfig(changefeed_id="cf").chunk_rows == CHUNK_ROWS

"""Table pipelines on Spark: pull, sort, mount into staging; collapse and sink (docs/dataplane.md)."""

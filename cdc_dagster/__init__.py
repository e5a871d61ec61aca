"""Adapters around scheduler_core: the etcd metastore, the Spark pipeline, sinks and Dagster wiring."""

"""Runtime glue: the capture tick halves, the owner tick, the wire codec, the in-process driver.

See docs/dataplane.md section 4. The Dagster plane calls ``capture_prepare`` /
``capture_commit`` from a capture run's ops, ``OwnerLoop.tick`` from the owner sensor and
``apply_ready_ddl`` / ``apply_syncpoint`` from gated runs; the driver calls the same.
"""

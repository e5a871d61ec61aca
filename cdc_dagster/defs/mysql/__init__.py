"""MySQL/MariaDB upstreams under Dagster: the puller job and the owner sensor's run requests."""

from cdc_dagster.defs.mysql.job import mysql_puller
from cdc_dagster.defs.mysql.requests import PULLER_JOB, SNAPSHOT_JOB, puller_requests
from cdc_dagster.defs.mysql.snapshot_job import build_snapshot_job

__all__ = ["PULLER_JOB", "SNAPSHOT_JOB", "build_snapshot_job", "mysql_puller", "puller_requests"]

"""MySQL/MariaDB upstreams under Dagster: the puller job and the owner sensor's run requests."""

from cdc_dagster.defs.mysql.job import mysql_puller
from cdc_dagster.defs.mysql.requests import PULLER_JOB, puller_requests

__all__ = ["PULLER_JOB", "mysql_puller", "puller_requests"]

"""Capture runs are partitioned by capture id (one dynamic partition per capture)."""

import dagster as dg

CAPTURES = dg.DynamicPartitionsDefinition(name="captures")

"""Capture runs: one processor tick of one capture, as Dagster ops."""

"""Upstream and replicated tables as assets; their checks; the DDL gate on their metadata."""

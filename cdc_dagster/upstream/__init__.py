"""Upstream side: the change-log format and its producers (embedded generator, binlog puller)."""

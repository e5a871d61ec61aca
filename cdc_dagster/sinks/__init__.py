"""Downstreams: the sink protocol (base) and its implementations (Delta Lake, PostgreSQL)."""

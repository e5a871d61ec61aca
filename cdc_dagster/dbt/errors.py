"""Errors of the dbt downstream (messages say what was wrong, with which value, what to do)."""

from __future__ import annotations


class DbtDownstreamError(RuntimeError):
    """Base of every error of ``cdc_dagster.dbt``."""


class SyncpointNotFoundError(DbtDownstreamError):
    """The syncpoint asked for is not recorded (or none is, yet)."""


class PinError(DbtDownstreamError):
    """A table of a syncpoint cannot be pinned (missing, unreadable, or a layout we refuse)."""


class BuildError(DbtDownstreamError):
    """``dbt build`` failed on a pinned syncpoint (the message names the syncpoint and log)."""

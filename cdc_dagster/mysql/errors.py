"""The binlog puller's errors (the message says why and what to do)."""

from __future__ import annotations


class PullerError(Exception):
    """The puller cannot go on for this changefeed (the message says why and what to do)."""

    retryable = False  # a later run may succeed as it is (else the changefeed needs a fix)


class PullerBusyError(PullerError):
    """Another puller holds the change log, or the upstream kept dropping the connection."""

    retryable = True


__all__ = ["PullerBusyError", "PullerError"]

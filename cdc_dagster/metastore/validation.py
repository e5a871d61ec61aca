"""Pure checks of changefeed configuration: each bad input gets its own error type.

Table filters follow TiCDC (TiDB table-filter): rules ``schema.table`` with ``*`` and ``?``
wildcards, ``!`` in front to exclude; the last rule that matches a table decides, and a
table no rule matches is not replicated. Matching ignores case, like TiCDC's default.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cdc_dagster.metastore.errors import (
    InvalidChangefeedIdError,
    InvalidChangefeedOptionError,
    InvalidTargetTsError,
    InvalidTsError,
    MalformedTableFilterError,
    StartTsBelowGcSafepointError,
    StartTsInFutureError,
)
from scheduler_core.ts import MAX_TS, compose, format_ts, physical_ms

# fullmatch, never match with "$": "$" also matches before a trailing newline.
_CHANGEFEED_ID = re.compile(r"[A-Za-z0-9]+(-[A-Za-z0-9]+)*")
_PATTERN = re.compile(r"[A-Za-z0-9_$*?-]+")

# What one changefeed config may hold: the owner reads configs into memory, and each is
# one etcd value.
MAX_FILTER_RULES = 256
MAX_FILTER_RULE_CHARS = 256
MIN_SYNC_POINT_INTERVAL_S = 1
MAX_SYNC_POINT_INTERVAL_S = 86_400
# A start ts whose physical time is before 2000-01-01 is not a TS (milliseconds, or seconds).
EARLIEST_START_MS = 946_684_800_000


def validate_changefeed_id(changefeed_id: str) -> str:
    """Return the id if it is ``[A-Za-z0-9]+(-[A-Za-z0-9]+)*`` and at most 128 characters."""
    if (
        not isinstance(changefeed_id, str)
        or len(changefeed_id) > 128
        or not _CHANGEFEED_ID.fullmatch(changefeed_id)
    ):
        raise InvalidChangefeedIdError(
            f"changefeed id {changefeed_id!r} is invalid: use letters and digits in groups "
            "joined by single '-', at most 128 characters (e.g. 'orders-to-lake')"
        )
    return changefeed_id


@dataclass(frozen=True, slots=True)
class FilterRule:
    """One parsed rule: include (or exclude) tables whose schema and name match."""

    exclude: bool
    schema: str
    table: str

    def matches(self, schema: str, table: str) -> bool:
        """Whether the rule's patterns match the table (ignoring case)."""
        return fnmatch.fnmatchcase(schema.lower(), self.schema.lower()) and fnmatch.fnmatchcase(
            table.lower(), self.table.lower()
        )


@dataclass(frozen=True, slots=True)
class TableFilter:
    """The tables a changefeed replicates."""

    rules: tuple[FilterRule, ...]

    @staticmethod
    def parse(rules: Sequence[str]) -> TableFilter:
        """Parse rules like ``["shop.*", "!shop.tmp_*"]``; MalformedTableFilterError if bad."""
        if isinstance(rules, str) or not isinstance(rules, Sequence) or not rules:
            raise MalformedTableFilterError(
                f"table filter {rules!r} must be a non-empty list of rules like 'shop.*'"
            )
        if len(rules) > MAX_FILTER_RULES:
            raise MalformedTableFilterError(
                f"table filter has {len(rules)} rules; at most {MAX_FILTER_RULES} are allowed "
                "(use wildcards, e.g. 'shop.order_*')"
            )
        parsed = tuple(_parse_rule(rule) for rule in rules)
        if all(rule.exclude for rule in parsed):
            raise MalformedTableFilterError(
                f"table filter {list(rules)!r} only excludes, so it selects no table; put an "
                "including rule first, e.g. ['*.*', '!mysql.*']"
            )
        return TableFilter(parsed)

    def matches(self, schema: str, table: str) -> bool:
        """Whether ``schema.table`` is replicated: the last matching rule decides."""
        for rule in reversed(self.rules):
            if rule.matches(schema, table):
                return not rule.exclude
        return False


def _parse_rule(rule: str) -> FilterRule:
    if not isinstance(rule, str):
        raise MalformedTableFilterError(f"table filter rule {rule!r} is not a string")
    if len(rule) > MAX_FILTER_RULE_CHARS:
        raise MalformedTableFilterError(
            f"table filter rule {rule[:40]!r}... has {len(rule)} characters; at most "
            f"{MAX_FILTER_RULE_CHARS} are allowed"
        )
    body = rule[1:] if rule.startswith("!") else rule
    why = None
    if not body:
        why = "it is empty"
    elif body.count(".") != 1:
        why = "it needs exactly one '.' between schema and table"
    else:
        schema, table = body.split(".")
        if not schema or not table:
            why = "the schema or the table part is empty"
        elif not _PATTERN.fullmatch(schema) or not _PATTERN.fullmatch(table):
            why = "it has characters other than letters, digits, '_', '$', '-', '*' and '?'"
    if why is not None:
        raise MalformedTableFilterError(
            f"table filter rule {rule!r} is malformed: {why}; write [!]schema.table with * "
            "wildcards, e.g. 'shop.order_*' or '!shop.tmp'"
        )
    return FilterRule(rule.startswith("!"), schema, table)


def check_ts(name: str, ts: int) -> int:
    """Return ``ts`` if it is an int TS in [0, 2^63)."""
    if type(ts) is not int or not 0 <= ts <= MAX_TS:
        raise InvalidTsError(f"{name} {ts!r} is not a TS (an int in [0, 2^63))")
    return ts


def validate_start_ts(start_ts: int, gc_safepoint: int, now_ms: int) -> int:
    """Return ``start_ts`` if it is a TS, the change log still has it, and it is not in the future."""
    check_ts("start_ts", start_ts)
    if physical_ms(start_ts) < EARLIEST_START_MS:
        ms = start_ts if EARLIEST_START_MS <= start_ts <= now_ms else now_ms
        raise InvalidTsError(
            f"start_ts {start_ts} is not a TS: its physical time is "
            f"{physical_ms(start_ts)} ms after 1970-01-01 (before 2000). A TS is milliseconds "
            "since the epoch shifted left by 18 bits: scheduler_core.ts.compose(ms), e.g. "
            f"compose({ms}) = {compose(ms)}; omit "
            "start_ts to start from now"
        )
    if physical_ms(start_ts) > now_ms:
        raise StartTsInFutureError(
            f"start_ts {format_ts(start_ts)} is in the future (now is {now_ms} ms since the "
            "epoch); omit it to start from now"
        )
    if start_ts < gc_safepoint:
        raise StartTsBelowGcSafepointError(
            f"start_ts {format_ts(start_ts)} is below the GC safepoint {format_ts(gc_safepoint)}: "
            "changes before the safepoint may already be collected; start at or after it"
        )
    return start_ts


def validate_target_ts(target_ts: int, start_ts: int) -> int:
    """Return ``target_ts`` if it is 0 (no target) or after ``start_ts``."""
    check_ts("target_ts", target_ts)
    if target_ts and target_ts <= start_ts:
        raise InvalidTargetTsError(
            f"target_ts {format_ts(target_ts)} is not after start_ts {format_ts(start_ts)}; "
            "use 0 to replicate without an end"
        )
    return target_ts


def validate_sync_point_interval(interval_s: int) -> int:
    """Return the syncpoint interval if it is 0 (off) or within [1 s, 1 day]."""
    if type(interval_s) is not int or not (
        interval_s == 0 or MIN_SYNC_POINT_INTERVAL_S <= interval_s <= MAX_SYNC_POINT_INTERVAL_S
    ):
        raise InvalidChangefeedOptionError(
            f"sync_point_interval_s {interval_s!r} must be 0 (syncpoints off) or an int from "
            f"{MIN_SYNC_POINT_INTERVAL_S} to {MAX_SYNC_POINT_INTERVAL_S} seconds"
        )
    return interval_s

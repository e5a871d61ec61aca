"""Pure changefeed validation: each bad input gets its own error; filters match like TiCDC."""

from __future__ import annotations

import pytest

from cdc_dagster.metastore import errors as e
from cdc_dagster.metastore.changefeeds import ChangefeedInfo, ChangefeedState, ChangefeedStatus
from cdc_dagster.metastore.validation import (
    TableFilter,
    validate_changefeed_id,
    validate_start_ts,
    validate_target_ts,
)
from cdc_dagster.sinks.uri import UnknownSinkSchemeError
from scheduler_core.ts import compose

NOW_MS = 1_763_770_000_000


@pytest.mark.parametrize(
    ("rules", "says"),
    [
        ([], "non-empty list"),
        ("shop.*", "non-empty list"),
        ([""], "empty"),
        (["!"], "empty"),
        (["shop"], "exactly one '.'"),
        (["a.b.c"], "exactly one '.'"),
        ([".orders"], "part is empty"),
        (["shop.or ders"], "characters"),
        (["shop.orders;drop"], "characters"),
        (["!shop.tmp"], "only excludes"),
        ([3], "not a string"),
    ],
)
def test_malformed_table_filters_are_refused_saying_why(rules, says) -> None:
    with pytest.raises(e.MalformedTableFilterError, match=says):
        TableFilter.parse(rules)


def test_table_filter_last_matching_rule_decides_and_ignores_case() -> None:
    f = TableFilter.parse(["shop.*", "!shop.tmp_*", "shop.tmp_keep"])
    assert f.matches("shop", "orders")
    assert f.matches("SHOP", "Orders")
    assert not f.matches("shop", "tmp_x")
    assert f.matches("shop", "tmp_keep")
    assert not f.matches("other", "orders")


def test_start_ts_in_the_future_and_below_the_safepoint_are_distinct_errors() -> None:
    safepoint = compose(NOW_MS - 1000)
    assert validate_start_ts(compose(NOW_MS), safepoint, NOW_MS) == compose(NOW_MS)
    with pytest.raises(e.StartTsInFutureError, match="future"):
        validate_start_ts(compose(NOW_MS + 1), safepoint, NOW_MS)
    with pytest.raises(e.StartTsBelowGcSafepointError, match="GC safepoint"):
        validate_start_ts(safepoint - 1, safepoint, NOW_MS)
    with pytest.raises(e.InvalidTsError):
        validate_start_ts(2**63, safepoint, NOW_MS)


def test_target_ts_must_be_zero_or_after_the_start() -> None:
    assert validate_target_ts(0, 100) == 0
    assert validate_target_ts(101, 100) == 101
    with pytest.raises(e.InvalidTargetTsError):
        validate_target_ts(100, 100)


@pytest.mark.parametrize("bad", ["", "a_b", "-a", "a-", "a--b", "a.b", "x" * 129])
def test_bad_changefeed_ids_are_refused(bad: str) -> None:
    with pytest.raises(e.InvalidChangefeedIdError):
        validate_changefeed_id(bad)


def test_changefeed_records_validate_in_their_constructors() -> None:
    with pytest.raises(UnknownSinkSchemeError):
        ChangefeedInfo("orders", "kafka://x", ("*.*",), 5)
    with pytest.raises(ValueError, match="checkpoint_ts"):
        ChangefeedStatus(10, 5, ChangefeedState.NORMAL, 1)
    assert ChangefeedStatus(5, 10, "stopped", 1).state is ChangefeedState.STOPPED

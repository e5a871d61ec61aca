"""Problem records: attempts counted, exponential backoff capped, encoding, a bad value."""

from __future__ import annotations

from cdc_dagster.metastore.problems import BACKOFF_MAX_S, Problem, backoff_s, reported


def test_backoff_doubles_from_a_second_and_stops_at_a_minute() -> None:
    assert [backoff_s(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff_s(100) == BACKOFF_MAX_S


def test_each_report_counts_an_attempt_keeps_the_start_and_moves_the_retry() -> None:
    first = reported(None, "sink down", 1_000)
    assert (first.attempts, first.since_ms, first.retry_at_ms) == (1, 1_000, 2_000)
    third = reported(reported(first, "sink down", 3_000), "sink still down", 7_000)
    assert (third.attempts, third.since_ms, third.retry_at_ms) == (3, 1_000, 11_000)
    assert third.message == "sink still down"


def test_a_problem_survives_its_encoding() -> None:
    p = Problem("x", 5, 2, 9, True, {3: "bad file"})
    assert Problem.decode(p.encode()) == p


def test_an_unreadable_record_is_a_problem_that_says_so_not_a_crash() -> None:
    p = Problem.decode(b"\xff not json")
    assert p.message.startswith("unreadable problem record") and p.since_ms == 0

"""The soak's stall watch and table (cdc_dagster/testing/faults.py), without a stack."""

from __future__ import annotations

from cdc_dagster.testing.faults import Recovery, SoakReport, StallWatch


def test_longest_stall_is_blamed_on_the_fault_that_overlapped_it() -> None:
    w = StallWatch()
    w.note("demo", 100, "", now=0.0)
    w.note("demo", 200, "", now=10.0)  # a 10 s stall, no fault
    w.fault("etcd", began=12.0, ended=40.0)
    w.note("demo", 200, "", now=30.0)
    w.note("demo", 300, "", now=45.0)  # 35 s still, overlapping etcd
    stall = w.close(now=46.0)
    assert (round(stall.seconds), stall.changefeed, stall.cause) == (35, "demo", "during etcd")


def test_a_stall_that_ends_while_its_fault_is_still_being_recovered_is_blamed_on_it() -> None:
    w = StallWatch()
    w.note("shop", 100, "", now=0.0)
    w.begin("zombie", began=5.0)  # injected; the watch keeps reading while it recovers
    w.note("shop", 100, "the resolved ts has not moved for 65 s", now=70.0)
    w.note("shop", 200, "", now=112.0)  # moved again before the fault was declared over
    w.fault("zombie", began=5.0, ended=120.0)
    stall = w.close(now=121.0)
    assert (round(stall.seconds), stall.changefeed) == (112, "shop")
    assert stall.cause == "during zombie; warning: the resolved ts has not moved for 65 s"


def test_a_stall_with_no_fault_keeps_the_warning_seen_meanwhile() -> None:
    w = StallWatch()
    w.fault("postgres", began=0.0, ended=5.0)
    w.note("shop", 100, "", now=10.0)
    w.note("shop", 100, "DDL refused downstream: column exists", now=20.0)
    w.note("shop", 100, "", now=30.0)
    stall = w.close(now=70.0)  # still standing at the end: counted
    assert round(stall.seconds) == 60
    assert stall.cause == "no fault running; warning: DDL refused downstream: column exists"


def test_table_counts_faults_violations_and_unrecovered() -> None:
    report = SoakReport(minutes=30.0, seed=17, rows_checked=1234, violations=0)
    report.recoveries = [
        Recovery("etcd kill -9", "pid 1", 40.0, 4.0, 20.0, [], 12.0),
        Recovery("etcd kill -9", "pid 2", None, 4.0, 300.0, [], None),
    ]
    table = "\n".join(report.table())
    assert "faults injected      2 (etcd kill -9 x2)" in table
    assert "rows checked         1234" in table
    assert "not recovered        1" in table
    assert "NOT RECOVERED" in table
    assert [r.detail for r in report.unrecovered] == ["pid 2"]

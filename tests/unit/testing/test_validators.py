"""Each validator on hand-made states against a hand-written oracle: it passes what is right
and names what is wrong (the property, the table, the version, the evidence)."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest

from cdc_dagster.schema import ColumnSchema, TableSchema
from cdc_dagster.testing.validators import (
    BankTotal,
    DdlPlacement,
    EqualsOracle,
    NoDoubleWrite,
    NoDuplicateKeys,
    PerKeyOrder,
    Progress,
    ResolvedNeverRegresses,
    TableVersion,
    ValidationError,
    delta_types,
    standard,
)

ID = ColumnSchema(1, "id", "int64", False)
BAL = ColumnSchema(2, "balance", "decimal(18,2)", False)
NOTE = ColumnSchema(3, "note", "string", True)
BEFORE = TableSchema(1, "bank", "accounts", (ID, BAL), (1,))
AFTER = TableSchema(1, "bank", "accounts", (ID, BAL, NOTE), (1,))
DDL_TS = 300  # ADD COLUMN note DEFAULT 'x'


def rows(*pairs: tuple[int, str], note: bool = False) -> pa.Table:
    data: dict[str, pa.Array] = {
        "id": pa.array([p[0] for p in pairs], pa.int64()),
        "balance": pa.array([Decimal(p[1]) for p in pairs], pa.decimal128(18, 2)),
    }
    if note:
        data["note"] = pa.array(["x"] * len(pairs), pa.string())
    return pa.table(data)


class History:
    """Table 1: two accounts; at 200 a transfer; at 300 ADD COLUMN note DEFAULT 'x'."""

    def schema_at(self, table_id: int, ts: int) -> TableSchema | None:
        return AFTER if ts >= DDL_TS else BEFORE

    def table_at(self, table_id: int, ts: int) -> pa.Table:
        if ts < 200:
            return rows((1, "10.00"), (2, "10.00"))
        return rows((1, "5.00"), (2, "15.00"), note=ts >= DDL_TS)

    def ddl_ts(self, table_id: int) -> list[int]:
        return [DDL_TS]


def state(version: int, claimed: int, table: pa.Table, token: int = 1) -> TableVersion:
    cols = tuple((f.name, str(f.type)) for f in table.schema)
    return TableVersion(
        1, "bank.accounts", version, claimed, token, cols, table, "lake/bank/accounts"
    )


RIGHT = [
    state(1, 100, rows((1, "10.00"), (2, "10.00"))),
    state(2, 200, rows((1, "5.00"), (2, "15.00"))),
    state(3, 299, rows((1, "5.00"), (2, "15.00"))),  # the batch up to the DDL claims T-1
    state(4, 300, rows((1, "5.00"), (2, "15.00"), note=True)),  # the DDL's commit claims T
    state(5, 400, rows((1, "5.00"), (2, "15.00"), note=True), token=2),
]


def test_a_right_history_passes_every_validator() -> None:
    v = standard(History(), bank=(Decimal("20.00"), [1]), types=delta_types)
    for s in RIGHT:
        v.note_version(s)
    v.note_progress(Progress("cf", 100, 200))
    v.note_progress(Progress("cf", 300, 300))
    v.note_syncpoint(200, {1: RIGHT[1]})
    v.note_final(400, {1: RIGHT[-1]})
    v.assert_ok()
    assert v.rows_checked > 10


def test_a_version_claiming_the_ddl_ts_without_the_ddl_fails_ddl_placement() -> None:
    """Issue 17's bug: the batch up to the DDL claimed T itself, before the DDL ran."""
    ddl = DdlPlacement(History(), types=delta_types)
    buggy = [RIGHT[0], RIGHT[1], state(3, 300, rows((1, "5.00"), (2, "15.00"))), RIGHT[3]]
    for s in buggy:
        ddl.note_version(s)
    assert len(ddl.failures) == 1
    assert "version 3 (claims committed ts 300)" in ddl.failures[0]
    assert "the DDL at 300 = the claim is not applied in this state" in ddl.failures[0]


def test_a_ddl_applied_before_its_claim_moved_fails_ddl_placement() -> None:
    ddl = DdlPlacement(History())
    ddl.note_version(state(3, 299, rows((1, "5.00"), (2, "15.00"), note=True)))
    assert "the next DDL is at 300 = claim + 1" in ddl.failures[0]


def test_the_state_crossing_a_ddl_must_hold_its_whole_effect() -> None:
    ddl = DdlPlacement(History())
    ddl.note_version(RIGHT[2])
    half = rows((1, "5.00"), (2, "15.00"), note=True).set_column(
        2, "note", pa.array([None, None], pa.string())
    )  # the column is there, the default is not filled in
    ddl.note_version(state(4, 300, half))
    assert len(ddl.failures) == 1 and "crosses the DDL at 300" in ddl.failures[0]


def test_an_older_row_version_over_a_newer_one_fails_per_key_order() -> None:
    order = PerKeyOrder(History())
    order.note_version(state(2, 200, rows((1, "10.00"), (2, "15.00"))))
    assert len(order.failures) == 1
    assert "1 key(s) hold another row, e.g. (1,)" in order.failures[0]


def test_a_lost_delete_and_a_lost_row_fail_per_key_order() -> None:
    order = PerKeyOrder(History())
    order.note_version(state(2, 200, rows((1, "5.00"), (3, "1.00"))))
    assert "1 key(s) missing, e.g. (2,)" in order.failures[0]
    assert "1 key(s) the oracle does not have, e.g. (3,)" in order.failures[0]


def test_a_key_twice_fails_no_duplicate_key() -> None:
    dup = NoDuplicateKeys(History())
    dup.note_version(state(2, 200, rows((1, "5.00"), (1, "5.00"), (2, "15.00"))))
    assert dup.failures == [
        "[no-duplicate-key] bank.accounts (id 1) version 2 (claims committed ts 200): "
        "1 primary key(s) held twice"
    ]


def test_a_token_going_back_fails_no_double_write() -> None:
    fence = NoDoubleWrite()
    fence.note_version(state(4, 300, rows((1, "5.00")), token=3))
    fence.note_version(state(5, 400, rows((1, "5.00")), token=2))
    assert "carries fencing token 2 after" in fence.failures[0]


@pytest.mark.parametrize(
    ("first", "second", "says"),
    [
        (Progress("cf", 200, 300), Progress("cf", 100, 300), "checkpoint went back 200 -> 100"),
        (Progress("cf", 200, 300), Progress("cf", 200, 250), "resolved ts went back 300 -> 250"),
        (Progress("cf", 200, 300), Progress("cf", 400, 300), "checkpoint 400 > resolved 300"),
    ],
)
def test_progress_going_back_fails_resolved_never_regresses(
    first: Progress, second: Progress, says: str
) -> None:
    mono = ResolvedNeverRegresses()
    mono.note_progress(first)
    mono.note_progress(second)
    assert says in mono.failures[0]


def test_a_claim_going_back_fails_resolved_never_regresses() -> None:
    mono = ResolvedNeverRegresses()
    mono.note_version(RIGHT[1])
    mono.note_version(state(3, 100, RIGHT[0].rows))
    assert "claims less than" in mono.failures[0]


def test_a_table_unequal_at_a_syncpoint_fails_equals_oracle() -> None:
    eq = EqualsOracle(History())
    eq.note_syncpoint(200, {1: RIGHT[0]})  # the state of 100 pinned for 200
    assert "syncpoint 200" in eq.failures[0] and "hold another row" in eq.failures[0]


def test_money_lost_fails_bank_total() -> None:
    bank = BankTotal(Decimal("20.00"), [1])
    bank.note_final(400, {1: state(5, 400, rows((1, "5.00"), (2, "14.99"), note=True))})
    assert bank.failures == ["[bank-total] the end (400): the bank tables hold 19.99, not 20.00"]


def test_assert_ok_lists_the_failures() -> None:
    v = standard(History())
    v.note_version(state(3, 300, rows((1, "5.00"), (2, "15.00"))))
    with pytest.raises(ValidationError, match="ddl-placement"):
        v.assert_ok()


def test_bank_total_skips_a_moment_the_upstream_itself_was_not_funded_yet() -> None:
    class Unfunded(History):
        def table_at(self, table_id: int, ts: int) -> pa.Table:
            return rows((1, "10.00")) if ts < 50 else super().table_at(table_id, ts)

    bank = BankTotal(Decimal("20.00"), [1], expected=Unfunded())
    bank.note_syncpoint(40, {1: state(1, 40, rows((1, "10.00")))})
    assert bank.failures == [] and bank.skipped == 1
    bank.note_syncpoint(100, {1: state(1, 100, rows((1, "10.00")))})
    assert bank.failures == ["[bank-total] syncpoint 100: the bank tables hold 10.00, not 20.00"]

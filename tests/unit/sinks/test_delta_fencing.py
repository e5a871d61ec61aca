"""Fencing is checked against the version the commit is validated against (deltalake 1.6.6).

What delta-rs does, verified here on the real library: a commit whose read version is
behind the table is checked against every commit that landed since; if one of those
carries an application id (``txn``) that the committing transaction also carries, the
commit fails with ``CommitFailedError`` (Concurrent transaction). Commits that share no
application id do not conflict. DeltaSink puts the fence id in every commit, so any
commit between a writer's read and its commit makes the writer reload and re-check.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pyarrow as pa
import pytest
from conftest import CF, accounts, batch
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

import cdc_dagster.sinks.delta as delta_mod
from cdc_dagster.sinks.base import Committed, FencedError
from cdc_dagster.sinks.delta import DeltaSink, read_table_at


def _commit(dt: DeltaTable, *txns: Transaction) -> None:
    props = CommitProperties(app_transactions=list(txns))
    dt.create_write_transaction([], "append", dt.schema(), commit_properties=props)


def test_deltalake_refuses_a_commit_sharing_an_app_id_with_a_commit_since_its_read(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1]}))
    stale = DeltaTable(path)  # read version 0
    _commit(DeltaTable(path), Transaction("fence", 2))  # lands as version 1
    with pytest.raises(CommitFailedError, match="Concurrent transaction"):
        stale.merge(
            pa.table({"id": [2]}),
            "t.id = s.id",
            source_alias="s",
            target_alias="t",
            commit_properties=CommitProperties(
                app_transactions=[Transaction("fence", 1), Transaction("checkpoint", 10)]
            ),
        ).when_not_matched_insert_all().execute()
    with pytest.raises(CommitFailedError, match="Concurrent transaction"):
        _commit(stale, Transaction("fence", 2))  # two acquires from one version
    assert DeltaTable(path).version() == 1


def test_deltalake_lets_a_commit_without_a_shared_app_id_through(tmp_path):
    # why every DeltaSink commit must carry the fence id: this one would slip through
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1]}))
    stale = DeltaTable(path)
    _commit(DeltaTable(path), Transaction("fence", 2))
    _commit(stale, Transaction("checkpoint", 10))
    assert DeltaTable(path).version() == 2


@pytest.mark.parametrize("key", ["int64", "string"], ids=["by key range", "merge"])
def test_acquire_landing_between_a_writers_check_and_its_commit_fences_the_writer(
    sink, monkeypatch, key
):
    t = accounts()
    t = dataclasses.replace(
        t, columns=(dataclasses.replace(t.columns[0], type=key), *t.columns[1:])
    )
    old = sink.acquire(CF, t)
    other = DeltaSink(sink.root)  # the new primary, in effect another process
    real_apply = delta_mod._apply
    new_tokens = []

    def apply_after_a_concurrent_acquire(*args):
        if not new_tokens:  # the writer has passed its token check on dt's version
            new_tokens.append(other.acquire(CF, t))
        real_apply(*args)

    monkeypatch.setattr(delta_mod, "_apply", apply_after_a_concurrent_acquire)
    row = {"id": 1 if key == "int64" else "1", "balance": Decimal("1")}
    with pytest.raises(FencedError, match=f"token {old} refused, the table's token is 2"):
        sink.write(CF, t, batch(t, [row]), 0, 10, old)
    assert new_tokens == [2]
    assert sink.committed(CF, t) == Committed(0, 2)
    assert delta_mod.by_key_range(t, delta_mod.prepare_batch("t", t, batch(t, [row]))) == (
        key == "int64"
    )
    assert read_table_at(sink.root, t).num_rows == 0

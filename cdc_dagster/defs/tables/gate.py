"""The DDL gate: a DDL may run only once every table it blocks has checkpointed up to it.

The checkpoint is read from the replicated tables' latest materialization metadata
(``checkpoint_ts_raw``), what the UI shows, so the gate and the console agree.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.runtime import ReadyDdl


@dataclass(frozen=True, slots=True)
class DdlRequest:
    """A DDL as a DDL run's config names it: the changefeed, its commit ts, the tables it
    blocks (empty: every table of the changefeed)."""

    changefeed_id: str
    commit_ts: int
    table_ids: tuple[int, ...]


def gate_status(
    ddl: ReadyDdl | DdlRequest,
    catalog: Catalog,
    checkpoint_of: Callable[[str, int], int | None],
    current_tables: Collection[int] | None = None,
) -> tuple[bool, str]:
    """(open, reason): open when each blocked table's checkpoint >= the DDL's commit ts.

    ``checkpoint_of(changefeed_id, table_id)``: table ids are per change log, so a DDL's
    tables are its own changefeed's. The same rule as ``scheduler_core.ddl`` (tables stop
    at the barrier = commit ts, and no row change shares a DDL's commit ts). A global DDL
    (no table ids) blocks every table of the changefeed: ``current_tables`` when known (a
    table dropped earlier blocks nothing), else every table of that changefeed in the
    catalog.
    """
    every = current_tables if current_tables is not None else catalog.table_ids(ddl.changefeed_id)
    table_ids = ddl.table_ids or tuple(sorted(every))
    behind = []
    for table_id in table_ids:
        checkpoint = checkpoint_of(ddl.changefeed_id, table_id)
        if checkpoint is None or checkpoint < ddl.commit_ts:
            behind.append(f"{table_id}@{checkpoint if checkpoint is not None else 'none'}")
    if behind:
        return False, (
            f"DDL at {ddl.commit_ts} of {ddl.changefeed_id} waits for table(s) "
            + ", ".join(behind[:10])
            + (" ..." if len(behind) > 10 else "")
        )
    return True, f"DDL at {ddl.commit_ts}: {len(table_ids)} table(s) checkpointed up to it"


@dataclass(frozen=True, slots=True)
class CheckpointLookup:
    """A table's checkpoint: its asset's metadata when the catalog has the table (of that
    changefeed), else ``fallback(changefeed_id)`` (the owner's view, or what the captures
    report in etcd; called only when needed): tables created after the code server loaded
    the catalog have no asset, and must not hold a gate closed forever."""

    catalog: Catalog
    metadata_checkpoint: Callable[[object], int | None]
    fallback: Callable[[str], Mapping[int, int]]

    def __call__(self, changefeed_id: str, table_id: int) -> int | None:
        ref = self.catalog.ref(changefeed_id, table_id)
        if ref is not None:
            key = self.catalog.replica_key(ref)
            if key not in self.catalog.shared_keys():  # else it may be another changefeed's
                return self.metadata_checkpoint(key)
        return self.fallback(changefeed_id).get(table_id)


def checkpoint_lookup(
    catalog: Catalog,
    metadata_checkpoint: Callable[[object], int | None],
    fallback: Callable[[str], Mapping[int, int]],
) -> CheckpointLookup:
    """A table's checkpoint by (changefeed id, table id)."""
    return CheckpointLookup(catalog, metadata_checkpoint, fallback)

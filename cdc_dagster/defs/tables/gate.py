"""The DDL gate: a DDL may run only once every table it blocks has checkpointed up to it.

The checkpoint is read from the replicated tables' latest materialization metadata
(``checkpoint_ts_raw``), what the UI shows, so the gate and the console agree.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.runtime_glue import DdlToRun


def gate_status(
    ddl: DdlToRun,
    catalog: Catalog,
    checkpoint_of: Callable[[int], int | None],
    current_tables: Collection[int] | None = None,
) -> tuple[bool, str]:
    """(open, reason): open when each blocked table's checkpoint >= the DDL's commit ts.

    The same rule as ``scheduler_core.ddl`` (tables stop at the barrier = commit ts, and no
    row change shares a DDL's commit ts). A global DDL (no table ids) blocks every table of
    the changefeed: ``current_tables`` when known (a table dropped earlier blocks nothing),
    else every table of the catalog.
    """
    every = current_tables if current_tables is not None else [t.table_id for t in catalog.tables]
    table_ids = ddl.table_ids or tuple(sorted(every))
    behind = []
    for table_id in table_ids:
        checkpoint = checkpoint_of(table_id)
        if checkpoint is None or checkpoint < ddl.commit_ts:
            behind.append(f"{table_id}@{checkpoint if checkpoint is not None else 'none'}")
    if behind:
        return False, (
            f"DDL at {ddl.commit_ts} of {ddl.changefeed_id} waits for table(s) "
            + ", ".join(behind[:10])
            + (" ..." if len(behind) > 10 else "")
        )
    return True, f"DDL at {ddl.commit_ts}: {len(table_ids)} table(s) checkpointed up to it"


def checkpoint_lookup(
    catalog: Catalog,
    metadata_checkpoint: Callable[[object], int | None],
    fallback: Callable[[], Mapping[int, int]],
) -> Callable[[int], int | None]:
    """A table's checkpoint: its asset's metadata when the catalog has the table, else
    ``fallback()`` (the owner's view, or what the captures report in etcd; called only
    when needed): tables created after the code server loaded the catalog have no asset,
    and must not hold a gate closed forever."""
    by_id = catalog.by_id()

    def checkpoint_of(table_id: int) -> int | None:
        ref = by_id.get(table_id)
        if ref is not None:
            return metadata_checkpoint(catalog.replica_key(ref))
        return fallback().get(table_id)

    return checkpoint_of

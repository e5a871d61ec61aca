"""Which tables get asset keys: one per replicated table, or one per schema past a count.

Dagster's UI slows past a few thousand asset keys, so beyond ``max_table_assets`` tables
are grouped: one asset per database (schema) whose materializations carry the group's
minimum checkpoint and maximum lag.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

_log = logging.getLogger(__name__)

UPSTREAM = "upstream"
REPLICA = "replica"


@dataclass(frozen=True, slots=True)
class TableRef:
    """A replicated table as the control plane names it."""

    table_id: int
    database: str
    table: str

    @property
    def name(self) -> str:
        """``database.table``."""
        return f"{self.database}.{self.table}"


def _segment(text: str) -> str:
    # Asset key segments allow [A-Za-z0-9_]; map anything else to '_' (ids keep keys distinct).
    return "".join(c if (c.isalnum() and c.isascii()) or c == "_" else "_" for c in text) or "_"


@dataclass(frozen=True, slots=True)
class Catalog:
    """The tables the definitions know, and whether they are grouped per schema."""

    tables: tuple[TableRef, ...]
    max_table_assets: int = 2000

    @property
    def grouped(self) -> bool:
        """True when tables share one asset per schema."""
        return len(self.tables) > self.max_table_assets

    def upstream_key(self, ref: TableRef) -> dg.AssetKey:
        """The upstream (external) asset of a table, or of its schema when grouped."""
        if self.grouped:
            return dg.AssetKey([UPSTREAM, _segment(ref.database)])
        return dg.AssetKey([UPSTREAM, _segment(ref.database), _segment(ref.table)])

    def replica_key(self, ref: TableRef) -> dg.AssetKey:
        """The replicated asset of a table, or of its schema when grouped."""
        if self.grouped:
            return dg.AssetKey([REPLICA, _segment(ref.database)])
        return dg.AssetKey([REPLICA, _segment(ref.database), _segment(ref.table)])

    def by_id(self) -> dict[int, TableRef]:
        """table id -> table."""
        return {t.table_id: t for t in self.tables}

    def replica_keys(self) -> list[dg.AssetKey]:
        """Every replica asset key, deduplicated, in table order."""
        return list(dict.fromkeys(self.replica_key(t) for t in self.tables))

    def source_replica_keys(self) -> dict[dg.AssetKey, dg.AssetKey]:
        """Per-table key (what a dbt source names) -> this catalog's replica asset key."""
        return {
            dg.AssetKey([REPLICA, _segment(t.database), _segment(t.table)]): self.replica_key(t)
            for t in self.tables
        }

    @staticmethod
    def of(tables: Iterable[TableRef], max_table_assets: int = 2000) -> Catalog:
        """A catalog of ``tables`` sorted by id."""
        return Catalog(tuple(sorted(tables, key=lambda t: t.table_id)), max_table_assets)


def catalog_from_changelog(root: Path | None, max_table_assets: int) -> Catalog:
    """The tables the change log at ``root`` holds now (none if there is no log yet)."""
    if root is None or not (root / "FORMAT").exists():
        return Catalog((), max_table_assets)
    from cdc_dagster.upstream.changelog import ChangeLog

    log = ChangeLog(root)
    tables = log.tables_at(log.ddl_resolved_ts() or (1 << 62))
    return Catalog.of(
        (TableRef(tid, s.database, s.table) for tid, s in tables.items()), max_table_assets
    )


def demo_catalog(names: Sequence[tuple[int, str, str]]) -> Catalog:
    """A catalog from (table id, database, table) triples (tests, benchmarks)."""
    return Catalog.of(TableRef(*n) for n in names)

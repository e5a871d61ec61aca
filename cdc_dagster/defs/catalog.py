"""Which tables get asset keys: one per replicated table, or one per schema past a count.

Dagster's UI slows past a few thousand asset keys, so beyond ``max_table_assets`` tables
are grouped: one asset per database (schema) whose materializations carry the group's
minimum checkpoint and maximum lag.

The catalog is the union of every changefeed's tables (``load_catalog``: the changefeed
list from etcd, each one's change log through its filter), read when the code location
loads. Table ids are allocated per change log (the embedded generator and every binlog
puller count from 1), so two changefeeds can share an id for different tables: a table is
identified by ``(changefeed_id, table_id)`` here, while asset keys are by database and
table name (two changefeeds replicating one upstream table share its assets).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from cdc_dagster.defs.resources import open_metastore
from cdc_dagster.metastore.errors import MetastoreError
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.uri import UpstreamError, changelog_path

if TYPE_CHECKING:
    from cdc_dagster.defs.settings import Settings

_log = logging.getLogger(__name__)

UPSTREAM = "upstream"
REPLICA = "replica"
CHANGEFEED = "changefeed"


@dataclass(frozen=True, slots=True)
class TableRef:
    """A replicated table as the control plane names it."""

    table_id: int
    database: str
    table: str
    changefeed_id: str = ""  # "": from CDC_DAGSTER_CHANGELOG, not tied to a changefeed

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
    changefeeds: tuple[str, ...] = ()  # the changefeeds in etcd when the catalog was loaded
    # indexes of ``tables``, built on first use (a cache: rebuildable from ``tables``)
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

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
        """table id -> table (ids of one change log; with several changefeeds use ``ref``)."""
        return {t.table_id: t for t in self.tables}

    def ref(self, changefeed_id: str, table_id: int) -> TableRef | None:
        """The changefeed's table ``table_id`` (a table of no changefeed serves any; no
        changefeed given: any table with that id)."""
        index = self._index()
        found = index.get((changefeed_id, table_id)) or index.get(("", table_id))
        if found is None and not changefeed_id:
            found = self.by_id().get(table_id)
        return found

    def replica_key_for(self, changefeed_id: str, table_id: int) -> dg.AssetKey | None:
        """The replica asset key of the changefeed's table ``table_id`` (as ``ref`` finds it),
        None for a table the catalog does not have; cached: a key costs ~5 us, and the
        owner sensor looks up every table every tick."""
        keys = self._cache.setdefault("replica_key_for", {})
        if (changefeed_id, table_id) not in keys:
            ref = self.ref(changefeed_id, table_id)
            keys[changefeed_id, table_id] = self.replica_key(ref) if ref is not None else None
        return keys[changefeed_id, table_id]

    def shared_keys(self) -> set[dg.AssetKey]:
        """Replica keys that tables of more than one changefeed share (one upstream table
        replicated by two changefeeds): their metadata is not one changefeed's progress."""
        if "shared" not in self._cache:
            feeds: dict[dg.AssetKey, set[str]] = {}
            for t in self.tables:
                feeds.setdefault(self.replica_key(t), set()).add(t.changefeed_id)
            self._cache["shared"] = {k for k, v in feeds.items() if len(v) > 1}
        return self._cache["shared"]

    def table_ids(self, changefeed_id: str) -> list[int]:
        """The table ids of ``changefeed_id`` (and of no changefeed), sorted."""
        return sorted({t.table_id for t in self.tables if t.changefeed_id in ("", changefeed_id)})

    def changefeed_ids(self) -> set[str]:
        """The changefeeds the tables come from ("" for CDC_DAGSTER_CHANGELOG's)."""
        return {t.changefeed_id for t in self.tables}

    def _index(self) -> dict[tuple[str, int], TableRef]:
        if "by_key" not in self._cache:
            self._cache["by_key"] = {(t.changefeed_id, t.table_id): t for t in self.tables}
        return self._cache["by_key"]

    def replica_keys(self) -> list[dg.AssetKey]:
        """Every replica asset key, deduplicated, in table order."""
        return list(dict.fromkeys(self.replica_key(t) for t in self.tables))

    def source_replica_keys(self) -> dict[dg.AssetKey, dg.AssetKey]:
        """Per-table key (what a dbt source names) -> this catalog's replica asset key."""
        return {
            dg.AssetKey([REPLICA, _segment(t.database), _segment(t.table)]): self.replica_key(t)
            for t in self.tables
        }

    def changefeed_key(self, changefeed_id: str) -> dg.AssetKey:
        """The asset of a changefeed (its health check says whether it moves)."""
        return dg.AssetKey([CHANGEFEED, _segment(changefeed_id)])

    @staticmethod
    def of(
        tables: Iterable[TableRef], max_table_assets: int = 2000, changefeeds: Iterable[str] = ()
    ) -> Catalog:
        """A catalog of ``tables`` sorted by id (then changefeed), and of ``changefeeds``."""
        return Catalog(
            tuple(sorted(tables, key=lambda t: (t.table_id, t.changefeed_id))),
            max_table_assets,
            tuple(sorted(set(changefeeds))),
        )


def changelog_tables(
    root: Path | None, changefeed_id: str = "", matches: Callable[[str, str], bool] | None = None
) -> list[TableRef]:
    """The tables the change log at ``root`` holds now that ``matches`` (database, table)
    selects (none if there is no log yet)."""
    if root is None or not (root / "FORMAT").exists():
        return []

    log = ChangeLog(root)
    tables = log.tables_at(log.ddl_resolved_ts() or (1 << 62))
    return [
        TableRef(tid, s.database, s.table, changefeed_id)
        for tid, s in tables.items()
        if matches is None or matches(s.database, s.table)
    ]


def catalog_from_changelog(root: Path | None, max_table_assets: int) -> Catalog:
    """The tables the change log at ``root`` holds now (none if there is no log yet)."""
    return Catalog.of(changelog_tables(root), max_table_assets)


def load_catalog(settings: Settings) -> Catalog:
    """Every changefeed's tables (read from etcd now), plus CDC_DAGSTER_CHANGELOG's when no
    changefeed reads that log; only the latter when etcd cannot be reached (logged)."""
    try:
        feeds = _changefeeds(settings)
    except MetastoreError as exc:
        _log.warning(
            "table catalog: etcd is not reachable (%s); assets only for the change log of "
            "CDC_DAGSTER_CHANGELOG (%s); reload the code location once etcd runs",
            " ".join(str(exc).split())[:300],
            settings.changelog or "unset",
        )
        return catalog_from_changelog(settings.changelog, settings.max_table_assets)
    refs: list[TableRef] = []
    roots: set[Path] = set()
    for cf in feeds:
        try:
            root = Path(changelog_path(cf.info.upstream_uri))
        except UpstreamError as exc:
            _log.warning("table catalog: changefeed %s skipped: %s", cf.changefeed_id, exc)
            continue
        roots.add(root.resolve())
        refs += changelog_tables(root, cf.changefeed_id, cf.info.filter.matches)
    env = settings.changelog
    if env is not None and env.resolve() not in roots:
        refs += changelog_tables(env)
    return Catalog.of(refs, settings.max_table_assets, (cf.changefeed_id for cf in feeds))


def _changefeeds(settings: Settings) -> list[Any]:
    """The changefeed list, with short timeouts (the location must load without etcd)."""
    with open_metastore(settings, rpc_timeout_s=2.0, retry_timeout_s=3.0) as ms:
        return ms.changefeeds.list()


def demo_catalog(names: Sequence[tuple[int, str, str]]) -> Catalog:
    """A catalog from (table id, database, table) triples (tests, benchmarks)."""
    return Catalog.of(TableRef(*n) for n in names)

"""Validators: small oracles every fault test and the soak share (CockroachDB's cdctest).

A validator is *told* what a reader saw and notes what broke; it reads nothing itself:

- ``note_version(v)``: one table's downstream state as a reader sees it (a Delta version,
  or one consistent PostgreSQL snapshot): the committed ts it claims, its fencing token,
  its columns and rows (:class:`TableVersion`);
- ``note_progress(p)``: a changefeed's checkpoint and resolved ts as etcd holds them;
- ``note_syncpoint(ts, versions)``: the table states one syncpoint pins;
- ``note_final(ts, versions)``: each table's state once replication caught up with ``ts``.

Each keeps ``failures`` (property, table, version, evidence) and ``rows_checked``.
:class:`Validators` composes them. The feeds (:class:`DeltaFeed`, :class:`PostgresFeed`,
:class:`ProgressFeed`) read the downstream and etcd and tell the validators; the oracles
(:class:`ChangeLogOracle`: the change log replayed by :mod:`cdc_dagster.upstream.oracle`;
:class:`UpstreamNow`: a MariaDB's current tables) say what is expected.

The properties (DESIGN.md, "Correctness properties"), one validator each:

==========================  =============================================================
``resolved-never-regresses``  changefeed checkpoint and resolved ts, and each table's
                              claimed committed ts, never go back; checkpoint <= resolved
``no-double-write``           a table's fencing token never goes back from one version
                              to the next (a stale writer's commit would bring it back)
``no-duplicate-key``          no primary key twice in any state read
``per-key-order``             in every state, each key holds the row the oracle has at
                              the state's claimed ts (an older row version rewritten
                              over a newer one, or a row from past the claim, shows here)
``ddl-placement``             a state that claims ts T has the schema valid at T, and the
                              state that crosses a DDL holds the DDL's whole effect
``equals-oracle``             at every syncpoint and at the end, each table's rows equal
                              the oracle's (fingerprints)
``bank-total``                at every syncpoint and at the end, the bank tables' balances
                              add up to the workload's constant
==========================  =============================================================
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_dagster.schema import TableSchema
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.oracle import Oracle, fingerprint

MAX_FAILURES = 50  # kept per validator (the count goes on)


class ValidationError(AssertionError):
    """Validators noted failures; the message lists them."""


# ------------------------------------------------------------------------------ records
@dataclass(frozen=True, slots=True)
class TableVersion:
    """One table's downstream state as one reader saw it."""

    table_id: int
    name: str  # database.table
    version: int  # the Delta version; PostgreSQL: the sample's number
    claimed_ts: int  # the committed ts the state claims (0: nothing committed yet)
    token: int  # the fencing token the state carries
    columns: tuple[tuple[str, str], ...]  # (name, type) as the downstream holds them
    rows: pa.Table
    where: str = ""  # path or schema.table, for messages
    incarnation: int = 0  # a table dropped and created again starts a new one

    @property
    def column_names(self) -> tuple[str, ...]:
        """The state's column names, in order."""
        return tuple(n for n, _ in self.columns)

    def label(self) -> str:
        """``db.t (id 3) version 7 (claims 4567)`` for messages."""
        return (
            f"{self.name} (id {self.table_id}) version {self.version} "
            f"(claims committed ts {self.claimed_ts})"
        )


@dataclass(frozen=True, slots=True)
class Progress:
    """A changefeed's checkpoint and resolved ts as read from etcd."""

    changefeed_id: str
    checkpoint_ts: int
    resolved_ts: int


class Expected(Protocol):
    """What an oracle answers."""

    def schema_at(self, table_id: int, ts: int) -> TableSchema | None:
        """The table's schema valid at ``ts`` (None: it does not exist then)."""
        ...

    def table_at(self, table_id: int, ts: int) -> pa.Table:
        """The table's rows at ``ts`` (columns by name)."""
        ...

    def ddl_ts(self, table_id: int) -> list[int]:
        """Commit ts of the DDLs that touch the table, ascending."""
        ...


# ------------------------------------------------------------------------------ oracles
class ChangeLogOracle:
    """The change log's content at any ts, by :class:`~cdc_dagster.upstream.oracle.Oracle`.

    The Oracle replays forward from its cache and starts again from the beginning when asked
    about an earlier ts; the validators ask in increasing ts per table but in several
    streams at once (every version, and syncpoints), so a few Oracles serve them: each
    question goes to the one whose last answer for the table is closest below.
    """

    def __init__(self, root: str | os.PathLike[str], lanes: int = 3) -> None:
        self.root = Path(root)
        self.log = ChangeLog(root)
        self._oracles = [Oracle(root) for _ in range(lanes)]
        self._last: dict[tuple[int, int], int] = {}

    def schema_at(self, table_id: int, ts: int) -> TableSchema | None:
        """The schema history's answer."""
        return self.log.schema_at(table_id, ts)

    def table_at(self, table_id: int, ts: int) -> pa.Table:
        """The replayed rows at ``ts``."""
        best, best_ts = 0, -1
        for i in range(len(self._oracles)):
            last = self._last.get((i, table_id), 0)
            if best_ts < last <= ts:
                best, best_ts = i, last
        if best_ts < 0:  # every lane is past ts: start the least advanced one again
            best = min(range(len(self._oracles)), key=lambda i: self._last.get((i, table_id), 0))
        self._last[(best, table_id)] = ts
        return self._oracles[best].table_at(table_id, ts)

    def ddl_ts(self, table_id: int) -> list[int]:
        """From the change log's DDL records."""
        return sorted(
            {
                r.commit_ts
                for r in self.log.ddl_records()
                if table_id in r.tables or table_id in r.table_ids
            }
        )

    def tables_at(self, ts: int) -> dict[int, TableSchema]:
        """Every table that exists at ``ts``."""
        return self.log.tables_at(ts)


class UpstreamNow:
    """A MariaDB/MySQL upstream's tables as they are now (for the end, once quiet).

    Table ids and schemas come from ``names`` (usually the change log's schema history);
    ``ts`` is ignored: a live database has no past to ask about.
    """

    def __init__(self, connect: Callable[[], Any], names: ChangeLogOracle) -> None:
        self.connect = connect
        self.names = names

    def schema_at(self, table_id: int, ts: int) -> TableSchema | None:
        """The change log's schema (what the puller decoded)."""
        return self.names.schema_at(table_id, ts)

    def table_at(self, table_id: int, ts: int) -> pa.Table:
        """``SELECT *`` of the table, in the schema's column order and types."""
        schema = self.names.schema_at(table_id, ts)
        if schema is None:
            raise ValidationError(f"table id {table_id} has no schema at {ts}")
        cols = ", ".join(f"`{c.name}`" for c in schema.columns)
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT {cols} FROM `{schema.database}`.`{schema.table}`")
                rows = cur.fetchall()
        finally:
            conn.close()
        arrays = [pa.array([r[i] for r in rows], c.arrow) for i, c in enumerate(schema.columns)]
        return pa.Table.from_arrays(arrays, names=[c.name for c in schema.columns])

    def ddl_ts(self, table_id: int) -> list[int]:
        """From the change log."""
        return self.names.ddl_ts(table_id)


# ------------------------------------------------------------------------------ validators
class Validator:
    """Base: notes failures and rows checked; every ``note_*`` does nothing by default."""

    name = "validator"

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.failure_count = 0
        self.rows_checked = 0

    def fail(self, message: str) -> None:
        """Note one failure."""
        self.failure_count += 1
        if len(self.failures) < MAX_FAILURES:
            self.failures.append(f"[{self.name}] {message}")

    def note_version(self, v: TableVersion) -> None:
        """A table state was read."""

    def note_progress(self, p: Progress) -> None:
        """A changefeed's progress was read."""

    def note_syncpoint(self, ts: int, versions: Mapping[int, TableVersion]) -> None:
        """A syncpoint at ``ts`` pins these table states."""

    def note_final(self, ts: int, versions: Mapping[int, TableVersion]) -> None:
        """Replication caught up with ``ts``; these are the tables' states."""


class ResolvedNeverRegresses(Validator):
    """Checkpoint and resolved ts never go back (changefeed); claims never go back (table)."""

    name = "resolved-never-regresses"

    def __init__(self) -> None:
        super().__init__()
        self._progress: dict[str, Progress] = {}
        self._claims: dict[tuple[int, int], TableVersion] = {}

    def note_progress(self, p: Progress) -> None:
        if p.checkpoint_ts > p.resolved_ts:
            self.fail(
                f"changefeed {p.changefeed_id}: checkpoint {p.checkpoint_ts} > resolved "
                f"{p.resolved_ts}"
            )
        last = self._progress.get(p.changefeed_id)
        if last is not None:
            if p.checkpoint_ts < last.checkpoint_ts:
                self.fail(
                    f"changefeed {p.changefeed_id}: checkpoint went back "
                    f"{last.checkpoint_ts} -> {p.checkpoint_ts}"
                )
            if p.resolved_ts < last.resolved_ts:
                self.fail(
                    f"changefeed {p.changefeed_id}: resolved ts went back "
                    f"{last.resolved_ts} -> {p.resolved_ts}"
                )
        self._progress[p.changefeed_id] = p

    def note_version(self, v: TableVersion) -> None:
        key = (v.table_id, v.incarnation)
        last = self._claims.get(key)
        if last is not None and v.version > last.version and v.claimed_ts < last.claimed_ts:
            self.fail(f"{v.label()} claims less than {last.label()}")
        if last is None or v.version > last.version:
            self._claims[key] = v


class NoDoubleWrite(Validator):
    """A table's fencing token never goes back: a commit of a writer whose token was taken
    over (a zombie) would carry its older token."""

    name = "no-double-write"

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[tuple[int, int], TableVersion] = {}

    def note_version(self, v: TableVersion) -> None:
        key = (v.table_id, v.incarnation)
        last = self._last.get(key)
        if last is not None and v.version > last.version and v.token < last.token:
            self.fail(
                f"{v.label()} carries fencing token {v.token} after {last.label()} "
                f"carried {last.token}: a fenced writer committed"
            )
        if last is None or v.version > last.version:
            self._last[key] = v


def _key_names(expected: Expected, v: TableVersion) -> list[str] | None:
    schema = expected.schema_at(v.table_id, v.claimed_ts) if v.claimed_ts else None
    if schema is None:
        return None
    names = [c.name for c in schema.key_columns]
    return names if all(n in v.column_names for n in names) else None


class NoDuplicateKeys(Validator):
    """No primary key twice in any state read."""

    name = "no-duplicate-key"

    def __init__(self, expected: Expected) -> None:
        super().__init__()
        self.expected = expected

    def note_version(self, v: TableVersion) -> None:
        keys = _key_names(self.expected, v)
        if keys is None or not v.rows.num_rows:
            return
        self.rows_checked += v.rows.num_rows
        distinct = v.rows.select(keys).group_by(keys).aggregate([]).num_rows
        if distinct != v.rows.num_rows:
            self.fail(f"{v.label()}: {v.rows.num_rows - distinct} primary key(s) held twice")

    def note_final(self, ts: int, versions: Mapping[int, TableVersion]) -> None:
        for v in versions.values():
            self.note_version(v)


def _canonical_rows(table: pa.Table, keys: Sequence[str]) -> dict[tuple[Any, ...], str]:
    """key -> the row's fingerprint (the oracle's canonical form)."""
    names = sorted(table.column_names)
    out: dict[tuple[Any, ...], str] = {}
    for row in table.select(names).to_pylist():
        one = pa.Table.from_pylist([row], schema=table.select(names).schema)
        out[tuple(row[k] for k in keys)] = fingerprint(one)
    return out


def _same_columns(v: TableVersion, schema: TableSchema) -> bool:
    return set(v.column_names) == {c.name for c in schema.columns}


class PerKeyOrder(Validator):
    """In every state, each key holds the row the oracle has for it at the claimed ts.

    An older row version written over a newer one (a replay out of order), a row from past
    the claim, a lost delete or a lost row: each shows as a key that differs. States whose
    columns are not the schema at the claim are left to :class:`DdlPlacement`. ``every``:
    check one state in this many per table (the soak; 1 in tests)."""

    name = "per-key-order"

    def __init__(self, expected: Expected, every: int = 1) -> None:
        super().__init__()
        self.expected = expected
        self.every = max(1, every)
        self._seen: dict[int, int] = {}

    def note_version(self, v: TableVersion) -> None:
        if not v.claimed_ts:
            return
        n = self._seen.get(v.table_id, 0)
        self._seen[v.table_id] = n + 1
        if n % self.every:
            return
        schema = self.expected.schema_at(v.table_id, v.claimed_ts)
        if schema is None or not _same_columns(v, schema):
            return
        want = self.expected.table_at(v.table_id, v.claimed_ts)
        keys = [c.name for c in schema.key_columns]
        got_fp = fingerprint(v.rows.select(want.column_names))
        self.rows_checked += v.rows.num_rows
        if got_fp == fingerprint(want):
            return
        self.fail(f"{v.label()}: {_key_diff(v.rows.select(want.column_names), want, keys)}")


def _key_diff(got: pa.Table, want: pa.Table, keys: Sequence[str]) -> str:
    g, w = _canonical_rows(got, keys), _canonical_rows(want, keys)
    wrong = [k for k in w if k in g and g[k] != w[k]]
    missing = [k for k in w if k not in g]
    extra = [k for k in g if k not in w]
    lookup = {tuple(r[k] for k in keys): r for r in got.to_pylist()}
    truth = {tuple(r[k] for k in keys): r for r in want.to_pylist()}
    parts = [f"{len(got)} rows held, the oracle has {len(want)}"]
    if wrong:
        k = wrong[0]
        parts.append(
            f"{len(wrong)} key(s) hold another row, e.g. {k}: {lookup[k]} instead of {truth[k]}"
        )
    if missing:
        parts.append(f"{len(missing)} key(s) missing, e.g. {missing[0]}: {truth[missing[0]]}")
    if extra:
        parts.append(f"{len(extra)} key(s) the oracle does not have, e.g. {extra[0]}")
    return "; ".join(parts)


class DdlPlacement(Validator):
    """A state that claims ts T holds every effect at or below T, DDLs included.

    Every state's columns must be those of the schema valid at its claim (a DDL applied
    late, or early, shows as the wrong columns); the first state at or past a DDL of its
    table (the one that crosses it) must equal the oracle there, which catches what columns
    do not show (a TRUNCATE, the defaults an ADD COLUMN fills in)."""

    name = "ddl-placement"

    def __init__(
        self, expected: Expected, types: Callable[[TableSchema], Mapping[str, str]] | None = None
    ) -> None:
        super().__init__()
        self.expected = expected
        self.types = types  # schema -> {column: type as the downstream holds it}; None: names only
        self._claims: dict[tuple[int, int], int] = {}
        self._ddls: dict[int, list[int]] = {}

    def note_version(self, v: TableVersion) -> None:
        key = (v.table_id, v.incarnation)
        before = self._claims.get(key)
        self._claims[key] = max(v.claimed_ts, before or 0)
        if not v.claimed_ts:
            return
        schema = self.expected.schema_at(v.table_id, v.claimed_ts)
        if schema is None:
            return
        ddls = self._ddl_ts(v.table_id)
        crossed = [t for t in ddls if (before or 0) < t <= v.claimed_ts]
        if not self._columns_right(v, schema, ddls):
            return
        if crossed and before is not None:
            want = self.expected.table_at(v.table_id, v.claimed_ts)
            self.rows_checked += v.rows.num_rows
            got = v.rows.select(want.column_names)
            if fingerprint(got) != fingerprint(want):
                keys = [c.name for c in schema.key_columns]
                self.fail(
                    f"{v.label()} crosses the DDL at {crossed[-1]} but does not hold its "
                    f"effect: {_key_diff(got, want, keys)}"
                )

    def _columns_right(self, v: TableVersion, schema: TableSchema, ddls: list[int]) -> bool:
        want = [c.name for c in schema.columns]
        problem = ""
        if set(v.column_names) != set(want):
            lacks = [n for n in want if n not in v.column_names]
            extra = [n for n in v.column_names if n not in want]
            problem = (
                f"its columns are not the schema's at the claim (lacks {lacks}, extra {extra})"
            )
        elif self.types is not None:
            types = self.types(schema)
            have = dict(v.columns)
            bad = [n for n in want if types.get(n) != have.get(n)]
            if bad:
                problem = (
                    f"column {bad[0]!r} is {have.get(bad[0])}, the schema at the claim "
                    f"makes it {types.get(bad[0])}"
                )
        if not problem:
            return True
        later = [t for t in ddls if t > v.claimed_ts]
        hint = (
            f"; the next DDL is at {later[0]}"
            + (
                " = claim + 1: the DDL applied before its claim moved"
                if later[0] == v.claimed_ts + 1
                else ""
            )
            if later
            else ""
        )
        at = [t for t in ddls if t <= v.claimed_ts]
        if at and at[-1] == v.claimed_ts:
            hint = f"; the DDL at {at[-1]} = the claim is not applied in this state"
        self.fail(
            f"{v.label()}: {problem}{hint} (a state that claims T must hold every "
            "effect at or below T, DDLs included)"
        )
        return False

    def _ddl_ts(self, table_id: int) -> list[int]:
        if table_id not in self._ddls:
            self._ddls[table_id] = self.expected.ddl_ts(table_id)
        return self._ddls[table_id]

    def refresh(self) -> None:
        """Forget cached DDL lists (the change log grew)."""
        self._ddls.clear()


class EqualsOracle(Validator):
    """At every syncpoint and at the end, each table's rows equal the oracle's."""

    name = "equals-oracle"

    def __init__(self, expected: Expected, final_expected: Expected | None = None) -> None:
        super().__init__()
        self.expected = expected
        self.final_expected = final_expected or expected
        self.syncpoints_checked = 0

    def note_syncpoint(self, ts: int, versions: Mapping[int, TableVersion]) -> None:
        self.syncpoints_checked += 1
        self._compare("syncpoint", ts, versions, self.expected)

    def note_final(self, ts: int, versions: Mapping[int, TableVersion]) -> None:
        self._compare("the end", ts, versions, self.final_expected)

    def _compare(
        self, what: str, ts: int, versions: Mapping[int, TableVersion], expected: Expected
    ) -> None:
        for table_id, v in sorted(versions.items()):
            schema = expected.schema_at(table_id, ts)
            if schema is None:
                continue
            want = expected.table_at(table_id, ts)
            self.rows_checked += v.rows.num_rows
            if not _same_columns(v, schema):
                self.fail(
                    f"{what} {ts}: {v.label()} has columns {list(v.column_names)}, "
                    f"the oracle {want.column_names}"
                )
                continue
            got = v.rows.select(want.column_names)
            if fingerprint(got) != fingerprint(want):
                keys = [c.name for c in schema.key_columns]
                self.fail(f"{what} {ts}: {v.label()}: {_key_diff(got, want, keys)}")


class BankTotal(Validator):
    """At every syncpoint and at the end, the bank tables' ``column`` adds up to ``total``.

    A state whose sum differs is a failure unless the upstream itself did not hold the total
    then (``expected`` says so: a syncpoint between the workload's first inserts)."""

    name = "bank-total"

    def __init__(
        self,
        total: Decimal,
        table_ids: Iterable[int],
        column: str = "balance",
        expected: Expected | None = None,
    ) -> None:
        super().__init__()
        self.total = total
        self.table_ids = frozenset(table_ids)
        self.column = column
        self.expected = expected
        self.skipped = 0

    def _sum(self, tables: Iterable[pa.Table]) -> Decimal:
        total = Decimal(0)
        for table in tables:
            values = table.column(self.column).to_pylist()
            self.rows_checked += len(values)
            total += sum((Decimal(x) for x in values if x is not None), Decimal(0))
        return total

    def _check(self, what: str, ts: int, versions: Mapping[int, TableVersion]) -> None:
        missing = sorted(self.table_ids - set(versions))
        got = self._sum(versions[t].rows for t in sorted(self.table_ids) if t in versions)
        if got == self.total and not missing:
            return
        if self.expected is not None:
            upstream = self._sum(self.expected.table_at(t, ts) for t in sorted(self.table_ids))
            if upstream != self.total:
                self.skipped += 1  # the upstream was not funded yet at ts
                return
        if missing:
            self.fail(f"{what}: bank table(s) {missing} not in the state read")
        else:
            self.fail(f"{what}: the bank tables hold {got}, not {self.total}")

    def note_syncpoint(self, ts: int, versions: Mapping[int, TableVersion]) -> None:
        self._check(f"syncpoint {ts}", ts, versions)

    def note_final(self, ts: int, versions: Mapping[int, TableVersion]) -> None:
        self._check(f"the end ({ts})", ts, versions)


@dataclass
class Validators:
    """Several validators told the same things (cdctest's ``Validators``)."""

    members: list[Validator] = field(default_factory=list)

    def note_version(self, v: TableVersion) -> None:
        """Tell every member."""
        for m in self.members:
            m.note_version(v)

    def note_progress(self, p: Progress) -> None:
        """Tell every member."""
        for m in self.members:
            m.note_progress(p)

    def note_syncpoint(self, ts: int, versions: Mapping[int, TableVersion]) -> None:
        """Tell every member."""
        for m in self.members:
            m.note_syncpoint(ts, versions)

    def note_final(self, ts: int, versions: Mapping[int, TableVersion]) -> None:
        """Tell every member."""
        for m in self.members:
            m.note_final(ts, versions)

    @property
    def failures(self) -> list[str]:
        """Every member's failures."""
        return [f for m in self.members for f in m.failures]

    @property
    def failure_count(self) -> int:
        """How many failures in all (beyond the ones kept)."""
        return sum(m.failure_count for m in self.members)

    @property
    def rows_checked(self) -> int:
        """Rows compared by every member together."""
        return sum(m.rows_checked for m in self.members)

    def by_name(self) -> dict[str, Validator]:
        """Members by name."""
        return {m.name: m for m in self.members}

    def assert_ok(self) -> None:
        """Raise :class:`ValidationError` listing the failures, if any."""
        if self.failure_count:
            shown = "\n".join(self.failures[:20])
            raise ValidationError(f"{self.failure_count} validator failure(s):\n{shown}")


def standard(
    expected: Expected,
    *,
    bank: tuple[Decimal, Iterable[int]] | None = None,
    final_expected: Expected | None = None,
    types: Callable[[TableSchema], Mapping[str, str]] | None = None,
    every: int = 1,
) -> Validators:
    """Every validator above over one oracle (``bank``: the constant total and its tables)."""
    members: list[Validator] = [
        ResolvedNeverRegresses(),
        NoDoubleWrite(),
        NoDuplicateKeys(expected),
        PerKeyOrder(expected, every=every),
        DdlPlacement(expected, types=types),
        EqualsOracle(expected, final_expected),
    ]
    if bank is not None:
        members.append(BankTotal(bank[0], bank[1], expected=expected))
    return Validators(members)


def delta_types(schema: TableSchema) -> dict[str, str]:
    """The column types a Delta table of ``schema`` reads back with (for DdlPlacement)."""
    from cdc_dagster.sinks.delta import delta_schema
    from cdc_dagster.sinks.delta_ddl import plain_type

    return {f.name: str(plain_type(f.type)) for f in delta_schema(schema)}


# ------------------------------------------------------------------------------ feeds
class DeltaFeed:
    """Every version of every Delta table under a root, as :class:`TableVersion` s.

    ``poll()`` returns the versions committed since the last poll, per table in version
    order (a table dropped between two polls loses the versions not yet read; a table
    renamed keeps its log, and the feed follows it by table id). Files are read once (a
    Delta data file never changes). ``syncpoints()`` returns the syncpoints recorded since.
    """

    def __init__(self, root: str | os.PathLike[str], changefeed_id: str) -> None:
        self.root = Path(root)
        self.changefeed_id = changefeed_id
        self._next: dict[int, int] = {}  # table id -> next version to read
        self._incarnation: dict[int, int] = {}
        self._files: dict[str, pa.Table] = {}  # "<table id>/<relative path>" -> rows
        self._live_files: dict[int, set[str]] = {}  # in each table's last state read
        self._recent: dict[tuple[int, int], TableVersion] = {}
        self._syncpoints_seen: set[int] = set()
        self.latest: dict[int, TableVersion] = {}
        self.versions_read = 0

    def _tables(self) -> Iterator[Path]:
        for db in sorted(p for p in self.root.iterdir() if p.is_dir() and p.name != "_cdc_dagster"):
            for table in sorted(db.iterdir()):
                if (table / "_delta_log").is_dir():
                    yield table

    def poll(self) -> list[TableVersion]:
        """Versions committed since the last poll."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        out: list[TableVersion] = []
        if not self.root.is_dir():
            return out
        for path in list(self._tables()):
            try:
                dt = DeltaTable(str(path))
                table_id = _table_id(dt)
                if table_id is None:
                    continue
                latest = dt.version()
                start = self._next.get(table_id, 0)
                if latest < start - 1:  # a new log under this id: dropped and created again
                    self._incarnation[table_id] = self._incarnation.get(table_id, 0) + 1
                    start = 0
                for version in range(start, latest + 1):
                    v = self._read(dt, path, table_id, version)
                    out.append(v)
                    self._next[table_id] = version + 1
            except (TableNotFoundError, FileNotFoundError, DeltaError, OSError):
                continue  # moved or dropped while read: the next poll sees where it went
        self.evict_files()
        return out

    def _read(self, dt: Any, path: Path, table_id: int, version: int) -> TableVersion:
        dt.load_as_version(version)
        cf = self.changefeed_id
        claimed = dt.transaction_version(f"cdc-dagster/{cf}/checkpoint") or 0
        token = dt.transaction_version(f"cdc-dagster/{cf}/fence") or 0
        schema = pa.schema(dt.schema().to_arrow())
        from cdc_dagster.sinks.delta_ddl import plain_type

        plain = pa.schema([f.with_type(plain_type(f.type)) for f in schema])
        parts, keys = [], set()
        for uri in dt.file_uris():
            local = _local_path(uri)
            key = f"{table_id}/{os.path.relpath(local, path)}"
            keys.add(key)
            if key not in self._files:
                self._files[key] = pq.read_table(local)
            part = self._files[key]
            if part.num_rows:
                parts.append(part.select(plain.names).cast(plain))
        self._live_files[table_id] = keys
        rows = pa.concat_tables(parts) if parts else plain.empty_table()
        name = dt.metadata().name or path.name
        v = TableVersion(
            table_id,
            name,
            version,
            claimed,
            token,
            tuple((f.name, str(f.type)) for f in plain),
            rows,
            str(path),
            self._incarnation.get(table_id, 0),
        )
        self.versions_read += 1
        self._recent[(table_id, version)] = v
        self.latest[table_id] = v
        for old in [k for k in self._recent if k[0] == table_id and k[1] < version - 200]:
            del self._recent[old]
        return v

    def version(self, location: str, table_id: int, version: int) -> TableVersion:
        """One table's state at ``version`` (from the recent ones, else read again)."""
        from deltalake import DeltaTable

        got = self._recent.get((table_id, version))
        if got is not None:
            return got
        path = self.root / location
        return self._read(DeltaTable(str(path)), path, table_id, version)

    def syncpoints(self) -> list[tuple[int, dict[int, TableVersion]]]:
        """Syncpoints recorded since the last call: (ts, table id -> the pinned state)."""
        from cdc_dagster.sinks.delta import read_syncpoint
        from cdc_dagster.sinks.delta_syncpoint_file import list_syncpoints

        out = []
        for ts in list_syncpoints(str(self.root), self.changefeed_id):
            if ts in self._syncpoints_seen:
                continue
            record = read_syncpoint(str(self.root), self.changefeed_id, ts)
            if record is None:
                continue
            pinned = {
                tid: self.version(record.locations[tid], tid, ver)
                for tid, ver in record.versions.items()
            }
            self._syncpoints_seen.add(ts)
            out.append((ts, pinned))
        return out

    def evict_files(self) -> None:
        """Drop cached files that no table's last state read holds."""
        live = set().union(*self._live_files.values()) if self._live_files else set()
        self._files = {k: t for k, t in self._files.items() if k in live}


def _table_id(dt: Any) -> int | None:
    desc = dt.metadata().description
    try:
        return int(json.loads(desc)["cdc_dagster_table_id"]) if desc else None
    except (ValueError, KeyError, TypeError):
        return None


def _local_path(uri: str) -> str:
    from cdc_dagster.sinks.delta import local_path

    return local_path(uri)


class ProgressFeed:
    """A changefeed's checkpoint and resolved ts from etcd."""

    def __init__(self, metastore: Any, changefeed_id: str) -> None:
        self.metastore = metastore
        self.changefeed_id = changefeed_id

    def poll(self) -> Progress:
        """The changefeed's progress now."""
        status = self.metastore.changefeeds.get(self.changefeed_id).status
        return Progress(self.changefeed_id, status.checkpoint_ts, status.resolved_ts)


class PostgresFeed:
    """Consistent snapshots of a PostgreSQL sink's tables (it has no versions to walk).

    ``poll()`` reads, in one REPEATABLE READ transaction, each table's checkpoint row
    (claimed committed ts, token) and its rows and columns; each call is one "version".
    ``syncpoints()`` reads the copies the sink makes at each syncpoint of the tables
    registered by :meth:`register_copies` (``cdc_dagster.sinks.pg_syncpoint``).
    """

    def __init__(self, dsn: str, changefeed_id: str) -> None:
        self.dsn = dsn
        self.changefeed_id = changefeed_id
        self.samples = 0
        self._syncpoints_seen: set[int] = set()
        self.latest: dict[int, TableVersion] = {}

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=False, connect_timeout=5)

    def poll(self) -> list[TableVersion]:
        """One consistent snapshot of every table the changefeed wrote."""
        import psycopg

        self.samples += 1
        out = []
        try:
            with self._connect() as conn:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                rows = conn.execute(
                    "SELECT table_id, committed_ts, token, location FROM cdc_dagster.checkpoints "
                    "WHERE changefeed = %s AND location IS NOT NULL",
                    (self.changefeed_id,),
                ).fetchall()
                for table_id, committed, token, location in rows:
                    v = self._read(conn, int(table_id), int(committed), int(token), location)
                    if v is not None:
                        out.append(v)
        except (psycopg.OperationalError, psycopg.errors.UndefinedTable):
            return []  # PostgreSQL restarting, or nothing written yet: the next poll
        for v in out:
            self.latest[v.table_id] = v
        return out

    def _read(
        self,
        conn: Any,
        table_id: int,
        claimed: int,
        token: int,
        location: str,
        version: int | None = None,
    ) -> TableVersion | None:
        import psycopg
        from psycopg import sql

        database, _, table = location.partition(".")
        cols = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            (database, table),
        ).fetchall()
        if not cols:
            return None
        try:
            cur = conn.execute(
                sql.SQL("SELECT * FROM {}.{}").format(
                    sql.Identifier(database), sql.Identifier(table)
                )
            )
        except psycopg.errors.UndefinedTable:
            return None
        names = [d.name for d in cur.description]
        data = cur.fetchall()
        rows = pa.table(
            {
                n: pa.array([r[i] for r in data]) if data else pa.array([], pa.null())
                for i, n in enumerate(names)
            }
        )
        return TableVersion(
            table_id,
            location,
            self.samples if version is None else version,
            claimed,
            token,
            tuple((str(n), str(t)) for n, t in cols),
            rows,
            location,
        )

    def register_copies(self, tables: Iterable[str]) -> None:
        """Ask the sink to copy these ``database.table`` s at every syncpoint."""
        with self._connect() as conn:
            conn.execute("SET LOCAL lock_timeout = '10s'")
            from cdc_dagster.sinks import pg_syncpoint

            pg_syncpoint.ensure_schema(conn)
            for location in tables:
                database, _, table = location.partition(".")
                conn.execute(
                    "INSERT INTO cdc_dagster.syncpoint_copy_requests (changefeed, database, "
                    "table_name) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                    (self.changefeed_id, database, table),
                )

    def syncpoints(self) -> list[tuple[int, dict[int, TableVersion]]]:
        """Syncpoints recorded since the last call, from the copies made at each.

        Only recorded ones (in ``cdc_dagster.syncpoints``): each table's copy is made by its
        own write ending at the syncpoint, whenever that table gets there, so until the
        owner records the syncpoint (every table passed it) its copies are a partial set (a
        table on a frozen capture has none yet), as a reader must not see it either."""
        import psycopg

        out = []
        try:
            with self._connect() as conn:
                found = conn.execute(
                    "SELECT c.upstream_ts, c.table_id, c.copy_table "
                    "FROM cdc_dagster.syncpoint_copies c JOIN cdc_dagster.syncpoints s "
                    "ON s.changefeed = c.changefeed AND s.upstream_ts = c.upstream_ts "
                    "WHERE c.changefeed = %s ORDER BY c.upstream_ts",
                    (self.changefeed_id,),
                ).fetchall()
                by_ts: dict[int, dict[int, TableVersion]] = {}
                for ts, table_id, copy in found:
                    if ts in self._syncpoints_seen:
                        continue
                    v = self._read(
                        conn, int(table_id), int(ts), 0, f"cdc_syncpoint.{copy}", version=int(ts)
                    )
                    if v is not None:
                        by_ts.setdefault(int(ts), {})[int(table_id)] = v
                for ts in sorted(by_ts):
                    self._syncpoints_seen.add(ts)
                    out.append((ts, by_ts[ts]))
        except (psycopg.OperationalError, psycopg.errors.UndefinedTable):
            return []
        return out


# ------------------------------------------------------------------------------ watching
@dataclass
class Watch:
    """Feeds validators from a downstream feed and etcd until told to stop."""

    validators: Validators
    feed: Any  # DeltaFeed or PostgresFeed
    progress: ProgressFeed | None = None
    polls: int = 0

    def poll(self) -> int:
        """Read what is new and tell the validators; returns the states read."""
        self.polls += 1
        if self.progress is not None:
            self.validators.note_progress(self.progress.poll())
        versions = self.feed.poll()
        for v in versions:
            self.validators.note_version(v)
        for ts, pinned in self.feed.syncpoints():
            self.validators.note_syncpoint(ts, pinned)
        for m in self.validators.members:
            if isinstance(m, DdlPlacement):
                m.refresh()
        return len(versions)

    def final(self, ts: int, table_ids: Iterable[int] | None = None) -> None:
        """The end: every table's latest state against the oracle at ``ts``."""
        self.poll()
        latest = self.feed.latest
        wanted = set(latest) if table_ids is None else set(table_ids)
        self.validators.note_final(ts, {t: v for t, v in latest.items() if t in wanted})

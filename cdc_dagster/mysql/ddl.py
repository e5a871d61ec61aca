"""MySQL DDL statements parsed with sqlglot's AST: what a statement does and to which tables.

The puller turns a binlog query event into a ``ParsedDDL`` (action, the tables it
touches as ``(database, table)``, renames of tables and columns); the schema after it
comes from the upstream catalog. Statements that cannot be parsed into a known shape
raise ``UnsupportedDDLError`` — never a silent skip. sqlglot parses ``RENAME TABLE`` as
an opaque ``Command``: that one is split with sqlglot's tokenizer here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

Name = tuple[str, str]  # (database, table)

# Statements that change no table schema (replicated as nothing).
_IGNORED = re.compile(
    r"^\s*(BEGIN|COMMIT|ROLLBACK|XA\b|SAVEPOINT|RELEASE|FLUSH|ANALYZE|OPTIMIZE|REPAIR|GRANT|"
    r"REVOKE|CREATE\s+(OR\s+REPLACE\s+)?(USER|ROLE|VIEW|DEFINER|ALGORITHM|SQL|TRIGGER|"
    r"FUNCTION|PROCEDURE|EVENT)|DROP\s+(USER|ROLE|VIEW|TRIGGER|FUNCTION|PROCEDURE|EVENT)|"
    r"ALTER\s+(USER|VIEW|EVENT|FUNCTION|PROCEDURE)|SET\b|RENAME\s+USER|INSTALL|UNINSTALL|"
    r"CREATE\s+TEMPORARY|DROP\s+TEMPORARY)",
    re.IGNORECASE,
)


_ADD_INDEX_IF_NOT_EXISTS = re.compile(
    r"(ADD\s+(?:UNIQUE\s+|FULLTEXT\s+|SPATIAL\s+)?(?:INDEX|KEY))\s+IF\s+NOT\s+EXISTS\b",
    re.IGNORECASE,
)
_CONVERT = re.compile(
    r"ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+(\S+)\s+CONVERT\s+TO\s+", re.IGNORECASE
)


def parse_mysql(query: str) -> exp.Expression:
    """sqlglot's MySQL AST of one statement (MariaDB's ADD INDEX IF NOT EXISTS normalised:
    sqlglot cannot read it, and adding an index that exists changes no schema)."""
    return sqlglot.parse_one(_ADD_INDEX_IF_NOT_EXISTS.sub(r"\1", query), read="mysql")


class UnsupportedDDLError(ValueError):
    """A DDL statement the puller cannot translate (the message quotes it and says why)."""


@dataclass(frozen=True, slots=True)
class ParsedDDL:
    """What one DDL statement does."""

    action: str  # a DdlRecord action
    tables: tuple[Name, ...] = ()  # existing tables it touches (before names)
    creates: tuple[Name, ...] = ()
    drops: tuple[Name, ...] = ()
    renames: tuple[tuple[Name, Name], ...] = ()  # (before, after)
    column_renames: dict[str, str] = field(default_factory=dict)  # old -> new (same column)
    schema: str | None = None  # for create/drop schema
    if_exists: bool = False
    is_alter: bool = False  # an ALTER TABLE statement (its actions evolve the schema)
    replace: bool = False  # CREATE OR REPLACE TABLE


def is_ignored(query: str) -> bool:
    """True for a statement that changes no table schema (transaction control, grants...)."""
    return bool(_IGNORED.match(_strip_comments(query)))


def _strip_comments(query: str) -> str:
    q = query.strip()
    while q.startswith("/*"):
        end = q.find("*/")
        if end < 0:
            break
        q = q[end + 2 :].lstrip()
    return q


def _name(t: exp.Table, default_db: str | None, query: str) -> Name:
    db = t.db or default_db
    if not db:
        raise UnsupportedDDLError(f"no database for table {t.name!r} in {query!r}")
    return (db, t.name)


def parse_ddl(query: str, default_db: str | None) -> ParsedDDL:
    """Parse one MySQL DDL statement (``default_db``: the session's database)."""
    try:
        stmt = parse_mysql(query)
    except (ParseError, TokenError) as exc:
        raise UnsupportedDDLError(f"cannot parse DDL {query[:300]!r}: {exc}") from exc
    m = _CONVERT.match(_strip_comments(query))
    if isinstance(stmt, exp.Command) and m:
        # CONVERT TO CHARACTER SET: every text column stays a logical string
        table = exp.to_table(m.group(1), dialect="mysql")
        return ParsedDDL("modify_column", tables=(_name(table, default_db, query),), is_alter=True)
    if isinstance(stmt, exp.Command) and stmt.name.upper() == "RENAME":
        return _rename_tables(query, str(stmt.expression.this), default_db)
    if isinstance(stmt, exp.TruncateTable):
        names = [_name(t, default_db, query) for t in stmt.expressions]
        if len(names) != 1:
            raise UnsupportedDDLError(f"TRUNCATE of {len(names)} tables: {query!r}")
        return ParsedDDL("truncate_table", tables=tuple(names))
    if isinstance(stmt, exp.Create):
        return _create(stmt, default_db, query)
    if isinstance(stmt, exp.Drop):
        return _drop(stmt, default_db, query)
    if isinstance(stmt, exp.Alter) and (stmt.args.get("kind") or "").upper() == "TABLE":
        return _alter(stmt, default_db, query)
    raise UnsupportedDDLError(
        f"unsupported DDL {query[:300]!r} (parsed as {type(stmt).__name__}): "
        "filter the table out or apply the change downstream by hand, then resume"
    )


def _create(stmt: exp.Create, default_db: str | None, query: str) -> ParsedDDL:
    kind = (stmt.args.get("kind") or "").upper()
    if kind in ("DATABASE", "SCHEMA"):
        return ParsedDDL("create_schema", schema=stmt.this.name)
    if kind == "INDEX":
        index = stmt.this
        return ParsedDDL("add_index", tables=(_name(index.args["table"], default_db, query),))
    if kind == "TABLE":
        target = stmt.this.this if isinstance(stmt.this, exp.Schema) else stmt.this
        return ParsedDDL(
            "create_table",
            creates=(_name(target, default_db, query),),
            if_exists=bool(stmt.args.get("exists")),
            replace=bool(stmt.args.get("replace")),
        )
    raise UnsupportedDDLError(f"unsupported CREATE {kind}: {query[:300]!r}")


def _drop(stmt: exp.Drop, default_db: str | None, query: str) -> ParsedDDL:
    kind = (stmt.args.get("kind") or "").upper()
    if kind in ("DATABASE", "SCHEMA"):
        return ParsedDDL("drop_schema", schema=stmt.this.name if stmt.this else
                         stmt.expressions[0].name if stmt.expressions else
                         stmt.args["tables"][0].name)  # fmt: skip
    if kind == "TABLE":
        names = tuple(_name(t, default_db, query) for t in stmt.args.get("tables") or [stmt.this])
        return ParsedDDL("drop_table", tables=names, drops=names,
                         if_exists=bool(stmt.args.get("exists")))  # fmt: skip
    if kind == "INDEX":
        on = stmt.args.get("cluster")
        if isinstance(on, exp.OnProperty):
            return ParsedDDL("drop_index", tables=(_name(on.this, default_db, query),))
    raise UnsupportedDDLError(f"unsupported DROP {kind}: {query[:300]!r}")


def _alter(stmt: exp.Alter, default_db: str | None, query: str) -> ParsedDDL:
    table = _name(stmt.this, default_db, query)
    actions = stmt.args.get("actions") or []
    kinds: list[str] = []
    column_renames: dict[str, str] = {}
    renames: list[tuple[Name, Name]] = []
    for a in actions:
        if isinstance(a, exp.ColumnDef):
            kinds.append("add_column")
        elif isinstance(a, exp.RenameColumn):
            column_renames[a.this.name] = a.args["to"].name
            kinds.append("rename_column")
        elif isinstance(a, exp.ModifyColumn) or type(a).__name__ == "AlterColumn":
            src = a.args.get("rename_from")
            if src is not None and src.name != a.this.name:
                column_renames[src.name] = a.this.name
            kinds.append("modify_column")
        elif isinstance(a, exp.Drop):
            kinds.append("drop_column" if (a.args.get("kind") or "").upper() == "COLUMN"
                         else "drop_index")  # fmt: skip
        elif isinstance(a, exp.RenameIndex):
            kinds.append("add_index")
        elif isinstance(a, exp.Property):
            kinds.append("modify_column")  # a table option (FORCE, ...): no column change
        elif isinstance(a, exp.AddConstraint):
            kinds.append("add_index")
        elif isinstance(a, exp.DropPrimaryKey):
            kinds.append("drop_index")
        elif isinstance(a, exp.AlterRename):
            renames.append((table, _name(a.this, table[0], query)))
            kinds.append("rename_table")
        else:
            raise UnsupportedDDLError(
                f"unsupported ALTER TABLE action {type(a).__name__} in {query[:300]!r}"
            )
    if not actions and stmt.args.get("options"):
        kinds.append("modify_column")  # table options only (ENGINE=...): no column change
    if not kinds:
        raise UnsupportedDDLError(f"ALTER TABLE with no action sqlglot understands: {query!r}")
    # Several actions in one statement: the sink diffs whole schemas, so one action name
    # that covers them is enough; a rename wins (it changes where the table lives).
    action = "rename_table" if "rename_table" in kinds else kinds[0]
    return ParsedDDL(action, tables=(table,), renames=tuple(renames),
                     column_renames=column_renames, is_alter=True)  # fmt: skip


def _rename_tables(query: str, body: str, default_db: str | None) -> ParsedDDL:
    """``RENAME TABLE a TO b, c.d TO e.f`` (sqlglot leaves it a Command)."""
    tokens = sqlglot.Dialect.get_or_raise("mysql").tokenize(body)
    if not tokens or tokens[0].token_type != TokenType.TABLE:
        raise UnsupportedDDLError(f"unsupported RENAME statement: {query!r}")
    pairs: list[list[list[str]]] = [[[]]]
    for tok in tokens[1:]:
        if tok.token_type == TokenType.COMMA:
            pairs.append([[]])
        elif tok.text.upper() == "TO" and tok.token_type != TokenType.IDENTIFIER:
            pairs[-1].append([])
        elif tok.token_type == TokenType.DOT:
            continue
        else:
            pairs[-1][-1].append(tok.text)
    renames: list[tuple[Name, Name]] = []
    for pair in pairs:
        if len(pair) != 2 or not all(1 <= len(p) <= 2 for p in pair):
            raise UnsupportedDDLError(f"cannot read RENAME TABLE {query!r}")
        src, dst = (tuple(p) if len(p) == 2 else (default_db, p[0]) for p in pair)
        if src[0] is None or dst[0] is None:
            raise UnsupportedDDLError(f"no database for a table in {query!r}")
        renames.append((src, dst))  # type: ignore[arg-type]
    return ParsedDDL("rename_table", tables=tuple(r[0] for r in renames), renames=tuple(renames))

"""The import rules of docs/architecture.md: layers point down, nothing imports the test
doubles, and no two files of the project import each other, however indirectly.

Every ``import`` counts, at module level or inside a function: a function-level import is
still a dependency (it only hides it from the import-time order).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Rank of each part: a part may import parts of a lower rank only (and itself), plus the
# edges of SIDEWAYS. See docs/architecture.md for what each part is.
LAYERS: dict[str, int] = {
    "scheduler_core": 0,
    "cdc_dagster.secrets": 1,
    "cdc_dagster.schema": 1,
    "cdc_dagster.text": 1,
    "cdc_dagster.failpoints": 1,
    "cdc_dagster.metastore": 2,
    "cdc_dagster.upstream": 2,
    "cdc_dagster.sinks": 2,
    "cdc_dagster.mysql": 3,
    "cdc_dagster.pipeline": 3,
    "cdc_dagster.dbt": 3,
    "cdc_dagster.admin": 4,
    "cdc_dagster.runtime": 5,
    "cdc_dagster.services": 6,
    "cdc_dagster.defs": 6,
    "cdc_dagster.cli_args": 7,
    "cdc_dagster.cli_commands": 8,  # the etcd commands, imported by cli's main when asked
    "cdc_dagster.cli": 9,
    "cdc_dagster.testing": 10,
}
# Same-rank imports that are part of the design (importer part, imported module prefix).
SIDEWAYS: set[tuple[str, str]] = {
    # A changefeed's sink URI is validated where it is stored; the URI module is a leaf.
    ("cdc_dagster.metastore", "cdc_dagster.sinks.uri"),
    ("cdc_dagster.metastore", "cdc_dagster.sinks.base"),
}


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part_of(module: str) -> str | None:
    best = None
    for part in LAYERS:
        if (module == part or module.startswith(part + ".")) and (
            best is None or len(part) > len(best)
        ):
            best = part
    return best


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) of every import of the project in ``path``."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` imports pkg.mod when it is a module of the project.
            names = [base] + [
                f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")
            ]
        else:
            continue
        for name in names:
            if _part_of(name) is not None:
                yield node.lineno, name


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Imports under ``if TYPE_CHECKING:`` (annotations only: no import at run time)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _sources() -> list[Path]:
    packages = ("cdc_dagster/__init__.py", "scheduler_core/__init__.py")
    return sorted(
        p
        for pkg in ("cdc_dagster", "scheduler_core")
        for p in (ROOT / pkg).rglob("*.py")
        if str(p.relative_to(ROOT)) not in packages  # empty package markers
    )


def _violations() -> list[str]:
    out = []
    for path in _sources():
        importer = _part_of(_module_of(path))
        assert importer is not None, f"{path} belongs to no layer: add it to LAYERS"
        for line, name in _imports(path):
            imported = _part_of(name)
            if imported is None or imported == importer:
                continue
            where = f"{path.relative_to(ROOT)}:{line} imports {name}"
            if imported == "cdc_dagster.testing":
                out.append(f"{where}: production code never imports the test doubles")
            elif LAYERS[imported] >= LAYERS[importer] and not any(
                importer == a and (name == b or name.startswith(b + ".")) for a, b in SIDEWAYS
            ):
                out.append(
                    f"{where}: {importer} (rank {LAYERS[importer]}) may not import "
                    f"{imported} (rank {LAYERS[imported]})"
                )
    return out


def test_layers_point_down_and_nothing_imports_the_test_doubles() -> None:
    assert _violations() == []


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _sources():
        module = _module_of(path)
        graph.setdefault(module, set())
        for _, name in _imports(path):
            while name and not _is_module(name):
                name = name.rsplit(".", 1)[0] if "." in name else ""
            package_init = name and (ROOT.joinpath(*name.split(".")) / "__init__.py").exists()
            # A package's __init__ re-exports its modules: an import of the package is not a
            # dependency on every module of it, so only module files count as edges.
            if name and name != module and not package_init:
                graph[module].add(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_two_files_import_each_other_even_indirectly() -> None:
    assert _cycles(_graph()) == []


def test_the_rules_catch_a_planted_upward_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = ROOT / "cdc_dagster" / "sinks" / "_planted_upward_import.py"
    planted.write_text("from cdc_dagster.runtime import owner_step\n")
    try:
        assert any("_planted_upward_import.py" in v for v in _violations())
    finally:
        planted.unlink()


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _private_imports() -> list[str]:
    """``from project.module import _name`` across modules: a private name used elsewhere."""
    out = []
    for path in _sources():
        own = _module_of(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and node.module
                and _part_of(node.module) is not None
                and node.module != own
            ):
                out += [
                    f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
    return out


def test_no_private_name_is_imported_across_modules() -> None:
    assert _private_imports() == []


def test_the_upstream_packages_import_at_module_level() -> None:
    """``cdc_dagster/mysql`` and ``cdc_dagster/upstream`` read top-down: no import hidden in a
    function (what once held their file circles together)."""
    late = []
    for package in ("cdc_dagster/mysql", "cdc_dagster/upstream"):
        for path in sorted((ROOT / package).glob("*.py")):
            tree = ast.parse(path.read_text())
            top = {id(n) for n in tree.body}
            top |= {id(m) for n in tree.body if isinstance(n, ast.If) for m in n.body}
            late += [
                f"{path.relative_to(ROOT)}:{node.lineno}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in top
            ]
    assert late == []

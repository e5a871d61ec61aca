"""The upstream side reads top-down: no file circle inside ``cdc_dagster/mysql`` or
``cdc_dagster/upstream`` (counting imports anywhere in a file, under TYPE_CHECKING or in a
function too), no private name imported across modules of ``cdc_dagster``, and no
function-level import in those packages."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cdc_dagster/mysql", "cdc_dagster/upstream")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[ast.stmt, str, list[str]]]:
    """(statement, imported module, imported names) for every import in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [a.name for a in node.names]
            out.append((node, node.module, names))
            # ``from pkg import module`` imports a module of the package
            out += [(node, f"{node.module}.{n}", []) for n in names]
    return out


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).glob("*.py"))


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_file_circle_in_the_upstream_packages() -> None:
    for package in PACKAGES:
        files = {_module(p): p for p in _files(package)}
        graph = {
            m: {i for _, i, _ in _imports(p) if i in files and i != m} for m, p in files.items()
        }
        assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph) or [])}"


def test_no_private_name_imported_across_modules() -> None:
    bad = []
    for path in (p for package in PACKAGES for p in _files(package)):
        for node, module, names in _imports(path):
            if module.startswith("cdc_dagster") and module != _module(path):
                bad += [f"{path.name}:{node.lineno} {module}.{n}" for n in names if n[:1] == "_"]
    assert bad == []


def test_imports_of_the_upstream_packages_are_at_module_level() -> None:
    late = []
    for package in PACKAGES:
        for path in _files(package):
            tree = ast.parse(path.read_text())
            top = {id(n) for n in tree.body}
            top |= {id(m) for n in tree.body if isinstance(n, ast.If) for m in n.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in top:
                    late.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert late == []

"""The package's shape, checked: imports point down the layers of docs/architecture.md, no two modules import
each other (not even lazily, inside a function), no module is too long to read, the root holds little, and no
module reaches for another's private names. Read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_retrace"

# docs/architecture.md's layers, top first. A room may import itself and any room on a lower line; rooms on one
# line are siblings and must not import each other.
LAYERS = [
    ["cli", "testing"],
    ["plugin", "validation"],
    ["results", "dataset"],
    ["experiments"],
    ["replay"],
    ["osworld"],
    ["agents", "evaluators", "guest"],
    ["envs"],
    ["screen", "actions"],
    ["registry", "text", "cachedir", "forkserver"],
]
RANK = {room: i for i, line in enumerate(LAYERS) for room in line}
MAX_LINES = 400
MAX_ROOT_MODULES = 6


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted (a name imported from a package resolves to its submodule)
    names: tuple[str, ...]
    line: int


def _dotted(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {_dotted(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@cache
def imports() -> list[Import]:
    found = []
    for module, path in modules().items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                if not base.startswith("pytest_retrace"):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    target = sub if sub in modules() else base
                    found.append(Import(module, target, () if target == sub else (alias.name,), node.lineno))
            elif isinstance(node, ast.Import):
                found += [Import(module, a.name, (), node.lineno) for a in node.names
                          if a.name.startswith("pytest_retrace")]
    return found


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def test_every_room_has_a_layer() -> None:
    rooms = {room(m) for m in modules()} - {"(root)"}
    assert not rooms - RANK.keys(), f"rooms missing from LAYERS (and from docs/architecture.md): {rooms - RANK.keys()}"


def test_imports_point_down() -> None:
    wrong = set()
    for imp in imports():
        a, b = room(imp.module), room(imp.target)
        if a == b or a == "(root)" or b == "(root)" and imp.target == "pytest_retrace":
            continue
        if RANK.get(a, -1) >= RANK.get(b, len(LAYERS)):
            wrong.add(f"{imp.module}:{imp.line} imports {imp.target} ({a} may not import {b})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {m: set() for m in modules()}
    for imp in imports():
        if imp.target in graph and imp.target != imp.module:
            graph[imp.module].add(imp.target)
    # A package's __init__ importing its own submodules is how a package exports; the reverse edge (a submodule
    # importing names from its package's __init__) is then a cycle only if __init__ needs that submodule at import
    # time, which ast cannot tell; count it, because such a pair is exactly the kind that bites.
    cycles = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the graph is small, but recursion depth is not worth a thought)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    out.append(comp)
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    found = _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert sorted(map(sorted, found)) == [["a", "b", "c"], ["d"]]


@pytest.mark.parametrize("module", sorted(modules()))
def test_module_is_short_enough_to_read(module: str) -> None:
    lines = len(modules()[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it by job (docs/architecture.md)"


def test_the_root_holds_little() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_no_private_names_cross_modules() -> None:
    crossing = [f"{i.module}:{i.line} imports {', '.join(n for n in i.names if n.startswith('_'))} from {i.target}"
                for i in imports() if i.target != i.module and any(n.startswith("_") for n in i.names)]
    assert not crossing, "\n".join(crossing)

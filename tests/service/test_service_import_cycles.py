"""No module of service/ imports one that imports it back, not even through a deferred import.

A cycle hidden by an import inside a function works until someone moves that import to the top
(or imports the other module first), so every import statement counts, wherever it stands.
"""
from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"
PACKAGE = "kernelsearch.service"
# service/package_root is the root `kernelsearch` package, not a part of kernelsearch.service.
SKIP = {"package_root"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SERVICE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(SERVICE.rglob("*.py"))
            if not SKIP & set(p.relative_to(SERVICE).parts)}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `name` imports, the packages above them included (importing
    a.b.c runs a/__init__ and a/b/__init__ first)."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[:len(here) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            parts = t.split(".")
            for i in range(1, len(parts) + 1):
                mod = ".".join(parts[:i])
                if mod in known and mod != name:
                    found.add(mod)
    return found


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (module -> modules it imports) as a path, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_walk_sees_deferred_and_relative_imports(tmp_path: Path) -> None:
    mods = _modules()
    known = set(mods)
    assert f"{PACKAGE}.app" in _imports(f"{PACKAGE}.api", mods[f"{PACKAGE}.api"], known)
    assert f"{PACKAGE}.schemas" in _imports(f"{PACKAGE}.routers.jobs", mods[f"{PACKAGE}.routers.jobs"], known)
    deferred = tmp_path / "m.py"
    deferred.write_text("def f():\n    from .worker import Worker\n")
    assert f"{PACKAGE}.worker" in _imports(f"{PACKAGE}.m", deferred, known)


def test_no_service_module_imports_one_that_imports_it_back() -> None:
    mods = _modules()
    known = set(mods)
    graph = {name: _imports(name, path, known) for name, path in mods.items()}
    assert len(graph) > 20
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in service/: " + " -> ".join(cycle or [])

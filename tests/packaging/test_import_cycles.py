"""No module of the package imports one that imports it back, not even through a deferred import,
and each layer imports only the layers below it.

A cycle hidden by an import inside a function works until someone moves that import to the top
(or imports the other module first), so every import statement counts, wherever it stands; so
does one under `if TYPE_CHECKING:` (it becomes a real import as soon as a type is needed at run
time). The walk covers every package: kernelsearch (service/client: the client), kernels, search_space,
db and service (the server).
"""
from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Each folder and the package it installs as (pyproject.toml's [tool.setuptools.package-dir]).
PACKAGES = {
    "service/client": "kernelsearch",
    "kernels": "kernelsearch.kernels",
    "search_space": "kernelsearch.search_space",
    "db": "kernelsearch.db",
    "service": "kernelsearch.service",
}
# What each layer may import of the others: service -> search_space -> kernels, and db under
# service and search_space only. The root package, the client (what runs in a user's program),
# may import the layers below the server and, of the server's package, only `CLIENT_MAY_USE`;
# the server never imports the client but where `SERVER_USES_CLIENT` says why.
LAYERS = {
    "kernelsearch.kernels": {"kernelsearch.kernels"},
    # The store keeps records by the kernels' own rules (a config's canonical form, "nearest"):
    # one definition each, in the lowest layer, so db sits on kernels and never the reverse.
    "kernelsearch.db": {"kernelsearch.db", "kernelsearch.kernels"},
    "kernelsearch.search_space": {"kernelsearch.search_space", "kernelsearch.kernels", "kernelsearch.db"},
    "kernelsearch.service": {"kernelsearch.service", "kernelsearch.search_space", "kernelsearch.kernels",
                             "kernelsearch.db"},
}
CLIENT_LAYERS = ("kernelsearch.kernels", "kernelsearch.search_space", "kernelsearch.db")
CLIENT_MAY_USE = {
    "kernelsearch.service": "the package above the modules below (empty)",
    "kernelsearch.service.client_settings": "the client's settings and the job limits it applies",
    "kernelsearch.service.sources": "the local store as a lookup source",
}
# `kernelsearch bench` runs kernels as a user's program does: through the client's provider.
# The CLI speaks to a service (--url http://..., KS_SERVICE_URL) through the client's REST client.
SERVER_USES_CLIENT = {("kernelsearch.service.cli_bench", "kernelsearch.provider"),
                      *((f"kernelsearch.service.{m}", "kernelsearch.rest_client")
                        for m in ("cli_remote", "cli_db", "cli_search", "cli_tune"))}


def _module_name(folder: Path, package: str, path: Path) -> str:
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _modules() -> dict[str, Path]:
    """Every module of every package, by its installed name (a folder nested in another, such as
    service/client, belongs to its own package only)."""
    out: dict[str, Path] = {}
    others = {REPO / f for f in PACKAGES}
    for folder, package in PACKAGES.items():
        root = REPO / folder
        for p in sorted(root.rglob("*.py")):
            if any(o != root and o.is_relative_to(root) and p.is_relative_to(o) for o in others):
                continue
            out[_module_name(root, package, p)] = p
    return out


def _ancestors(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `name` imports, the packages above them included (importing
    a.b.c runs a/__init__ and a/b/__init__ first), except the packages above `name` itself:
    those were imported before it ran, so reaching them through a submodule runs nothing. A
    name taken from such a package (`from kernelsearch.kernels import get_kernel` in a module
    of kernels) does count: it needs that package's __init__ to have got that far."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    mine = _ancestors(name)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        direct: list[str] = []
        if isinstance(node, ast.Import):
            direct = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[:len(here) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            # Names that are not submodules are attributes of `base`: its __init__ must provide them.
            direct = subs + ([base] if len(subs) < len(node.names) else [])
        for t in direct:
            if t in known and t != name:
                found.add(t)
            found |= {a for a in _ancestors(t) if a in known and a not in mine and a != name}
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


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


def _layer(name: str) -> str:
    return max((p for p in LAYERS if name == p or name.startswith(p + ".")), key=len, default="kernelsearch")


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_walk_covers_every_package() -> None:
    mods = _modules()
    for package in PACKAGES.values():
        assert package in mods, package
    assert "kernelsearch.service.client" not in mods
    assert {"kernelsearch.tuner", "kernelsearch.backends", "kernelsearch.helion"} <= set(mods)
    assert {"kernelsearch.kernels.spec", "kernelsearch.search_space.tuner", "kernelsearch.db.store",
            "kernelsearch.service.app", "kernelsearch.db.repos.jobs"} <= set(mods)


def test_the_walk_sees_deferred_relative_and_type_checking_imports(tmp_path: Path) -> None:
    mods = _modules()
    known = set(mods)
    svc = "kernelsearch.service"
    assert f"{svc}.app" in _imports(f"{svc}.api", mods[f"{svc}.api"], known)
    assert f"{svc}.schemas" in _imports(f"{svc}.routers.jobs", mods[f"{svc}.routers.jobs"], known)
    m = tmp_path / "m.py"
    m.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .views import JobView\n"
                 "def f():\n    from .worker import Worker\n    from kernelsearch.kernels.spec import KernelDef\n")
    got = _imports(f"{svc}.m", m, known)
    assert {f"{svc}.views", f"{svc}.worker", "kernelsearch.kernels.spec", "kernelsearch.kernels"} <= got
    assert "kernelsearch" not in got and svc not in got  # the packages above m ran before it


def test_a_name_from_the_own_package_counts_and_a_sibling_module_does_not_pull_it(tmp_path: Path) -> None:
    known = set(_modules())
    m = tmp_path / "m.py"
    m.write_text("from kernelsearch.kernels import get_kernel\n")
    assert "kernelsearch.kernels" in _imports("kernelsearch.kernels.m", m, known)
    m.write_text("from kernelsearch.kernels import errors\nfrom .spec import KernelDef\n")
    assert _imports("kernelsearch.kernels.m", m, known) == {"kernelsearch.kernels.errors",
                                                            "kernelsearch.kernels.spec"}


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = _graph()
    assert len(graph) > 80
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_layer_imports_only_the_layers_below_it(layer: str) -> None:
    bad = sorted(f"{m} imports {t}" for m, ts in _graph().items() if _layer(m) == layer
                 for t in ts if _layer(t) not in LAYERS[layer] and (m, t) not in SERVER_USES_CLIENT)
    assert not bad, f"{layer} may import only {sorted(LAYERS[layer])}: " + "; ".join(bad)


def client_imports_beyond_its_layers(graph: Mapping[str, set[str]]) -> list[str]:
    """Each import by a client module of a server module not in `CLIENT_MAY_USE`."""
    return sorted(f"{m} imports {t}" for m, ts in graph.items() if _layer(m) == "kernelsearch"
                  for t in ts if t.startswith("kernelsearch.service")
                  and not t.startswith(CLIENT_LAYERS) and t not in CLIENT_MAY_USE)


def test_the_client_imports_only_its_own_layers() -> None:
    """A user's program never runs the server's code (its settings, its app, its CLI): a new
    import of a server module by the client fails here until it is named, with why."""
    bad = client_imports_beyond_its_layers(_graph())
    assert not bad, "; ".join(bad)


def test_a_client_import_of_a_server_module_is_caught() -> None:
    graph = dict(_graph())
    for server in ("kernelsearch.service.settings", "kernelsearch.service.worker",
                   "kernelsearch.service.definitions", "kernelsearch.service.cli",
                   "kernelsearch.service.helion_jobs", "kernelsearch.service.job_child"):
        graph["kernelsearch.backends"] = {*graph["kernelsearch.backends"], server}
        assert client_imports_beyond_its_layers(graph) == [f"kernelsearch.backends imports {server}"]
        graph["kernelsearch.backends"] = _graph()["kernelsearch.backends"]


def test_what_the_client_may_use_of_the_server_pulls_in_nothing_else_of_it() -> None:
    """An allowed server module that imported another would bring that one into a user's
    program unnamed: each imports, of the server, only other allowed modules."""
    graph = _graph()
    bad = sorted(f"{m} imports {t}" for m in CLIENT_MAY_USE for t in graph[m]
                 if t.startswith("kernelsearch.service") and t not in CLIENT_MAY_USE)
    assert not bad, "; ".join(bad)


def test_every_allowed_server_module_is_one_the_client_uses() -> None:
    """The allow-list stays as short as the client's needs: an entry no client module imports
    goes."""
    used = {t for m, ts in _graph().items() if _layer(m) == "kernelsearch" for t in ts}
    assert set(CLIENT_MAY_USE) <= used, sorted(set(CLIENT_MAY_USE) - used)


def test_the_store_s_types_have_one_import_path() -> None:
    """`db.store` gives `Store` only; its views, wire format and checks are imported from their
    own modules (`db.views`, `db.wire`, ...), so one type is never reached by two paths."""
    import kernelsearch.db.store as store

    assert store.__all__ == ["Store"]
    bad = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("store") and (
                    node.module == "kernelsearch.db.store" or name.startswith("kernelsearch.db")):
                bad += [f"{name}: {a.name}" for a in node.names if a.name != "Store"]
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "kernelsearch.db.store":
                bad += [f"{path.relative_to(REPO)}: {a.name}" for a in node.names if a.name != "Store"]
    assert not bad, "import these from their own module: " + "; ".join(bad)


def test_no_hook_imports_the_decorator() -> None:
    """The Triton cache manager, the Helion backend and get_kernel's provider use the backends
    object, never the decorator (not even through another module)."""
    graph = _graph()
    for hook in ("kernelsearch.triton_cache", "kernelsearch.helion", "kernelsearch.provider"):
        seen, todo = set(), [hook]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert "kernelsearch.backends" in seen, hook
        assert not seen & {"kernelsearch.tuner", "kernelsearch.decorator"}, hook

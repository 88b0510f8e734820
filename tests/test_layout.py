"""The package's shape: small modules, no import cycle, and a pure core that reaches no I/O.

The import graph is read from the source with ast (relative imports resolved, imports inside
functions counted too: a cycle hidden in a function is still a cycle), never by importing."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "exporter"
MAX_LINES = 600

# The pure core takes data and `now` and returns plain values: parsing, window math, rules, causes, the fleet's view,
# the engine that runs them and the config it reads, and the backtest that replays a recording through them.
CORE = ("exporter.vllm_metrics", "exporter.snapshot", "exporter.trtllm", "exporter.router", "exporter.roles",
        "exporter.window", "exporter.history", "exporter.promql", "exporter.hitratio", "exporter.rules", "exporter.rules_state", "exporter.causes", "exporter.analysis", "exporter.rollouts",
        "exporter.deploys", "exporter.engine", "exporter.config", "exporter.recording", "exporter.replay", "exporter.sdtargets", "exporter.urls")
# what talks to the network, starts threads or sleeps: none of it belongs in the core, directly or through a module it imports
IO_MODULES = {"socket", "ssl", "requests", "urllib3", "urllib.request", "http.client", "http.server", "threading",
              "concurrent.futures", "subprocess", "select", "selectors", "asyncio", "cheroot", "apscheduler", "time"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(the package's modules `name` imports, the outside modules it imports), wherever in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    ours, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                (ours if alias.name.split(".")[0] == "exporter" else outside).add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "exporter":
                outside.add(target)
                for alias in node.names:  # `from urllib import request` imports urllib.request
                    outside.add(f"{target}.{alias.name}")
                continue
            for alias in node.names:  # `from . import config` imports a module, `from .config import load` a name
                ours.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
    return {m for m in ours if m in known and m != name}, outside


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    found = modules()
    edges, outside = {}, {}
    for name, path in found.items():
        edges[name], outside[name] = imports(name, path, set(found))
    return edges, outside


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), each as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [cycle_through(sorted(g), edges) for g in groups]


def cycle_through(group: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, for the failure message."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return group


def reach(start: str, edges: dict[str, set[str]]) -> dict[str, list[str]]:
    """Every module `start` imports, directly or not, with the import path that gets there."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v]):
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return paths


def test_no_module_is_over_600_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these by noun (at most {MAX_LINES} lines each): {long}"


def test_no_import_cycle():
    found = cycles(graph()[0])
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_pure_core_reaches_no_io():
    edges, outside = graph()
    bad = []
    for core in CORE:
        for module, path in reach(core, edges).items():
            for io in sorted(outside[module] & IO_MODULES):
                bad.append(f"{' -> '.join(path)} imports {io}")
    assert not bad, "\n".join(bad)


def test_the_sidecar_never_imports_the_tools_or_the_simulator():
    edges, _ = graph()
    for module, path in reach("exporter.sidecar", edges).items():
        assert not module.startswith(("exporter.tools", "exporter.sim")), " -> ".join(path)


def test_the_checks_see_what_they_check():
    """The graph is read right: a known edge, a relative import from a subpackage, and a planted cycle."""
    edges, outside = graph()
    assert "exporter.engine" in edges["exporter.sidecar"] or "exporter.poller" in edges["exporter.sidecar"]
    assert "exporter.tools.divergence" in edges["exporter.tools.lint"]
    assert "exporter.jsonlines" in edges["exporter.tools.lint"]  # `from .. import jsonlines`
    assert "threading" in outside["exporter.poller"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []

"""The package's shape: subpackages in layers whose imports only go down, small modules, no
import cycle, and a pure core that reaches no I/O.

The import graph is read from the source with ast (relative imports resolved, imports inside
functions counted too: a cycle hidden in a function is still a cycle), never by importing.
Each check is a function of a package folder, so a test can plant a violation in a copy of
the package and see the check fail on it."""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "exporter"
MAX_LINES = 600

# The layers, lowest first: a module imports its own group and the layers under it, never a
# layer above nor a sibling group of its own layer. Each subpackage's __init__.py says the same
# in words; docs/development.md draws it.
LAYERS = (
    (("exporter.peers",),),
    (("exporter.parse",),),
    (("exporter.series",),),
    (("exporter.alerting",),),
    (("exporter.config",),),
    (("exporter.discovery",), ("exporter.monitor",)),
    (("exporter.serve",),),
    (("exporter.poll",), ("exporter.notify",)),
    (("exporter.sidecar", "exporter.exitcodes", "exporter.stopping", "exporter.logs"),),
    (("exporter.tools",),),
    (("exporter.sim",),),
    (("exporter.cli", "exporter.__main__", "exporter.healthcheck"),),
)
ROOT = "exporter"  # the package's __init__ (its version): anyone may read it

# The pure core takes data and `now` and returns plain values: parsing, window math, rules, causes, the fleet's view,
# the engine that runs them and the config it reads, and the backtest that replays a recording through them.
CORE = ("exporter.parse.vllm_metrics", "exporter.parse.snapshot", "exporter.parse.trtllm", "exporter.alerting.router", "exporter.parse.roles",
        "exporter.series.window", "exporter.series.history", "exporter.series.promql", "exporter.series.hitratio", "exporter.alerting.rules", "exporter.alerting.rules_state", "exporter.alerting.causes", "exporter.alerting.analysis", "exporter.alerting.rollouts",
        "exporter.alerting.deploys", "exporter.monitor.engine", "exporter.config.sections", "exporter.monitor.recording", "exporter.monitor.replay", "exporter.discovery.targets", "exporter.peers.urls")
# what talks to the network, starts threads or sleeps: none of it belongs in the core, directly or through a module it imports
IO_MODULES = {"socket", "ssl", "requests", "urllib3", "urllib.request", "http.client", "http.server", "threading",
              "concurrent.futures", "subprocess", "select", "selectors", "asyncio", "cheroot", "apscheduler", "time"}


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {".".join(p.relative_to(package.parent).with_suffix("").parts[:-1] if p.name == "__init__.py"
                     else p.relative_to(package.parent).with_suffix("").parts): p
            for p in sorted(package.rglob("*.py"))}


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


def graph(package: Path = PACKAGE) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    found = modules(package)
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


def layer_of(module: str) -> tuple[int, int] | None:
    """(layer, group within it) of a module, None where LAYERS does not place it."""
    for rank, groups in enumerate(LAYERS):
        for group, prefixes in enumerate(groups):
            if any(module == p or module.startswith(p + ".") for p in prefixes):
                return rank, group
    return None


def unplaced(package: Path = PACKAGE) -> list[str]:
    return [m for m in modules(package) if m != ROOT and layer_of(m) is None]


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """Every import of a layer above the importer's, or of a sibling group of its layer."""
    bad = []
    for module, targets in sorted(graph(package)[0].items()):
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if target == ROOT or here is None or there is None or there == here or there[0] < here[0]:
                continue
            bad.append(f"{module} imports {target}")
    return bad


def long_modules(package: Path = PACKAGE) -> dict[str, int]:
    return {name: n for name, path in modules(package).items() if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}


def test_no_module_is_over_600_lines():
    long = long_modules()
    assert not long, f"split these by noun (at most {MAX_LINES} lines each): {long}"


def test_every_module_has_its_layer():
    assert not unplaced(), f"place these in LAYERS of tests/test_layout.py (and the tree of docs/development.md): {unplaced()}"


def test_imports_only_go_down_the_layers():
    bad = upward_imports()
    assert not bad, "imports up the layers or across siblings (move the shared piece down a layer):\n" + "\n".join(bad)


def test_each_subpackage_says_what_it_owns_and_imports_nothing():
    """Its __init__.py is one paragraph that says what it owns and what it may import: no code
    runs on import, so importing a low module never pulls in a whole subpackage."""
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        tree = ast.parse(init.read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree)
        assert doc and "import" in doc, f"{init.relative_to(PACKAGE.parent)}: say what it owns and what it may import"
        assert all(isinstance(n, ast.Expr) for n in tree.body), f"{init.relative_to(PACKAGE.parent)} runs code on import"


def test_the_checks_fail_on_a_planted_upward_import_and_a_long_module(tmp_path):
    copy = tmp_path / "exporter"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert not upward_imports(copy) and not long_modules(copy)
    snapshot = copy / "parse" / "snapshot.py"
    snapshot.write_text(snapshot.read_text(encoding="utf-8") + "\nfrom ..serve import state\n", encoding="utf-8")
    assert upward_imports(copy) == ["exporter.parse.snapshot imports exporter.serve.state"]
    sibling = copy / "monitor" / "engine.py"
    sibling.write_text(sibling.read_text(encoding="utf-8") + "\nfrom ..discovery import targets\n", encoding="utf-8")
    assert "exporter.monitor.engine imports exporter.discovery.targets" in upward_imports(copy)
    (copy / "series" / "window.py").write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    assert long_modules(copy) == {"exporter.series.window": MAX_LINES + 1}
    (copy / "newpackage").mkdir()
    (copy / "newpackage" / "thing.py").write_text("", encoding="utf-8")
    assert "exporter.newpackage.thing" in unplaced(copy)


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
    assert "exporter.monitor.engine" in edges["exporter.sidecar"] or "exporter.poll.poller" in edges["exporter.sidecar"]
    assert "exporter.tools.divergence" in edges["exporter.tools.lint"]
    assert "exporter.peers.jsonlines" in edges["exporter.tools.lint"]  # `from .. import jsonlines`
    assert "threading" in outside["exporter.poll.poller"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []

"""The package's shape: subpackages in layers whose imports only go down, small modules, no
import cycle, and a pure core that reaches no I/O.

The import graph is read from the source with ast (relative imports resolved, imports inside
functions counted too: a cycle hidden in a function is still a cycle), never by importing.
Each check is a function of a package folder, so a test can plant a violation in a copy of
the package and see the check fail on it."""
from __future__ import annotations

import ast
import functools
import re
import shutil
from pathlib import Path

import pytest

# one worker runs these in order, so the planted copy finds the package's other modules parsed already
pytestmark = pytest.mark.xdist_group("layout")

PACKAGE = Path(__file__).resolve().parent.parent / "exporter"
MAX_LINES = 600

# The layers, lowest first: a module imports its own group and the layers under it, never a
# layer above nor a sibling group of its own layer. Each subpackage's __init__.py says the same
# in words; docs/development.md draws it.
LAYERS = (
    (("exporter.peers", "exporter.logfields"),),
    (("exporter.parse",),),
    (("exporter.series",),),
    (("exporter.alerting",),),
    (("exporter.config",),),
    (("exporter.discovery",), ("exporter.monitor",)),
    (("exporter.serve",),),
    (("exporter.poll",), ("exporter.notify",)),
    (("exporter.sidecar", "exporter.exitcodes", "exporter.stopping", "exporter.logs", "exporter.steadyclock"),),
    (("exporter.tools",),),
    (("exporter.sim",),),
    (("exporter.cli", "exporter.__main__", "exporter.healthcheck"),),
)
ROOT = "exporter"  # the package's __init__ (its version): anyone may read it

# A module's tests are in tests/test_<module>.py, or, for a module tested through another's
# (the commands through the command line's, the history through the windows'), in this file:
TESTED_THROUGH = {
    "exporter.series.history": "test_window.py", "exporter.series.modellog": "test_window.py",
    "exporter.series.promql": "test_prometheus_equivalence.py", "exporter.config.discovery": "test_sources.py",
    "exporter.config.reader": "test_sections.py", "exporter.stopping": "test_signals.py",
    "exporter.sim.tokenizer": "test_simulator.py", "exporter.sim.console": "test_cli.py", "exporter.sim.demo": "test_cli.py",
    "exporter.sim.serve": "test_simulator.py", "exporter.sim.metrics_text": "test_simulator.py", "exporter.sidecar": "test_signals.py",
    "exporter.exitcodes": "test_cli.py", "exporter.serve.deadlines": "test_server.py", "exporter.logfields": "test_logs.py",
    "exporter.alerting.rules_state": "test_rules.py", "exporter.alerting.rollouts": "test_analysis.py",
    "exporter.monitor.recording": "test_replay.py", "exporter.monitor.targetview": "test_poller.py",
    "exporter.tools.whatif_command": "test_whatif.py", "exporter.tools.parse": "test_cli.py", "exporter.tools.diagnose": "test_divergence.py",
    "exporter.tools.record": "test_cli.py", "exporter.tools.backtest": "test_cli.py", "exporter.tools.lint_command": "test_cli.py",
    "exporter.parse.router_metrics": "test_router.py", "exporter.parse.names": "test_vllm_metrics.py",
    "exporter.parse.cacheconfig": "test_vllm_metrics.py", "exporter.parse.snapshot": "test_vllm_metrics.py",
    "exporter.parse.filing": "test_vllm_metrics.py",
    "exporter.discovery.promseries": "test_promread.py", "exporter.poll.dispatch": "test_poller.py",
    # two modules named kvevents: the decoding's tests and the config section's
    "exporter.parse.kvevents": "test_kvevents.py", "exporter.config.kvevents": "test_sections.py",
    "exporter.series.kvtext": "test_blockindex.py",
    # two modules named server: neither owns tests/test_server.py by its short name
    "exporter.serve.server": "test_server.py", "exporter.sim.server": "test_simulator.py",
}

# The pure core takes data and `now` and returns plain values: whole folders (parsing, window math, the rules and
# causes, the config's sections, the engine and its replay) and the pure modules of others. The files a config names
# are read by whoever read the config (exporter/config/load.py), through the reader it hands the parse.
CORE_PACKAGES = ("exporter.parse", "exporter.series", "exporter.alerting", "exporter.config", "exporter.monitor")
CORE_MODULES = ("exporter.discovery.targets", "exporter.peers.urls", "exporter.peers.jsonlines", "exporter.peers.yamltext",
                "exporter.tools.cachemodel", "exporter.tools.capacitycurve", "exporter.tools.divergence", "exporter.tools.hashtrace",
                "exporter.tools.lint", "exporter.tools.whatif")
NOT_CORE = ("exporter.config.load",)  # the I/O edge of exporter/config/
# what talks to the network, starts threads or sleeps: none of it belongs in the core, directly or through a module it imports
IO_MODULES = {"socket", "ssl", "requests", "urllib3", "urllib.request", "http.client", "http.server", "threading",
              "concurrent.futures", "subprocess", "select", "selectors", "asyncio", "cheroot", "apscheduler", "time"}
# ...and what opens, reads, writes or lists files
FILE_CALLS = {"open", "fdopen", "read_text", "read_bytes", "write_text", "write_bytes", "listdir", "scandir", "glob", "iglob",
              "stat", "lstat", "mkfifo", "unlink", "remove", "rmdir", "mkdir", "makedirs", "exists", "lexists", "isfile", "isdir",
              "access", "readlink"}


def core_modules(package: Path = PACKAGE) -> list[str]:
    return sorted(m for m in modules(package) if m not in NOT_CORE and (m in CORE_MODULES or any(m.startswith(p + ".") for p in CORE_PACKAGES)))


@functools.lru_cache(maxsize=None)
def _parsed(source: str) -> ast.Module:
    return ast.parse(source)


def parsed(path: Path) -> ast.Module:
    """A module's tree, parsed once per text: the checks walk each module many times, and a
    copy of the package with one file planted parses only that file again."""
    return _parsed(path.read_text(encoding="utf-8"))


def file_calls(path: Path) -> tuple[str, ...]:
    """The calls in a module that touch files. The package's own data (importlib.resources) is
    part of the program, not input: reading it is not I/O of the kind the core must not do."""
    return _file_calls(path.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=None)
def _file_calls(source: str) -> tuple[str, ...]:
    found = []
    for node in ast.walk(_parsed(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute) else ""
        if name in FILE_CALLS and "resources.files(" not in ast.unparse(node.func):
            found.append(f"{ast.unparse(node.func)}() at line {node.lineno}")
    return tuple(found)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {".".join(p.relative_to(package.parent).with_suffix("").parts[:-1] if p.name == "__init__.py"
                     else p.relative_to(package.parent).with_suffix("").parts): p
            for p in sorted(package.rglob("*.py"))}


def statements(tree: ast.AST):
    """Every statement, however deep in functions, classes, branches and handlers: where an
    import can stand (expressions, which cannot hold one, are not walked)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            stack.extend(getattr(node, field, ()))


def imports(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(the package's modules `name` imports, the outside modules it imports), wherever in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    ours, outside = set(), set()
    for node in statements(parsed(path)):
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


def _imports(test_file: Path, module: str) -> bool:
    """Whether `test_file` imports `module` by its full name (`import a.b.c`, `from a.b.c
    import x` or `from a.b import c`)."""
    package, _, name = module.rpartition(".")
    text = test_file.read_text(encoding="utf-8")
    return bool(re.search(rf"^\s*(from|import) {re.escape(module)}\b", text, flags=re.M)
                or re.search(rf"^\s*from {re.escape(package)} import [^\n]*\b{re.escape(name)}\b", text, flags=re.M))


def untested(found: dict[str, Path], tests: Path, through: dict[str, str]) -> tuple[list[str], list[str]]:
    """(modules without their tests where a newcomer looks, modules named in `through` that
    have their own file). tests/test_<short>.py is a module's own file only when no other
    module has that short name: exporter/sim/server.py passed on tests/test_server.py, which
    tests serve/server.py. Modules that share a short name are each named in `through`,
    with a file that imports them."""
    names = {name: name.rpartition(".")[2] for name, path in found.items() if path.name not in ("__init__.py", "__main__.py")}
    shared = {short for short in names.values() if list(names.values()).count(short) > 1}
    missing, redundant = [], []
    for name, short in names.items():
        own, named = tests / f"test_{short}.py", through.get(name)
        if short in shared:
            if not (named and (tests / named).exists() and _imports(tests / named, name)):
                missing.append(name)
            continue
        if not own.exists() and not (named and (tests / named).exists()):
            missing.append(name)
        if own.exists() and named:
            redundant.append(name)
    return missing, redundant


def test_every_module_has_its_tests_where_a_newcomer_looks_for_them():
    missing, redundant = untested(modules(), Path(__file__).resolve().parent, TESTED_THROUGH)
    assert not redundant, f"these have a tests/test_<module>.py: drop them from TESTED_THROUGH: {redundant}"
    assert not missing, ("give these a tests/test_<module>.py or name the file that tests them in TESTED_THROUGH "
                         f"(a short name two modules share: in TESTED_THROUGH, a file that imports it): {missing}")


def test_a_short_name_two_modules_share_is_no_test_file_of_either(tmp_path):
    package, tests = tmp_path / "pkg", tmp_path / "tests"
    for path in (package / "serve" / "server.py", package / "sim" / "server.py", package / "parse.py"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    tests.mkdir()
    (tests / "test_server.py").write_text("from pkg.serve.server import Server\n")
    (tests / "test_parse.py").write_text("")
    (tests / "test_simulator.py").write_text("from pkg.sim.server import Fleet\n")
    found = modules(package)
    assert untested(found, tests, {}) == (["pkg.serve.server", "pkg.sim.server"], [])
    # named, but in a file that does not import it: still not found
    assert untested(found, tests, {"pkg.serve.server": "test_server.py", "pkg.sim.server": "test_server.py"})[0] == ["pkg.sim.server"]
    assert untested(found, tests, {"pkg.serve.server": "test_server.py", "pkg.sim.server": "test_simulator.py"}) == ([], [])


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


def test_no_import_cycle():
    found = cycles(graph()[0])
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def impurities(package: Path = PACKAGE) -> list[str]:
    """Every way a core module reaches I/O: an I/O module imported, or a file call, by it or by a module it imports."""
    edges, outside = graph(package)
    found = modules(package)
    bad = []
    for core in core_modules(package):
        for module, path in reach(core, edges).items():
            bad += [f"{' -> '.join(path)} imports {io}" for io in sorted(outside[module] & IO_MODULES)]
            bad += [f"{' -> '.join(path)} calls {call}" for call in file_calls(found[module])]
    return sorted(set(bad))


def test_the_pure_core_reaches_no_io():
    bad = impurities()
    assert not bad, "\n".join(bad)


def test_the_checks_fail_on_what_is_planted_in_a_copy_of_the_package(tmp_path):
    """An import up the layers and one across siblings, a module over 600 lines, a module no
    layer places, a file read and a clock in the core: each is found, and nothing else is."""
    copy = tmp_path / "exporter"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))

    def plant(relative: str, text: str) -> None:
        path = copy / relative
        path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")

    plant("parse/snapshot.py", "\nfrom ..serve import state\n")
    plant("monitor/engine.py", "\nfrom ..discovery import targets\n")
    (copy / "series" / "promql.py").write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    (copy / "newpackage").mkdir()
    (copy / "newpackage" / "thing.py").write_text("", encoding="utf-8")
    plant("alerting/causes.py", "\n\ndef planted(p):\n    return open(p).read()\n")
    plant("series/window.py", "\nimport time\n")

    assert upward_imports(copy) == ["exporter.monitor.engine imports exporter.discovery.targets",
                                    "exporter.parse.snapshot imports exporter.serve.state"]
    assert long_modules(copy) == {"exporter.series.promql": MAX_LINES + 1}
    assert unplaced(copy) == ["exporter.newpackage.thing"]
    planted = len((copy / "alerting" / "causes.py").read_text().splitlines())
    # each finding is named at its source, however many core modules reach it (the state's
    # threading, through the planted import of it)
    assert {line.rpartition(" -> ")[2] for line in impurities(copy)} == {
        f"exporter.alerting.causes calls open() at line {planted}", "exporter.series.window imports time",
        "exporter.serve.state imports threading"}


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

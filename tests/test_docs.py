"""The README is the front door and docs/ the manual: every fact they state that the code
also states (metric names, commands and flags, defaults, links, the set-up commands) is
checked against the code here, so the two cannot drift apart."""
import argparse
import re
from pathlib import Path

import pytest
import yaml

from exporter import cli
from exporter.config import sections as config
from exporter.serve.collector import METRICS

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_LIMIT = 15_000  # bytes: a front door, not a manual
FRONT_DOOR_COMMANDS = ("pip install . && vllm-prefix-cache-exporter demo", "scripts/test")


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def without_code_blocks(markdown: str) -> str:
    return re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)


def code_blocks(markdown: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", markdown, flags=re.S | re.M)


def section(markdown: str, heading: str) -> str:
    """From the heading line to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    start = markdown.index(heading + "\n")
    rest = markdown[start + len(heading) + 1:]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{level}}} ", rest, flags=re.M)]
    return rest[:ends[0]] if ends else rest


def table_rows(markdown: str) -> list[list[str]]:
    rows = []
    for line in markdown.splitlines():
        if line.startswith("|") and not re.match(r"^\|[-| :]+\|$", line):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def backticked(cell: str) -> str | None:
    m = re.fullmatch(r"`([^`]*)`", cell)
    return m.group(1) if m else None


# --- the README: a front door ---------------------------------------------------------------

def test_readme_is_a_front_door_of_at_most_15_kb():
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes; move sections into docs/"


def test_the_readme_gives_exactly_the_two_set_up_commands():
    commands = [line.strip() for block in code_blocks(text(README), "sh") for line in block.splitlines() if line.strip()]
    assert tuple(commands) == FRONT_DOOR_COMMANDS


def test_ci_runs_the_readme_test_command():
    ci = [line.strip() for line in text(ROOT / ".ci" / "run").splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci == [FRONT_DOOR_COMMANDS[1]]
    assert (ROOT / "scripts" / "test").stat().st_mode & 0o111


def test_the_readme_demo_command_runs_our_console_script():
    pyproject = text(ROOT / "pyproject.toml")
    script = re.search(r"^\[project\.scripts\]\n(\S+) = \"exporter\.__main__:entry\"", pyproject, flags=re.M)
    assert script and FRONT_DOOR_COMMANDS[0] == f"pip install . && {script.group(1)} demo"
    assert "demo" in subcommands(cli.build_parser())


def test_the_readme_minimal_config_loads():
    blocks = code_blocks(text(README), "yaml")
    assert blocks, "the README shows a minimal config"
    cfg = config.load_text(blocks[0], "README.md")
    assert cfg.targets


def test_every_runtime_dependency_beyond_the_basic_four_has_its_reason_in_the_readme():
    pyproject = text(ROOT / "pyproject.toml")
    deps = re.search(r"^dependencies = \[(.*?)\]", pyproject, flags=re.S | re.M).group(1)
    names = [re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in re.findall(r'"([^"]+)"', deps)]
    readme = text(README)
    for name in names:
        assert f"`{name}`" in readme, name
    for name in set(names) - {"prometheus-client", "requests", "apscheduler", "pyyaml"}:
        reason = re.search(rf"^- `{re.escape(name)}` (.+)$", readme, flags=re.M)
        assert reason and len(reason.group(1)) > 40, f"{name}: say why we need it"


def test_the_readme_alert_table_names_every_sidecar_alert_of_the_runbook():
    runbook = text(ROOT / "alerts" / "runbook.md")
    sidecar_alerts = set(re.findall(r"^### (prefixcache\w+)$", section(runbook, "## Sidecar alerts"), flags=re.M))
    assert sidecar_alerts
    for page in (README, DOCS / "alerts.md"):
        names = {backticked(row[0]) for row in table_rows(text(page))}
        assert sidecar_alerts <= {n.lower() for n in names if n}, page.name
        for name in names:
            if name and name.startswith("PrefixCache"):
                assert f"### {name.lower()}\n" in runbook, f"{page.name}: {name} has no runbook section"


# --- metrics ---------------------------------------------------------------------------------

def test_every_metric_of_ours_is_documented_in_the_metrics_page():
    page = text(DOCS / "metrics.md")
    for d in METRICS.values():
        assert re.search(rf"`{re.escape(d.exposed_name)}(?![a-z0-9_])", page), d.exposed_name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_metric_of_ours_the_docs_name_exists(page):
    ours = {d.exposed_name for d in METRICS.values()}
    for name in set(re.findall(r"(?<![a-z0-9_:])prefixcache_[a-z0-9_]*[a-z0-9]", text(page))):
        base = re.sub(r"_(bucket|sum|count|created)$", "", name)
        assert name in ours or base in ours, f"{page.name} names {name}, which we do not export"


# --- the command line ------------------------------------------------------------------------

def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def long_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt: a for a in parser._actions if not isinstance(a, argparse._HelpAction)
            for opt in a.option_strings if opt.startswith("--")}


def names_option(markdown: str, option: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(option)}(?![\w.-])", markdown) is not None


def test_every_command_and_long_option_is_in_the_tools_page():
    page = text(DOCS / "tools.md")
    parser = cli.build_parser()
    for option in long_options(parser):
        assert names_option(page, option), option
    for name, sub in subcommands(parser).items():
        body = section(page, f"## `{name}`")
        for option in long_options(sub):
            assert names_option(body, option), f"{name} {option}"


def documented_default(cell: str):
    value = backticked(cell)
    return None if value is None else yaml.safe_load(value)


def test_the_tools_page_flag_tables_match_the_parser():
    page = text(DOCS / "tools.md")
    for name, sub in subcommands(cli.build_parser()).items():
        options = long_options(sub)
        for row in table_rows(section(page, f"## `{name}`")):
            flag = backticked(row[0])
            if not flag or not flag.startswith("--"):
                continue
            assert flag in options, f"tools.md documents {name} {flag}, which the parser does not take"
            default = documented_default(row[1])
            if default is not None:
                assert default == options[flag].default, f"{name} {flag}: tools.md says {default!r}"


# --- configuration and rule defaults -----------------------------------------------------------

def documented_defaults(page: Path) -> dict[str, object]:
    """`| \\`section.key\\` | \\`default\\` | ... |` rows, the default as YAML reads it."""
    found = {}
    for row in table_rows(text(page)):
        key = backticked(row[0])
        if len(row) >= 2 and key and re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", key) and backticked(row[1]) is not None:
            found[key] = documented_default(row[1])
    return found


def nested(key: str, value) -> dict:
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


@pytest.mark.parametrize("page", ["configuration.md", "alerts.md", "rollout-gate.md"])
def test_documented_defaults_are_what_an_empty_config_gets(page):
    defaults = documented_defaults(DOCS / page)
    if page != "rollout-gate.md":
        assert defaults, f"{page} has a table of defaults"
    empty = config.load({})
    for key, value in defaults.items():
        try:
            loaded = config.load(nested(key, value))
        except config.ConfigError as exc:
            pytest.fail(f"{page}: {key}: {value!r} is not a valid setting: {exc.errors}")
        assert loaded == empty, f"{page}: {key} is documented as {value!r}, which is not the default"


def test_defaults_shown_in_yaml_blocks_are_the_defaults():
    """The rollout gate shows its section's defaults as YAML."""
    (block,) = [b for b in code_blocks(text(DOCS / "rollout-gate.md"), "yaml") if b.startswith("analysis:")]
    assert config.load(yaml.safe_load(block)) == config.load({})


def test_every_rule_key_of_the_packaged_defaults_is_in_the_alerts_page():
    packaged = yaml.safe_load(text(ROOT / "exporter" / "config" / "default_rules.yml"))
    keys = {f"rules.{k}.{sub}" for k, v in packaged.items() if isinstance(v, dict) for sub in v}
    keys |= {f"rules.{k}" for k, v in packaged.items() if not isinstance(v, dict)}
    documented = documented_defaults(DOCS / "alerts.md")
    assert keys - set(documented) == set()
    for key in keys:
        path = key.split(".")[1:]
        value = packaged
        for part in path:
            value = value[part]
        assert documented[key] == value, f"alerts.md: {key}"


# --- links -----------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", without_code_blocks(text(path)), flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves_in_the_repository(page):
    links = re.findall(r"\]\(([^)\s]+)\)", without_code_blocks(text(page)))
    for link in links:
        if re.match(r"^[a-z]+:", link):
            continue
        target, _, fragment = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.is_relative_to(ROOT.resolve()), f"{page.name}: {link} leaves the repository"
        assert path.exists(), f"{page.name}: {link} does not exist"
        if fragment and path.suffix == ".md":
            assert fragment in anchors(path), f"{page.name}: {link}: no such heading"


REPO_FOLDERS = ("exporter", "tests", "alerts", "deploy", "dashboards", "benchmarks", "scripts", "docs", ".ci", ".github")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_file_of_ours_the_docs_name_exists(page):
    """Modules move; a page that names one where it was misleads the reader."""
    for path in re.findall(r"`((?:%s)/[\w./-]*[\w])`" % "|".join(map(re.escape, REPO_FOLDERS)), text(page)):
        if "*" not in path and "<" not in path:
            assert (ROOT / path).exists(), f"{page.name} names {path}, which is not in the repository"


def test_every_docs_page_is_linked_from_the_readme():
    readme = text(README)
    for page in DOCS.glob("*.md"):
        assert f"(docs/{page.name}" in readme, page.name


# --- development -----------------------------------------------------------------------------

def test_the_development_page_gives_the_fast_loop_and_the_full_suite():
    page = text(DOCS / "development.md")
    assert 'pytest -m "not slow"' in page
    assert "scripts/test" in page
    assert '"slow:' in text(ROOT / "pyproject.toml")


def test_the_development_page_names_the_one_set_up_command_and_every_debian_package_it_installs():
    page = section(text(DOCS / "development.md"), "## The test loop")
    setup = text(ROOT / "scripts" / "setup")
    packages = re.findall(r"need\+=\(([\w-]+)\)", setup)
    assert "scripts/setup" in page and "scripts/setup" in text(ROOT / "scripts" / "test")
    assert packages and all(f"`{p}`" in page for p in packages), packages
    assert "pip install -q --disable-pip-version-check -e '.[test]'" in setup


def test_the_development_page_draws_every_folder_and_top_module_of_the_package_in_its_layer():
    """The tree of docs/development.md: one line per subpackage and top-level module, from the
    top layer down, as tests/test_layout.py's LAYERS orders them."""
    import test_layout
    tree = section(text(DOCS / "development.md"), "## Layout").split("```")[1]
    drawn = re.findall(r"[├└]── ([\w., /]+?)(?:/)?\s{2,}", tree)
    names = [n.strip().removesuffix(".py") for entry in drawn for n in entry.replace("/", "").split(",")]
    package = ROOT / "exporter"
    folders = sorted(p.parent.name for p in package.glob("*/__init__.py"))
    tops = sorted(p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert sorted(names) == sorted(folders + tops), "draw each folder and top-level module once in docs/development.md"
    rank = {}
    for layer, groups in enumerate(test_layout.LAYERS):
        for group in groups:
            for prefix in group:
                rank[prefix.removeprefix("exporter.")] = layer
    drawn_ranks = [rank[n] for n in names]
    assert drawn_ranks == sorted(drawn_ranks, reverse=True), "draw the layers from the top down"


# --- the rules' defaults where the prose states them -------------------------------------------

def prose_chunks(markdown: str) -> list[str]:
    """Table rows, list items and paragraphs outside code blocks: one statement each."""
    chunks, current = [], []
    for line in without_code_blocks(markdown).splitlines():
        starts = line.startswith(("|", "- ", "#")) or re.match(r"^\d+\. ", line) or not line.strip()
        if starts and current:
            chunks.append(" ".join(current))
            current = []
        if line.startswith("|"):
            chunks.append(line)
        elif line.strip():
            current.append(line.strip())
    return chunks + ([" ".join(current)] if current else [])


def seconds(duration: str) -> float:
    return 0.0 if re.fullmatch(r"0+[smh]", duration) else config.parse_duration(duration)


def stated_quantities(chunk: str) -> list[tuple[str, str, float]]:
    """(kind, as written, value) of every default-like quantity a statement makes."""
    found = []
    for m in re.finditer(r"(\d+)\+? points", chunk):
        found.append(("fraction", m.group(0), int(m.group(1)) / 100))
    for m in re.finditer(r"(?<![\w.])(\d+)%", chunk):
        found.append(("fraction", m.group(0), int(m.group(1)) / 100))
    for m in re.finditer(r"(?<![\w.])(\d+(?:\.\d+)?)x\b", chunk):
        found.append(("ratio", m.group(0), float(m.group(1))))
    for m in re.finditer(r"(?<![\w.])(\d+)(k)?\+? (?:engine )?query tokens", chunk):
        found.append(("tokens", m.group(0), int(m.group(1)) * (1000 if m.group(2) else 1)))
    for m in re.finditer(r"(?<![\w.`])(\d+)(s|m|h)\b(?!`)", chunk):
        found.append(("duration", m.group(0), seconds(m.group(0))))
    for m in re.finditer(r"(?<![\w.])(\d+)[- ]minutes?\b", chunk):
        found.append(("duration", m.group(0), int(m.group(1)) * 60.0))
    return found


def rule_statements(markdown: str) -> list[str]:
    """The rows of the alert tables, and every sentence of the prose, one statement each."""
    out = []
    for chunk in prose_chunks(markdown):
        out += [chunk] if chunk.startswith("|") else re.split(r"(?<=[.;])\s+", chunk)
    return out


def test_every_rule_default_the_docs_state_in_prose_is_the_yamls():
    """Where a page says what a rule fires on ("25+ points under the 5 minutes before",
    "a 10-minute grace"), each number is a value exporter/config/default_rules.yml gives that
    rule (or the rules' look-back and grace, or its window + for): change a default
    and the sentence that states it fails here. The rules are the registry's: a table row
    whose first cell is the alert, or a sentence naming the alert or its `rules.<key>`."""
    from exporter.alerting import rules
    packaged = config.default_rules_yaml()
    shared = {seconds(packaged["cold_start_grace"]), seconds(packaged["event_lookback"])}
    checked = 0
    for page in PAGES:
        for statement in rule_statements(text(page)):
            if statement.startswith("|"):
                named = [r for r in rules.REGISTRY if statement.split("|")[1].strip() == f"`{r.alertname}`"]
            else:
                named = [r for r in rules.REGISTRY if f"`{r.alertname}`" in statement or f"`rules.{r.key}`" in statement]
            grace = re.search(r"\d+[- ]minute (?:cold-start )?grace", statement)
            if len(named) != 1 and not grace:
                continue  # no rule, or several: no single rule's defaults are stated
            values = packaged[named[0].key] if len(named) == 1 else {}
            durations = {seconds(v) for v in values.values() if isinstance(v, str) and re.fullmatch(r"\d+[smh]", v)}
            allowed = {
                "fraction": {v for k, v in values.items() if k in ("below", "drop_points")},
                "ratio": {v for k, v in values.items() if k == "ratio"},
                "tokens": {v for k, v in values.items() if k == "min_query_tokens"},
                # "pages within 3 minutes": the window the rule reads, then its `for`
                "duration": shared | durations | ({seconds(values["window"]) + seconds(values["for"])} if "window" in values else set()),
            }
            for kind, written, value in stated_quantities(statement):
                assert any(abs(value - a) < 1e-9 for a in allowed[kind]), \
                    f"{page.name}: {written!r} about {named[0].key if named else 'the cold-start grace'} is no default of default_rules.yml"
                checked += 1
    assert checked >= 20, "the alert tables state the rules' defaults"


def test_every_registered_rule_is_in_the_alert_tables_and_its_settings_in_the_defaults_table():
    from exporter.alerting import rules
    documented = documented_defaults(DOCS / "alerts.md")
    for page in (README, DOCS / "alerts.md"):
        first_cells = {row[0] for row in table_rows(text(page))}
        for rule in rules.REGISTRY:
            assert f"`{rule.alertname}`" in first_cells, f"{page.name}: no row for {rule.alertname}"
    for rule in rules.REGISTRY:
        for name in rules.COMMON_SETTINGS + rule.settings:
            assert f"rules.{rule.key}.{name}" in documented, f"alerts.md: rules.{rule.key}.{name}"

import subprocess
import sys

import pytest
import yaml

from exporter.tools import lint

from conftest import FIXTURES

LINT = FIXTURES / "prompts" / "lint"


def findings(name):
    path = LINT / name
    return lint.lint(str(path), path.read_text())


@pytest.mark.parametrize("name, kinds", [
    pytest.param("timestamp_first.j2", {("timestamp", 2)}, id="timestamp-placeholder-first"),
    pytest.param("user_and_ids_first.j2", {("request_id", 1), ("user_name_or_tier", 1), ("uuid", 2)}, id="ids-and-user-first"),
    pytest.param("good.j2", set(), id="volatile-content-last-is-fine"),
    pytest.param("unsorted_tools.json", {("tools_order", 13)}, id="unsorted-tools"),
    pytest.param("literal_timestamp.json", {("timestamp", 6)}, id="literal-timestamp-in-request"),
    pytest.param("sorted_static.json", set(), id="clean-request"),
    pytest.param("epoch_seconds.json", {("timestamp", 6)}, id="epoch-seconds-first"),
    pytest.param("twelve_hour_time.txt", {("timestamp", 2)}, id="twelve-hour-time-first"),
])
def test_findings_with_file_and_line(name, kinds):
    assert {(f.kind, f.line) for f in findings(name)} == kinds


def run(*args):
    return subprocess.run([sys.executable, "-m", "exporter", "lint", *args], capture_output=True, text=True, timeout=60)


def test_cli_exit_codes_for_ci():
    bad = run(str(LINT / "timestamp_first.j2"), str(LINT / "good.j2"))
    assert bad.returncode == 1 and f"{LINT / 'timestamp_first.j2'}:2: timestamp:" in bad.stdout
    good = run(str(LINT / "good.j2"), str(LINT / "sorted_static.json"))
    assert good.returncode == 0 and good.stdout == ""


def test_allow_list_in_config(tmp_path):
    cfg = tmp_path / "c.yml"
    cfg.write_text(yaml.safe_dump({"lint": {"allow": ["timestamp", r"uuid4"]}}))
    out = run("--config.file", str(cfg), str(LINT / "timestamp_first.j2"), str(LINT / "user_and_ids_first.j2"))
    kinds = {line.split(": ")[1] for line in out.stdout.splitlines()}
    assert out.returncode == 1 and kinds == {"request_id", "user_name_or_tier"}


@pytest.mark.parametrize("setup, fragment", [
    pytest.param(lambda p: p.write_text("{not json"), "not JSON", id="bad-json"),
    pytest.param(lambda p: p.write_text('{"prompt": "x"}'), "no `messages`", id="not-chat"),
    pytest.param(lambda p: p.write_bytes(b"\xff\xfe"), "cannot read", id="not-utf8"),
])
def test_bad_files_exit_2(tmp_path, setup, fragment):
    path = tmp_path / "r.json"
    setup(path)
    out = run(str(path))
    assert out.returncode == 2 and fragment in out.stderr


def test_bad_allow_pattern_is_a_config_error(tmp_path):
    cfg = tmp_path / "c.yml"
    cfg.write_text(yaml.safe_dump({"lint": {"allow": ["(unclosed"]}}))
    out = run("--config.file", str(cfg), str(LINT / "good.j2"))
    assert out.returncode == 2 and "lint.allow[0]" in out.stderr


def test_a_request_whose_tools_are_no_list_is_a_clear_error():
    """Found by the fuzz: `"tools": 1e308` was a TypeError deep in the tool names."""
    with pytest.raises(ValueError, match="`tools` must be a list"):
        lint.lint("a.json", '{"tools": 1e308, "messages": []}')


def test_a_template_with_a_timestamp_on_every_line_lints_in_linear_time():
    """Each finding used to rescan all the text after it: 2,000 timestamps in 120 KB took
    66 s (a 16 MiB file, hours). Now one pass for all of them."""
    import time
    text = "Current time: {{ now }} and some static text follows here.\n" * 2000 + "static " * 100
    started = time.process_time()
    found = lint.lint("t.txt", text)
    assert time.process_time() - started < 10.0
    assert {(f.kind, f.line) for f in found} == {("timestamp", i) for i in range(1, 2001)}

"""exporter/logs.py: every log line reads back, through a strict logfmt reader after
go-logfmt's decoder, into ts (RFC 3339), level, caller, msg and logger, whatever the
message holds; JSON carries the same fields."""
import json
import logging
import re
from datetime import datetime

import pytest
from hypothesis import given, settings, strategies as st

from exporter import logs

import logfmt

RFC3339_MS = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")


def record(msg, *args, level=logging.INFO, exc_info=None):
    r = logging.LogRecord("exporter.notify.alertmanager", level, "/src/exporter/notify/alertmanager.py", 42, msg, args, exc_info)
    r.created = 1796180868.123456
    return r


def test_the_old_format_was_not_logfmt():
    """What the issue saw: a logfmt reader made `ts=2026-12-02` and keys out of the message."""
    with pytest.raises(logfmt.LogfmtError):
        logfmt.parse("ts=2026-12-02 03:07:48,123 level=info logger=exporter msg=listening on :9464")


def test_a_line_reads_back_into_the_go_kit_fields():
    line = logs.StructuredFormatter("logfmt").format(record("listening on %s:%d, polling %d target(s)", "0.0.0.0", 9464, 2))
    assert line == ('ts=2026-12-02T03:07:48.123Z level=info caller=alertmanager.py:42 '
                    'msg="listening on 0.0.0.0:9464, polling 2 target(s)" logger=exporter.notify.alertmanager')
    assert dict(logfmt.parse(line))["msg"] == "listening on 0.0.0.0:9464, polling 2 target(s)"


@pytest.mark.parametrize("level, name", [(logging.DEBUG, "debug"), (logging.INFO, "info"), (logging.WARNING, "warn"),
                                         (logging.ERROR, "error"), (logging.CRITICAL, "error")])
def test_levels_are_spelled_as_go_kit_and_slog_spell_them(level, name):
    assert dict(logfmt.parse(logs.StructuredFormatter().format(record("x", level=level))))["level"] == name


@pytest.mark.parametrize("value, written", [
    pytest.param("plain", "plain", id="bare"),
    pytest.param("", "", id="empty-is-bare-as-in-go-logfmt"),
    pytest.param("null", '"null"', id="null-quoted"),
    pytest.param("a b", '"a b"', id="space"),
    pytest.param("a=b", '"a=b"', id="equals"),
    pytest.param('say "hi"', '"say \\"hi\\""', id="quote"),
    pytest.param("back\\slash", "back\\slash", id="backslash-alone-stays-bare"),
    pytest.param("two\nlines\\", '"two\\nlines\\\\"', id="newline-and-backslash"),
    pytest.param("tab\there\r", '"tab\\there\\r"', id="tab-cr"),
    pytest.param("esc\x1b[2J", '"esc\\u001b[2J"', id="escape-sequence"),
    pytest.param("sep\u2028x", '"sep\\u2028x"', id="line-separator"),
    pytest.param("naïve", "naïve", id="printable-unicode-bare"),
])
def test_values_are_quoted_and_escaped_as_go_logfmt_does(value, written):
    assert logs.logfmt_value(value) == written
    assert logfmt.parse(f"k={written}") == [("k", value)]


def test_a_forged_line_in_a_message_stays_inside_its_msg():
    line = logs.StructuredFormatter().format(record("deploy announced: version=%s", "v1\nts=x level=error msg=forged\x1b[2J"))
    assert "\n" not in line and "\x1b" not in line
    fields = logfmt.parse(line)
    assert [k for k, _ in fields] == ["ts", "level", "caller", "msg", "logger"]
    assert dict(fields)["msg"] == "deploy announced: version=v1\nts=x level=error msg=forged\x1b[2J"


def test_a_traceback_is_one_quoted_err_field():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys
        line = logs.StructuredFormatter().format(record("handler failed", level=logging.ERROR, exc_info=sys.exc_info()))
    fields = dict(logfmt.parse(line))
    assert "\n" not in line and "RuntimeError: boom" in fields["err"] and fields["err"].startswith("Traceback")


def test_what_a_line_is_about_are_keys_of_their_own_after_msg_in_logfmt_and_json():
    from exporter.logfields import fields, namespace_of
    from exporter.config.sections import Target

    r = record("alert firing")
    about = fields(alert="PrefixCacheHitRateDropAfterDeploy", state="firing", target="vllm-0",
                   namespace=namespace_of(Target("vllm-0", "http://x", (("namespace", "llm"),))), model="m",
                   cause="prompt_prefix_change", version=None)
    r.__dict__.update(about)
    line = logs.StructuredFormatter("logfmt").format(r)
    assert list(dict(logfmt.parse(line))) == ["ts", "level", "caller", "msg", "alert", "state", "target", "namespace", "model", "cause",
                                              "logger"]
    assert dict(logfmt.parse(line))["cause"] == "prompt_prefix_change"
    assert json.loads(logs.StructuredFormatter("json").format(r))["namespace"] == "llm"
    forged = record("x")
    forged.__dict__.update(fields(target="t\nlevel=error msg=FORGED"))
    assert len(logs.StructuredFormatter("logfmt").format(forged).splitlines()) == 1
    with pytest.raises(ValueError):
        fields(msg="a key of the line itself")


def test_json_carries_the_same_fields_on_one_line():
    line = logs.StructuredFormatter("json").format(record("a\nb \u2028 %s", "x"))
    assert "\n" not in line and "\u2028" not in line
    assert json.loads(line) == {"ts": "2026-12-02T03:07:48.123Z", "level": "info", "caller": "alertmanager.py:42",
                                "msg": "a\nb \u2028 x", "logger": "exporter.notify.alertmanager"}


def test_the_timestamp_is_rfc3339_in_utc_with_milliseconds():
    ts = logs.timestamp(1796180868.0009)
    assert RFC3339_MS.fullmatch(ts) and datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() == pytest.approx(1796180868.0, abs=1e-3)


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="logfmt, json"):
        logs.StructuredFormatter("text")


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text(alphabet=st.characters(codec="utf-8")))
def test_any_message_reads_back_exactly(msg, arg):
    line = logs.StructuredFormatter().format(record("%s|%s", msg, arg))
    assert "\n" not in line and "\r" not in line
    assert dict(logfmt.parse(line))["msg"] == f"{msg}|{arg}"
    assert json.loads(logs.StructuredFormatter("json").format(record("%s|%s", msg, arg)))["msg"] == f"{msg}|{arg}"


def test_setup_writes_the_format_at_the_level_to_the_file(tmp_path):
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    path = tmp_path / "log"
    try:
        logs.setup("warn", "logfmt", str(path))
        logging.getLogger("exporter.test").info("not written")
        logging.getLogger("exporter.test").warning("written %s", "once")
        for h in root.handlers:
            h.flush()
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
    (line,) = path.read_text().splitlines()
    fields = dict(logfmt.parse(line))
    assert fields["level"] == "warn" and fields["msg"] == "written once" and RFC3339_MS.fullmatch(fields["ts"])


@pytest.mark.slow
def test_every_line_of_a_sidecar_run_with_reloads_failures_and_alerts_reads_back(tmp_path):
    """The sidecar as it runs: a live target and a dead one, an alert firing, deliveries to
    an Alertmanager that is not there, a deploy announced, a reload that fails and one that
    succeeds, SIGTERM. Every line it writes reads back through the strict logfmt reader."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import requests
    import yaml

    from conftest import free_port, wait_for
    from exporter.sim import simulator
    from exporter.sim.server import Fleet

    root = Path(__file__).resolve().parent.parent
    fleet = Fleet([simulator.Replica("vllm-0", simulator.Scenario(), start=time.time() - 900, seed=1)], clock=time.time).start()
    port = free_port()
    config = {
        "global": {"poll_interval": "1s", "connect_timeout": "300ms", "read_timeout": "500ms", "jitter": "0s"},
        "targets": [{"name": "vllm-0", "url": fleet.metrics_url("vllm-0")},
                    {"name": "gone \"pod\"", "url": f"http://127.0.0.1:{free_port()}/metrics"}],
        "alertmanager": {"urls": [f"http://127.0.0.1:{free_port()}"], "timeout": "500ms"},
        "deploys": {"api_token": "s3cret"},
        "rules": {"target_down": {"for": "0s", "startup_grace": "0s"}},
    }
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    log = tmp_path / "sidecar.log"
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={path}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.format=logfmt"], cwd=root, stderr=open(log, "w"), stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: "msg=\"alert firing\" alert=PrefixCacheTargetDown" in log.read_text(), 30), log.read_text()[-2000:]
        assert wait_for(lambda: "alertmanager http://127.0.0.1" in log.read_text(), 30), log.read_text()[-2000:]
        r = requests.post(base + "/api/v1/deploys", json={"version": "v42 \"quoted\" = x", "description": "prompt v2"},
                          headers={"Authorization": "Bearer s3cret"}, timeout=5)
        assert r.status_code == 202
        path.write_text("targets: [{name: x}]\nbogus: 1\n")
        os.kill(proc.pid, signal.SIGHUP)
        assert wait_for(lambda: "reload failed" in log.read_text(), 20), log.read_text()[-2000:]
        config["targets"] = config["targets"][:1]
        path.write_text(yaml.safe_dump(config))
        os.kill(proc.pid, signal.SIGHUP)
        assert wait_for(lambda: "reloaded config" in log.read_text(), 20), log.read_text()[-2000:]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        fleet.stop()
    lines = log.read_text().splitlines()
    records = [dict(logfmt.parse(line)) for line in lines]
    for line, fields in zip(lines, records):
        assert list(fields)[:4] == ["ts", "level", "caller", "msg"] and fields["logger"], line
        assert RFC3339_MS.fullmatch(fields["ts"]) and fields["level"] in ("debug", "info", "warn", "error"), line
    messages = [(f["level"], f["msg"]) for f in records]
    assert any(level == "error" and m.startswith("reload failed, keeping the old config:") for level, m in messages)
    assert any(level == "info" and m.startswith("reloaded config from") for level, m in messages)
    assert any(level == "warn" and m.startswith("alertmanager http://127.0.0.1:") for level, m in messages)
    # what a line is about, as keys of its own: Loki's `| logfmt | cause="..."` finds them
    firing = [f for f in records if f["msg"] == "alert firing" and f.get("alert") == "PrefixCacheTargetDown" and f.get("target") == 'gone "pod"']
    assert firing and firing[0]["state"] == "firing" and firing[0]["cause"] == "unknown"
    assert any(f["msg"] == "deploy announced" and f.get("version") == 'v42 "quoted" = x' and f.get("target") == "all" for f in records)
    assert not any("target=" in f["msg"] or "cause=" in f["msg"] for f in records)  # never inside the message
    assert not any(f["msg"] in ("up", "up again") and f.get("target") == "vllm-0" for f in records)  # a pod's first answer: debug
    assert messages[-1] == ("info", "shutting down") or any(m == "shutting down" for _, m in messages)


@pytest.mark.parametrize("text, line", [
    ("plain name, café 東京", "plain name, café 東京"),
    ("t\nlevel=error msg=FORGED", "t\\nlevel=error msg=FORGED"),
    ("a\r\tb\x1b[31mred\u2028c\u202ed", "a\\r\\tb\\u001b[31mred\\u2028c\\u202ed"),
])
def test_one_line_escapes_what_would_end_or_disguise_a_line_and_keeps_the_rest(text, line):
    assert logs.one_line(text) == line

import json
import os
import subprocess
import sys
import time

import pytest
import requests

from exporter.cli import main

from conftest import FIXTURES, free_port

UPSTREAM = FIXTURES / "vllm-metrics"


def run_cli(*args, input=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "exporter", *args], input=input, capture_output=True, text=True, timeout=timeout)


def test_parse_file_prints_the_contract_json():
    proc = run_cli("parse", str(UPSTREAM / "v1-0.10.0_production-stack-issue-617.txt"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["series"][0]["prefix_cache"] == {"queries": 32.0, "hits": 0.0, "unit": "tokens"}


def test_parse_stdin_and_garbage_exit_code():
    proc = run_cli("parse", "-", input="<html>nope</html>\n")
    assert proc.returncode == 1 and "no vLLM prefix-cache series" in proc.stderr
    assert json.loads(proc.stdout)["series"] == []


def test_parse_missing_file():
    proc = run_cli("parse", "/nonexistent.txt")
    assert proc.returncode == 1 and "cannot read" in proc.stderr


def test_check_config_good_and_bad():
    good = run_cli("check-config", str(FIXTURES / "config" / "good.yml"))
    assert good.returncode == 0 and "OK" in good.stdout
    bad = run_cli("check-config", str(FIXTURES / "config" / "bad.yml"))
    assert bad.returncode == 2
    assert "targets[1].name: required" in bad.stderr and "17 error(s)" in bad.stderr


def test_run_without_config_exits_2(monkeypatch):
    monkeypatch.delenv("PREFIX_CACHE_EXPORTER_CONFIG", raising=False)
    assert main(["run"]) == 2


def test_run_with_bad_config_exits_2():
    assert main(["run", "--config.file", str(FIXTURES / "config" / "bad.yml")]) == 2


def test_run_serves_metrics_and_stops_on_sigterm(tmp_path):
    port = free_port()
    cfg = tmp_path / "c.yml"
    cfg.write_text(f"targets:\n  - name: dead\n    url: http://127.0.0.1:{free_port()}/metrics\n")
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--web.listen-address=127.0.0.1:{port}"],
                            env={**os.environ, "PREFIX_CACHE_EXPORTER_CONFIG": str(cfg)},
                            stderr=subprocess.PIPE, text=True)
    try:
        # a target not polled yet also reads up 0: wait for its first failed poll, which is
        # what makes the process ready (every target polled once), not for the gauge alone
        body = None
        for _ in range(200):
            try:
                r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=1)
                if 'prefixcache_scrapes_total{result="connection_error",target="dead"} 1.0' in r.text:
                    body = r.text
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        assert body is not None and 'prefixcache_target_up{target="dead"} 0.0' in body
        assert requests.get(f"http://127.0.0.1:{port}/-/ready", timeout=1).status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert "msg=\"down: connection_error" in err and "target=dead" in err


@pytest.mark.slow  # the demo plays its 120 s story in real time
def test_demo_runs_the_story_and_exits_by_itself():
    proc = run_cli("demo", f"--web.listen-address=127.0.0.1:{free_port()}", timeout=200)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # quiet by default: no log lines interleave with the console
    lines = proc.stdout.splitlines()
    last = [l for l in lines if l.startswith("demo: hit rate")][-1]
    before, lowest, end = [float(x.rstrip("%,")) for x in last.split() if x.endswith("%") or x.endswith("%,")]
    assert before > 80 and lowest < 10 and end > 70
    firing = [l for l in lines if "ALERT FIRING PrefixCacheHitRateDropAfterDeploy" in l]
    assert len(firing) == 2 and all("cause=prompt_prefix_change" in l for l in firing)
    assert "demo:   likely culprit: timestamp" in proc.stdout
    # every transition is printed once, and every alert that fired has resolved by the end
    transitions = [l.split("ALERT ", 1)[1].split(":")[0] for l in lines if " ALERT " in l]
    assert len(transitions) == len(set(transitions))
    fired = {t.removeprefix("FIRING ") for t in transitions if t.startswith("FIRING ")}
    resolved = {t.removeprefix("RESOLVED ") for t in transitions if t.startswith("RESOLVED ")}
    assert fired and fired == resolved
    assert any("window still holds the incident's traffic" in l for l in lines)
    # and it ends with where the incident's points went
    waterfall = [l for l in lines if "volatile content before static content" in l]
    assert waterfall and float(waterfall[0].split("static content")[1].split()[0]) < -40


def test_check_config_warns_about_no_targets_and_an_open_deploy_api(tmp_path):
    cfg = tmp_path / "empty.yml"
    cfg.write_text("global: {poll_interval: 5s}\n")
    proc = run_cli("check-config", str(cfg))
    assert proc.returncode == 0
    assert "warning: no targets" in proc.stderr and "deploy" not in proc.stderr  # closed without a token: nothing to warn of
    cfg.write_text("global: {poll_interval: 5s}\ndeploys: {api_open: true}\n")
    proc = run_cli("check-config", str(cfg))
    assert proc.returncode == 0 and "warning: deploys.api_open" in proc.stderr



def test_check_config_names_the_prometheus_source_and_warns_when_one_prometheus_is_both_scraped_for_and_read(tmp_path):
    """The same Prometheus as discovery.prometheus (scrape the pods it scrapes) and as
    read_prometheus (read their series): a pod both select was polled twice, under name
    and name@address, and its alerts came twice, with no word at check-config."""
    cfg = tmp_path / "central.yml"
    read = "discovery: {read_prometheus: {url: 'http://prometheus:9090', match_labels: {job: vllm}}}\n"
    cfg.write_text(read)
    proc = run_cli("check-config", str(cfg))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK, 0 target(s), discovery: read_prometheus")
    assert "warning" not in proc.stderr
    cfg.write_text("discovery: {read_prometheus: {url: 'http://prometheus:9090/', match_labels: {job: vllm}},\n"
                   "            prometheus: {url: 'http://prometheus:9090', match_labels: {job: vllm}}}\n")
    proc = run_cli("check-config", str(cfg))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("discovery: prometheus, read_prometheus")
    assert ("warning: discovery.prometheus and discovery.read_prometheus both ask http://prometheus:9090/: a pod both select "
            "is polled twice") in proc.stderr


def test_parse_prints_strict_json(fixtures):
    import json
    proc = run_cli("parse", str(fixtures / "edge" / "escapes_nan_inf.txt"))
    assert "NaN" not in proc.stdout and "Infinity" not in proc.stdout
    data = json.loads(proc.stdout, parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert data["series"][0]["kv_cache_usage"] is None and data["rejected_samples"] == {"non_finite_counter": 1}


def test_record_exits_1_when_the_target_never_answered(tmp_path):
    out = tmp_path / "rec.jsonl"
    proc = run_cli("record", f"--target=http://user:pw@127.0.0.1:{free_port()}/metrics", f"--out={out}",
                   "--interval=0.2", "--duration=0.5")
    assert proc.returncode == 1 and "never answered" in proc.stderr
    assert "pw@" not in proc.stderr and "user:xxxxx@" in proc.stderr


@pytest.mark.parametrize("command", ["run", "demo", "backtest", "record", "simulate", "diagnose"])
def test_help_shows_defaults(command):
    proc = run_cli(command, "--help")
    assert proc.returncode == 0 and "default" in proc.stdout


@pytest.mark.slow
def test_record_with_a_config_writes_discovered_targets_with_their_labels(tmp_path):
    from exporter.sim import simulator
    from exporter.sim.server import Fleet
    r = simulator.Replica("pod-a", simulator.Scenario(), start=1000.0)
    fleet = Fleet([r], clock=lambda: 1000.0).start()
    try:
        sd = tmp_path / "sd.json"
        sd.write_text(json.dumps([{"targets": [f"127.0.0.1:{fleet.port}"], "labels": {"pod": "pod-a", "version": "v42"}}]))
        cfg = tmp_path / "cfg.yml"
        cfg.write_text(f"discovery: {{file_sd: {{files: ['{sd}']}}}}\n")
        out = tmp_path / "rec.jsonl"
        proc = run_cli("record", f"--config.file={cfg}", f"--out={out}", "--interval=0.2", "--duration=0.5")
        assert proc.returncode == 0, proc.stderr
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        assert lines and all(x["target"] == "pod-a" and x["labels"]["version"] == "v42" and "vllm:" in x["body"] for x in lines)
        proc = run_cli("record", f"--config.file={cfg}", "--target=http://127.0.0.1:1/metrics", f"--out={out}")
        assert proc.returncode == 2 and "give --target" in proc.stderr
    finally:
        fleet.stop()


def recording_line(t, body_file="v1-0.10.0_production-stack-issue-617.txt"):
    return json.dumps({"t": t, "target": "vllm-0", "body": (UPSTREAM / body_file).read_text()})


@pytest.mark.parametrize("line, why", [
    pytest.param('{"t": 1e400, "target": "a", "body": "x"}', "1e400 is out of range", id="t-overflows"),
    pytest.param('{"t": Infinity, "target": "a", "body": "x"}', "Infinity is not a JSON number", id="t-infinity"),
    pytest.param('{"t": NaN, "target": "a", "body": "x"}', "NaN is not a JSON number", id="t-nan"),
    pytest.param('{"t": 1, "target": "a", "body": ' + "[" * 100000 + "]" * 100000 + "}", "nested more than", id="deep"),
    pytest.param("\udcff\udcfe{}", "not UTF-8", id="binary"),
])
def test_backtest_skips_and_counts_a_hostile_line_and_goes_on(tmp_path, capsys, line, why):
    rec = tmp_path / "rec.jsonl"
    rec.write_bytes(line.encode("utf-8", "surrogateescape") + b"\n" + recording_line(1764480000.0).encode() + b"\n")
    assert main(["backtest", str(rec)]) == 0
    err = capsys.readouterr().err
    assert f"line 1: " in err and why in err and "1 bad line(s) skipped" in err and "Traceback" not in err


def test_backtest_of_a_file_that_is_no_recording_is_an_error(tmp_path, capsys):
    rec = tmp_path / "rec.bin"
    rec.write_bytes(bytes(range(256)) * 400)
    assert main(["backtest", str(rec)]) == 1
    err = capsys.readouterr().err
    assert "holds no recording line" in err and "more bad line(s) not shown" in err and err.count("\n") < 30


def test_whatif_lint_and_diagnose_refuse_deeply_nested_json(tmp_path, capsys):
    deep = "[" * 100000 + "]" * 100000
    sample = tmp_path / "sample.jsonl"
    sample.write_text('{"prompt_token_ids": ' + deep + "}\n" + '{"prompt": "' + "static text " * 40 + '"}\n')
    assert main(["whatif", str(sample)]) == 0
    assert "line 1: not JSON (nested more than" in capsys.readouterr().err
    request = tmp_path / "a.json"
    request.write_text('{"messages": ' + deep + "}")
    assert main(["lint", str(request)]) == 2
    assert "nested more than" in capsys.readouterr().err
    assert main(["diagnose", str(request), str(request), "--offline"]) == 2
    assert "nested more than" in capsys.readouterr().err


def test_lint_of_a_fifo_is_an_error_not_a_hang(tmp_path):
    fifo = tmp_path / "template.txt"
    os.mkfifo(fifo)
    proc = run_cli("lint", str(fifo), timeout=30)  # no writer ever opens it
    assert proc.returncode == 2 and "not a regular file" in proc.stderr


def test_parse_splits_lines_as_the_sidecar_does(tmp_path, capsys):
    """A bare \\r ends no line in the sidecar's parser; `parse` of the same bytes agrees."""
    text = ('vllm:prefix_cache_queries_total{model_name="m"} 100\r'
            'vllm:prefix_cache_hits_total{model_name="m"} 50\n'
            'vllm:prefix_cache_queries_total{model_name="n"} 10\r\nvllm:prefix_cache_hits_total{model_name="n"} 5\r\n')
    path = tmp_path / "metrics.txt"
    path.write_bytes(text.encode())
    from exporter.parse.vllm_metrics import parse
    main(["parse", str(path)])
    assert json.loads(capsys.readouterr().out)["series"] == parse(text).to_json()["series"]


def test_parse_of_a_binary_or_oversized_file_is_an_error_as_for_the_sidecar(tmp_path, capsys):
    path = tmp_path / "metrics.bin"
    path.write_bytes(b'vllm:prefix_cache_queries_total{model_name="\xff"} 1\n')
    assert main(["parse", str(path)]) == 1
    assert "not UTF-8 at byte 44" in capsys.readouterr().err


def test_parse_with_a_hostile_block_size_prints_json_not_a_traceback(tmp_path, capsys):
    path = tmp_path / "metrics.txt"
    path.write_text('vllm:cache_config_info{block_size="1e999"} 1\nvllm:prefix_cache_queries_total{model_name="m"} 1\n'
                    'vllm:prefix_cache_hits_total{model_name="m"} 1\n' + 'vllm:prefix_cache_hits_total{model_name="m"} x\n' * 500)
    assert main(["parse", str(path)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["block_size"] is None and json.loads(out)["warnings_total"] == 501
    assert "401 more warning(s) not shown" in err and err.count("\n") < 110


def test_diagnose_of_a_request_whose_tools_are_no_list_is_a_clear_error(tmp_path, capsys):
    request = tmp_path / "a.json"
    request.write_text('{"messages": [{"role": "user", "content": "hi"}], "tools": 5}')
    assert main(["diagnose", str(request), str(request), "--offline"]) == 2
    err = capsys.readouterr().err
    assert "`tools` must be a list" in err and "Traceback" not in err


@pytest.mark.parametrize("command", [["diagnose", "--offline", "{a}", "{a}"], ["lint", "{a}"], ["whatif", "{sample}"]])
def test_a_content_part_whose_text_is_no_string_is_a_usage_error_not_a_traceback(tmp_path, capsys, command):
    """`{"type": "text", "text": 5}` was a TypeError where the parts are joined, in all three."""
    request = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
    (tmp_path / "a.json").write_text(json.dumps(request))
    (tmp_path / "sample.jsonl").write_text(json.dumps({"body": request}) + "\n")
    argv = [arg.format(a=tmp_path / "a.json", sample=tmp_path / "sample.jsonl") for arg in command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "`messages[0].content[0].text` must be a string, not int" in err and "Traceback" not in err


@pytest.mark.parametrize("record, complaint", [
    pytest.param({"hash_ids": [1, 2], "input_length": 10 ** 400}, "`input_length` must be a positive integer of at most", id="input-length"),
    pytest.param({"hash_ids": [1, 2], "input_length": 32, "timestamp": 10 ** 400}, "`timestamp` must be a number (milliseconds), and finite", id="timestamp"),
    pytest.param({"hash_ids": list(range((1 << 20) + 1)), "input_length": 32}, "more than the 1,048,576 a prompt can have", id="ids-in-a-line"),
    pytest.param({"prompt_token_ids": [1] * ((1 << 20) + 1)}, "more than the 1,048,576 a prompt can have", id="tokens-in-a-line"),
])
def test_whatif_of_a_trace_line_beyond_any_prompt_is_a_usage_error(tmp_path, capsys, record, complaint):
    """10^400 tokens was an OverflowError in the report; a line of millions of ids a few GB."""
    sample = tmp_path / "trace.jsonl"
    sample.write_text(json.dumps(record) + "\n")
    assert main(["whatif", "--block-size=16", str(sample)]) == 2
    err = capsys.readouterr().err
    assert complaint in err and "holds no request to analyse" in err and "Traceback" not in err


def test_whatif_stops_at_the_ids_a_file_may_hold_with_one_error(tmp_path, capsys, monkeypatch):
    """Lines are bounded and so is the file: whatif keeps the whole sample, and a few lines
    of millions of ids each went past 4 GB. The bound is lowered here, the check is the same."""
    from exporter.tools import hashtrace
    monkeypatch.setattr(hashtrace, "MAX_IDS_PER_FILE", 1000)
    sample = tmp_path / "trace.jsonl"
    sample.write_text("".join(json.dumps({"hash_ids": list(range(k, k + 600)), "input_length": 600 * 16}) + "\n" for k in (0, 1)))
    assert main(["whatif", "--block-size=16", str(sample)]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"error: {sample} holds more than 1,000 hash or token ids (line 2): whatif keeps the whole sample "
                                "in memory; analyse a part of it (fewer requests, a shorter time)"] and not out


FORGED = "t\nlevel=error msg=FORGED"


@pytest.mark.parametrize("log_format", ["logfmt", "json"])
def test_backtest_and_check_config_never_print_a_name_raw(tmp_path, capsys, log_format):
    """A target named with a newline wrote a line of its own on stderr, one a log pipeline
    reads as a record (`level=error msg=FORGED`): names and keys from a recording or a config
    are escaped, whatever --log.format says."""
    import yaml
    body = 'vllm:prefix_cache_queries_total{model_name="m"} 100\nvllm:prefix_cache_hits_total{model_name="m"} 50\n'
    recording = tmp_path / "rec.jsonl"
    recording.write_text("".join(json.dumps({"t": 1000 + 20 * k, "target": FORGED, "body": body}) + "\n" for k in range(6))
                         + json.dumps({"t": 1200, "target": FORGED, "body": "no metrics"}) + "\n")
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({"targets": [{"name": FORGED, "url": "http://127.0.0.1:1/metrics"}] * 2,
                                      "rules": {"x\nlevel=error msg=FORGED": {}}}))
    assert main([f"--log.format={log_format}", "backtest", str(recording)]) == 0
    backtest_err = capsys.readouterr().err
    assert main([f"--log.format={log_format}", "check-config", str(config)]) == 2
    check_err = capsys.readouterr().err
    for err in (backtest_err, check_err):
        assert "FORGED" in err and not any(line.startswith("level=") for line in err.splitlines()), err
        assert all(line.startswith(("note: ", "warning: ", "error: ", "backtest: ", f"{config}: ")) for line in err.splitlines()), err
    assert "note: target t\\nlevel=error msg=FORGED was recorded every 20s" in backtest_err


@pytest.mark.parametrize("command", [["parse"], ["backtest"], ["whatif"]])
def test_a_fifo_or_a_device_is_refused_not_waited_on_or_read_forever(tmp_path, capsys, command):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        started = time.monotonic()
        assert main([*command, path]) == 1
        assert time.monotonic() - started < 2.0
        assert f"cannot read {path}: not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize("argv, complaint", [
    pytest.param(["diagnose", "a.json", "b.json", "--block-size", "-1"], "argument --block-size: -1 is not between 1 and", id="diagnose-block-size"),
    pytest.param(["record", "--target", "http://127.0.0.1:9/metrics", "--out", "x", "--interval", "nan"], "argument --interval: nan is not a finite number", id="record-interval-nan"),
    pytest.param(["record", "--target", "http://127.0.0.1:9/metrics", "--out", "x", "--duration", "inf"], "argument --duration: inf is not a finite number", id="record-duration-inf"),
    pytest.param(["simulate", "--replicas", "1000000000"], "argument --replicas: 1000000000 is not between 1 and 256", id="simulate-replicas"),
    pytest.param(["simulate", "--replicas", "-5"], "argument --replicas: -5 is not between 1 and 256", id="simulate-negative-replicas"),
    pytest.param(["demo", "--duration", "-1"], "argument --duration: -1 is not a finite number above 0", id="demo-duration"),
    pytest.param(["whatif", "r.jsonl", "--replicas", "1e9"], "argument --replicas: '1e9' is not a whole number", id="whatif-replicas-1e9"),
    pytest.param(["whatif", "r.jsonl", "--replicas", "1000000000"], "argument --replicas: 1000000000 is not between 1 and 4,096", id="whatif-replicas-huge"),
    pytest.param(["whatif", "r.jsonl", "--replicas", "-5"], "argument --replicas: -5 is not between 1 and 4,096", id="whatif-replicas-negative"),
    pytest.param(["whatif", "r.jsonl", "--cache-blocks", "-1"], "argument --cache-blocks: -1 is not between 1 and", id="whatif-cache-blocks"),
    pytest.param(["whatif", "r.jsonl", "--measure-from", "nan"], "argument --measure-from: nan is not a finite number", id="whatif-measure-from-nan"),
])
def test_a_number_out_of_its_range_is_a_usage_error(capsys, argv, complaint):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and complaint in capsys.readouterr().err


def test_record_onto_a_full_disk_is_an_error_that_says_so(tmp_path, capsys):
    from fakeserver import FakeServer, text
    body = (UPSTREAM / "v1-0.10.0_production-stack-issue-617.txt").read_text()
    with FakeServer({"/metrics": text(body)}) as vllm:
        code = main(["record", "--target", vllm.base + "/metrics", "--out", "/dev/full", "--interval", "0.1", "--duration", "1"])
    assert code == 1 and "cannot write /dev/full: No space left on device; recording stopped" in capsys.readouterr().err

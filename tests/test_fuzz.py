"""Property-based fuzz of the whole path a hostile /metrics body travels, and of the command
line's readers (recording, whatif sample, lint input):
parse -> engine (history, windows, detectors, rules) -> collector -> HTTP. No exception
may escape, the HTTP answers stay well formed, and each example has a time bound
(hypothesis' deadline)."""
import io
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from exporter.serve.collector import PrefixCacheCollector
from exporter.config.sections import load
from exporter.monitor.engine import Engine
from exporter.serve.app import App, status_json
from exporter.serve.state import State
from exporter.monitor.targetview import TargetView
from exporter.parse.vllm_metrics import parse

from conftest import FIXTURES

REAL = (FIXTURES / "vllm-metrics" / "v1-main-2026-08_vllm-pr-51670.txt").read_text().splitlines()
NAMES = ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket",
         "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count", "vllm:kv_cache_usage_perc",
         "vllm:cache_config_info", "process_start_time_seconds", "vllm:prefix_cache_queries_created",
         "vllm:gpu_prefix_cache_queries_total", "vllm:num_preemptions_total", "vllm:prompt_tokens_total"]
VALUES = st.one_of(st.sampled_from(["+Inf", "-Inf", "NaN", "-1", "0", "1e308", "1.7e+09", "1e-300", "", "x", "0x10"]),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.integers(-10**20, 10**20).map(str))
LABEL_VALUES = st.one_of(st.sampled_from(["m", "0", "1", "+Inf", "0.5", 'a"b', "a\\\\b", "a\\nb", "", "True", "False"]),
                         st.text(max_size=12))


@st.composite
def sample_line(draw):
    name = draw(st.sampled_from(NAMES))
    labels = draw(st.dictionaries(st.sampled_from(["model_name", "engine", "le", "block_size", "enable_prefix_caching", "pid"]),
                                  LABEL_VALUES, max_size=4))
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    line = f"{name}{{{body}}} {draw(VALUES)}" if labels or draw(st.booleans()) else f"{name} {draw(VALUES)}"
    if draw(st.integers(0, 9)) == 0:
        line = line[: draw(st.integers(0, len(line)))]  # truncated mid-line
    return line


BODIES = st.lists(st.one_of(sample_line(), st.sampled_from(REAL), st.text(max_size=40),
                            st.sampled_from(["# TYPE vllm:prefix_cache_queries_total counter", "# HELP x", "#", "{", "}"])),
                  max_size=40).map("\n".join)

CONFIG = load({"targets": [{"name": "t", "url": "http://127.0.0.1:1/metrics", "labels": {"namespace": "llm"}}],
               "global": {"windows": ["10s", "1m"], "poll_interval": "1s", "min_query_tokens": 1, "read_timeout": "1s", "connect_timeout": "1s"},
               "rules": {"hit_rate_low": {"window": "1m"}, "hits_stuck_at_zero": {"window": "1m"}, "counters_disagree": {"window": "1m"},
                         "router_prediction_gap": {"window": "1m"},
                         "ttft_regression": {"window": "10s", "reference": "50s"},
                         "hit_rate_drop_after_deploy": {"baseline": "30s", "after": "30s"}}})


def get(app, path):
    out = {}
    body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": path, "wsgi.input": io.BytesIO(b"")},
                        lambda status, headers: out.update(status=status)))
    return int(out["status"].split()[0]), body


@pytest.mark.slow
@settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(BODIES, min_size=1, max_size=6))
def test_hostile_bodies_never_break_the_pipeline(bodies):
    engine = Engine(CONFIG)
    state = State()
    target = CONFIG.targets[0]
    state.set_targets([TargetView(target=target)])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["10s", "1m"]))
    app = App(state, registry, render_interval=0.0)  # render every step: the fuzz exercises the collector
    t = 1000.0
    for body in bodies:
        snap = parse(body)
        for s in snap.series:  # what parse lets through is usable: no counter is poisoned
            for v in (s.prefix_cache.queries if s.prefix_cache else None, s.ttft.sum if s.ttft else None):
                assert v is None or (math.isfinite(v) and v >= 0)
        if snap.series:
            engine.ingest("t", t, snap)
        else:
            engine.ingest_failure("t", t)
        engine.evaluate(t)
        view = engine.tracks["t"].view
        state.publish(TargetView(target=target, up=view.up, polled=True, snapshot=snap, stats=view.stats,
                                 rejected=snap.rejected, last_result="success" if view.up else "no_vllm_metrics"))
        state.update(alerts=tuple(engine.active_alerts()))
        t += 1.0
        status, text = get(app, "/metrics")
        assert status == 200 and text.startswith(b"# HELP")
        status, text = get(app, "/api/v1/status")
        assert status == 200
        json.loads(text)
    json.dumps(status_json(state), allow_nan=False)


@settings(max_examples=60, deadline=2000)
@given(st.lists(st.tuples(st.sampled_from(["0", "+Inf", "NaN", "-5", "100", "1e9"]),
                          st.sampled_from(["0", "+Inf", "NaN", "-5", "50", "1e9"])), min_size=2, max_size=12))
def test_no_sample_poisons_a_models_windows(values):
    """Whatever a target sends between good scrapes, the hit ratio of a window of good
    scrapes after it is right."""
    engine = Engine(CONFIG)
    t = 1000.0
    for q, h in values:
        text = f'vllm:prefix_cache_queries_total{{model_name="m"}} {q}\nvllm:prefix_cache_hits_total{{model_name="m"}} {h}\n'
        snap = parse(text)
        if snap.series:
            engine.ingest("t", t, snap)
        t += 1.0
    t += 100.0  # past every window
    for i in range(12):
        snap = parse(f'vllm:prefix_cache_queries_total{{model_name="m"}} {1e10 + 1000 * i}\n'
                     f'vllm:prefix_cache_hits_total{{model_name="m"}} {1e10 + 250 * i}\n')
        engine.ingest("t", t + i, snap)
    ratio = engine.tracks["t"].view.stats["m"]["10s"].hit_ratio
    assert ratio is not None and abs(ratio - 0.25) < 1e-9


# --- the command line's readers: a hostile file is counted skips or a clear error -------
from exporter.tools import lint as lint_mod, whatif  # noqa: E402
from exporter.monitor.recording import RecordingError, read_lines  # noqa: E402
from exporter.monitor.replay import backtest  # noqa: E402

JSON_ATOMS = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e308", "0", "-1", "true", "null",
                              '"x"', '""', "1" * 400, "[]", "{}", '"\\ud800"', '"\\u0000"'])
DEEP = st.integers(1, 3000).map(lambda n: "[" * n + "]" * n)


@st.composite
def json_line(draw, keys):
    """An object line whose values are hostile: NaN, huge numbers, deep nesting, wrong types."""
    fields = draw(st.dictionaries(st.sampled_from(keys), st.one_of(JSON_ATOMS, DEEP, st.text(max_size=8).map(json.dumps)),
                                  max_size=len(keys)))
    line = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in fields.items()) + "}"
    if draw(st.integers(0, 5)) == 0:
        line = line[: draw(st.integers(0, len(line)))]
    return line


RECORDING_KEYS = ["t", "target", "body", "error", "event", "version", "labels", "description"]
RAW_LINES = st.one_of(st.binary(max_size=40), DEEP.map(str.encode), json_line(RECORDING_KEYS).map(str.encode),
                      st.sampled_from([b'{"t": 1764480000, "target": "a", "body": "x"}',
                                       b'{"t": 1764480005, "target": "a", "body": "vllm:prefix_cache_queries_total{model_name=\\"m\\"} 5"}',
                                       b'{"t": 1764480001, "event": "deploy", "target": null, "version": "v2"}']))


@pytest.mark.slow
@settings(max_examples=150, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(RAW_LINES, max_size=20))
def test_backtest_reads_any_bytes_as_records_or_counted_bad_lines(lines):
    data = b"\n".join(lines)
    bad = []
    list(backtest(io.BytesIO(data), load({}), bad.append))
    records = [r for _, r in read_lines(io.BytesIO(data))]
    assert len(bad) >= sum(isinstance(r, RecordingError) for r in records)
    for r in records:
        assert isinstance(r, RecordingError) or math.isfinite(r.t)


WHATIF_KEYS = ["t", "prompt", "prompt_token_ids", "body", "session", "replica", "lora", "cache_salt"]


@settings(max_examples=150, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(json_line(WHATIF_KEYS), DEEP, st.text(max_size=30),
                          st.sampled_from(["Received request a: prompt: 'x', params: y, prompt_token_ids: " + "[" * 500 + "1]",
                                           "Received request a: prompt: 'x', params: y, prompt_token_ids: [[1], 2]",
                                           "Received request a: prompt: None, params: y, prompt_token_ids: [1e400]"])),
                max_size=12))
def test_whatif_reads_any_line_as_a_request_or_a_sample_error(lines):
    for item in whatif.read_requests(lines):
        assert isinstance(item, (whatif.Request, whatif.SampleError))
        if isinstance(item, whatif.Request):
            assert item.t is None or math.isfinite(item.t)
            assert item.tokens is None or all(type(i) is int for i in item.tokens)


@settings(max_examples=150, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(json_line(["messages", "tools", "model"]), DEEP.map(lambda d: '{"messages": ' + d + "}"),
                 st.text(max_size=200)), st.sampled_from(["a.json", "t.txt"]))
def test_lint_reads_any_file_as_findings_or_a_clear_error(text, path):
    try:
        findings = lint_mod.lint(path, text)
    except ValueError as exc:
        assert str(exc).startswith(path)  # the command prints it and exits 2
    else:
        assert all(isinstance(f, lint_mod.LintFinding) for f in findings)

"""A prefix-aware router's prediction beside what the engines deliver: parse of the
router's metrics, and backtests of a router polled next to its engines."""
import json
from itertools import groupby

import pytest

from exporter.alerting import router
from exporter.parse import router_metrics
from exporter.config.sections import Config
from exporter.sim.simulator import Scenario
from exporter.parse.vllm_metrics import parse

from helpers import backtest_with_engine

from scenarios import START, lines

# the engines' own traffic: short shared prefixes, long own text: they deliver ~29%
DELIVERS_ABOUT_30 = dict(request_rate=5.0, system_tokens=150, user_tokens=(300, 400))


def epp_body(predicted_tokens: float, input_tokens: float, requests: float, ratio_sum: float) -> str:
    """An llm-d-router EPP: each value under its llm_d_epp_* name and its deprecated GIE
    twin (both are emitted), prefix histograms with no model, input tokens per model."""
    out = []
    for name, labels in (("inference_extension_prefix_indexer", ""), ("llm_d_epp_prefix_indexer", '{plugin_name="prefix",plugin_type="prefix-cache-scorer"}')):
        out += [f"# TYPE {name}_hit_bytes histogram",
                f'{name}_hit_bytes_bucket{{{labels[1:-1] + "," if labels else ""}le="+Inf"}} {requests}',
                f"{name}_hit_bytes_sum{labels} {predicted_tokens * 4}",
                f"{name}_hit_bytes_count{labels} {requests}",
                f"# TYPE {name}_hit_ratio histogram",
                f"{name}_hit_ratio_sum{labels} {ratio_sum}",
                f"{name}_hit_ratio_count{labels} {requests}"]
    for name in ("inference_objective_input_tokens", "llm_d_epp_request_input_tokens"):
        out += [f"# TYPE {name} histogram",
                f'{name}_sum{{model_name="demo/llama-3-8b",target_model_name="demo/llama-3-8b"}} {input_tokens}',
                f'{name}_count{{model_name="demo/llama-3-8b",target_model_name="demo/llama-3-8b"}} {requests}']
    return "\n".join(out) + "\n"


def with_router(rec, predicted_share):
    """The engines' recording with an EPP target beside them: its input tokens are the
    engines' query tokens, its predicted tokens `predicted_share(t)` of each poll's new ones."""
    out, total, predicted, requests = [], 0.0, 0.0, 0.0
    for t, group in groupby((json.loads(line) for line in rec), key=lambda o: o["t"]):
        group = list(group)
        out += [json.dumps(o) for o in group]
        now_total = sum(s.prefix_cache.queries for o in group if o.get("body") for s in parse(o["body"]).series)
        if total:
            requests += 10
            predicted += predicted_share(t - START) * max(0.0, now_total - total)
        total = now_total
        out.append(json.dumps({"t": t, "target": "epp", "body": epp_body(predicted, total, requests, 0.8 * requests)}))
    return out



def gap_transitions(transitions):
    return [(t["state"], t["labels"]["target"], t["labels"]["model_name"], t["labels"]["cause"], t["labels"]["severity"])
            for t in transitions if t["alertname"] == "PrefixCacheRouterPredictionGap"]


@pytest.mark.slow
def test_a_router_predicting_80_percent_over_engines_delivering_30_fires_routing_index_stale_and_resolves():
    fixed = 900.0  # the router's index is rebuilt here: it predicts what the engines hold again
    rec = with_router(lines(Scenario(**DELIVERS_ABOUT_30), duration=1800), lambda t: 0.8 if t < fixed else 0.3)
    transitions, engine, warnings = backtest_with_engine(rec)
    assert warnings == []
    gaps = [t for t in transitions if t["alertname"] == "PrefixCacheRouterPredictionGap"]
    assert [(t["state"]) for t in gaps] == ["pending", "firing", "resolved"]
    pending, firing, resolved = gaps
    assert firing["labels"]["cause"] == "routing_index_stale" and firing["labels"]["severity"] == "warning"
    assert firing["labels"]["target"] == "epp" and firing["labels"]["model_name"] == ""  # EPP's prefix metrics name no model
    assert firing["t"] - pending["t"] >= 300  # sustained: for 5m
    assert "predicts 80%" in firing["annotations"]["summary"] and "deliver 29%" in firing["annotations"]["summary"]
    assert fixed < resolved["t"] - START <= fixed + 300 + 60 + 30
    # the engines' own rules judge the engines (30% is low): the router target has only this alert
    assert {t["alertname"] for t in transitions if t["labels"]["target"] == "epp"} == {"PrefixCacheRouterPredictionGap"}
    assert all(t["labels"]["cause"] != "routing_index_stale" for t in transitions if t["labels"]["target"] != "epp")


@pytest.mark.slow
def test_a_router_that_agrees_with_its_engines_stays_quiet():
    rec = with_router(lines(Scenario(request_rate=5.0), duration=900), lambda t: 0.87)  # engines deliver ~89%
    transitions, engine, warnings = backtest_with_engine(rec)
    assert transitions == [] and warnings == []
    (p, d) = engine.predictions["epp"][""]["5m"]
    assert p.ratio == pytest.approx(0.87, abs=0.01) and d.ratio == pytest.approx(0.89, abs=0.03)


@pytest.mark.slow
def test_agreeing_at_30_percent_never_fires_the_gap_and_both_ratios_are_kept():
    rec = with_router(lines(Scenario(**DELIVERS_ABOUT_30), duration=900), lambda t: 0.3)
    transitions, engine, warnings = backtest_with_engine(rec)
    assert gap_transitions(transitions) == [] and warnings == []
    (p, d) = engine.predictions["epp"][""]["5m"]
    assert p.weighting == router.TOKENS and p.ratio == pytest.approx(0.3, abs=0.01)
    assert d.ratio == pytest.approx(0.29, abs=0.03) and d.targets == 2


@pytest.mark.slow
def test_delivered_above_predicted_is_fine():
    rec = with_router(lines(Scenario(request_rate=5.0), duration=900), lambda t: 0.1)  # engines deliver ~89%
    transitions, _, _ = backtest_with_engine(rec)
    assert gap_transitions(transitions) == []


@pytest.mark.slow
def test_the_router_goes_with_its_target():
    rec = with_router(lines(Scenario(**DELIVERS_ABOUT_30), duration=600), lambda t: 0.8)
    _, engine, _ = backtest_with_engine(rec)
    assert "epp" in engine.routers
    engine.reconfigure(Config(targets=tuple(t for t in engine.config.targets if t.name != "epp")))
    assert "epp" not in engine.routers and "epp" not in engine.predictions


# --- parse ---------------------------------------------------------------------------------
def test_the_epp_emits_each_value_twice_and_it_is_read_once():
    snap = parse(epp_body(800.0, 1000.0, 10.0, 7.0))
    assert snap.series == () and snap.warnings == ()
    (model, c), = snap.router.models
    assert model == router_metrics.ALL_MODELS and snap.router.kind == "epp"
    assert (c.predicted_tokens, c.input_tokens, c.ratio_sum, c.ratio_count) == (800.0, 1000.0, 7.0, 10.0)


def test_without_tokens_the_prediction_is_the_per_request_mean():
    h = router.RouterHistory(3600)
    for t, (s, n) in enumerate([(0.0, 0.0), (8.0, 10.0), (16.5, 20.0)]):
        h.append(float(t), parse(f"inference_extension_prefix_indexer_hit_ratio_sum {s}\ninference_extension_prefix_indexer_hit_ratio_count {n}\n").router)
    (p,) = h.predictions(2.0, [("5m", 300.0)])[""].values()
    assert p.weighting == router.PER_REQUEST_MEAN and p.ratio == pytest.approx(0.825) and p.requests == 20


def test_a_router_restart_is_a_reset_not_a_negative_window():
    h = router.RouterHistory(3600)
    for t, (pred, inp) in enumerate([(800.0, 1000.0), (1600.0, 2000.0), (80.0, 100.0)]):
        h.append(float(t), router_metrics.RouterSnapshot("dynamo", (("m", router_metrics.RouterCounters(pred, inp)),)))
    (p,) = h.predictions(2.0, [("5m", 300.0)])["m"].values()
    assert p.ratio == pytest.approx(0.8) and p.input_tokens == pytest.approx(1100.0)


def test_a_router_counter_stepping_back_a_little_is_held_not_taken_for_a_reset():
    """The engines' one reset policy: 2000 -> 1990 input tokens is a step back (held), not a
    restart whose 1990 would count again in the window."""
    h = router.RouterHistory(3600)
    for t, (pred, inp) in enumerate([(800.0, 1000.0), (1600.0, 2000.0), (1590.0, 1990.0), (2400.0, 3000.0)]):
        h.append(float(t), router_metrics.RouterSnapshot("dynamo", (("m", router_metrics.RouterCounters(pred, inp)),)))
    (p,) = h.predictions(3.0, [("5m", 300.0)])["m"].values()
    assert p.input_tokens == pytest.approx(2000.0) and p.ratio == pytest.approx(0.8)


def test_the_router_window_leaves_out_its_left_edge_as_the_engines_windows_do():
    h = router.RouterHistory(3600)
    for t, (pred, inp) in [(0.0, (0.0, 0.0)), (60.0, (500.0, 1000.0)), (120.0, (1300.0, 2000.0))]:
        h.append(t, router_metrics.RouterSnapshot("dynamo", (("m", router_metrics.RouterCounters(pred, inp)),)))
    got = h.predictions(120.0, [("1m", 60.0), ("2m", 120.0)])["m"]
    assert "1m" not in got  # (60, 120] holds one sample: no increase to judge
    assert got["2m"].ratio == pytest.approx(0.8) and got["2m"].input_tokens == pytest.approx(1000.0)  # (0, 120]: from t=60


def test_dynamo_decode_routing_is_not_a_prediction_of_hits():
    text = ("# TYPE dynamo_component_router_kv_selected_cached_prefix_tokens_total counter\n"
            'dynamo_component_router_kv_selected_cached_prefix_tokens_total{dynamo_namespace="ns",dynamo_component="router",model="m",phase="prefill",router_id="1"} 600\n'
            'dynamo_component_router_kv_selected_cached_prefix_tokens_total{dynamo_namespace="ns",dynamo_component="router",model="m",phase="decode",router_id="1"} 990\n'
            "# TYPE dynamo_component_router_input_sequence_tokens histogram\n"
            'dynamo_component_router_input_sequence_tokens_sum{dynamo_namespace="ns",dynamo_component="router",model="m",phase="prefill",router_id="1"} 1000\n'
            'dynamo_component_router_input_sequence_tokens_sum{dynamo_namespace="ns",dynamo_component="router",model="m",phase="decode",router_id="1"} 1000\n'
            "# TYPE dynamo_component_router_kv_hit_rate histogram\n"
            'dynamo_component_router_kv_hit_rate_sum{dynamo_namespace="ns",dynamo_component="router",router_id="1"} 3.0\n'
            'dynamo_component_router_kv_hit_rate_count{dynamo_namespace="ns",dynamo_component="router",router_id="1"} 5\n')
    snap = parse(text)
    assert snap.router.kind == "dynamo"
    models = dict(snap.router.models)
    assert (models["m"].predicted_tokens, models["m"].input_tokens) == (600.0, 1000.0)
    assert (models[""].ratio_sum, models[""].ratio_count) == (3.0, 5.0)


@pytest.mark.slow
def test_predicted_and_delivered_are_exported_beside_each_other_and_go_with_the_router_target():
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from exporter.serve.collector import PrefixCacheCollector
    from exporter.config.sections import Target
    from exporter.serve.state import State
    from exporter.monitor.targetview import TargetView

    rec = with_router(lines(Scenario(**DELIVERS_ABOUT_30), duration=600), lambda t: 0.8)
    _, engine, _ = backtest_with_engine(rec)
    state = State()
    state.set_targets([TargetView(target=Target("epp", "http://epp:9090/metrics", (("namespace", "llm"),)))])
    state.update(routing=dict(engine.predictions))

    def families():
        registry = CollectorRegistry(auto_describe=False)
        registry.register(PrefixCacheCollector(state, ["1m", "5m", "15m", "1h"]))
        return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}

    fams = families()
    predicted = {(s.labels["target"], s.labels["model_name"], s.labels["window"], s.labels["weighting"], s.labels["namespace"]): s.value
                 for s in fams["prefixcache_predicted_hit_ratio"].samples}
    assert predicted[("epp", "", "5m", "tokens", "llm")] == pytest.approx(0.8, abs=0.01)
    delivered = {(s.labels["target"], s.labels["window"]): s.value for s in fams["prefixcache_router_delivered_hit_ratio"].samples}
    assert delivered[("epp", "5m")] == pytest.approx(0.29, abs=0.03)
    state.set_targets([])
    assert "prefixcache_predicted_hit_ratio" not in families()


# --- upstream fixtures (tests/fixtures/engine-metrics/SOURCES.md) --------------------------------
def fixture(name: str) -> str:
    from pathlib import Path
    return (Path(__file__).parent / "fixtures" / "engine-metrics" / name).read_text(encoding="utf-8")


def test_gie_testdata_input_tokens_under_the_oldest_name_are_the_pools():
    snap = parse(fixture("gie_6f06bcbe_input_tokens_metric.txt"))
    assert snap.warnings == () and snap.series == ()
    ((model, c),) = snap.router.models
    assert model == router_metrics.ALL_MODELS and c.input_tokens == 100.0  # 30 + 30 + 40 over every model


def test_gie_hit_ratio_excerpt_is_a_per_request_mean():
    snap = parse(fixture("gie_v1.5.0_prefix-indexer-hit-ratio_excerpt.txt"))
    ((model, c),) = snap.router.models
    assert (c.ratio_sum, c.ratio_count, c.predicted_tokens) == (2.7, 6.0, None)
    h = router.RouterHistory(3600)
    h.append(0.0, router_metrics.RouterSnapshot("epp", ((model, router_metrics.RouterCounters(ratio_sum=0.0, ratio_count=0.0)),)))
    h.append(5.0, snap.router)
    (p,) = h.predictions(5.0, [("1m", 60.0)], min_requests=1)[""].values()
    assert p.weighting == router.PER_REQUEST_MEAN and p.ratio == pytest.approx(0.45)


def test_dynamo_fixture_reads_prefill_routing_per_model_and_the_ratio_histogram_for_the_pool():
    snap = parse(fixture("dynamo_kv-router-metrics-rs_disaggregated.txt"))
    assert snap.warnings == () and snap.router.kind == "dynamo"
    models = dict(snap.router.models)
    # prefill phase only: 3584 predicted of 4608 input tokens; decode's 4544 are a transfer
    assert (models["Qwen/Qwen3-0.6B"].predicted_tokens, models["Qwen/Qwen3-0.6B"].input_tokens) == (3584.0, 4608.0)
    assert (models[""].ratio_sum, models[""].ratio_count) == (2.5625, 4.0)


def test_what_block_counting_engines_delivered_counts_in_their_tokens():
    """A 0.8.x engine counts 16-token blocks: it was left out of what the engines
    delivered; its tokens now weigh against the gap's token floor like any engine's."""
    from exporter.series.window import WindowStats
    def ws(hits, queries, unit, block_size=None):
        return WindowStats(window="5m", seconds=300.0, query_increase=queries, hit_increase=hits, unit=unit, hit_ratio=None,
                           query_rate=None, hit_rate=None, external_hit_ratio=None, ttft_mean=None, ttft_count_increase=None,
                           correlation=None, ttft_per_10_points=None, prompt_token_increase=None, preemption_increase=None,
                           kv_cache_usage_max=None, samples=60, admitted_hit_increase=None, admitted_prompt_increase=None,
                           admitted_hit_ratio=None, block_size=block_size)
    d = router.delivered([{"m": {"5m": ws(500.0, 1000.0, "blocks", 32)}}, {"m": {"5m": ws(8000.0, 32000.0, "tokens")}}], "m", "5m")
    assert (d.query_tokens, d.targets) == (64000.0, 2) and d.ratio == pytest.approx((16000 + 8000) / 64000)

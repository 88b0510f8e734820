"""P/D disaggregation: a decode pod's prompt arrives as KV from prefill pods. Its
transfers are not hits, and its near-zero local ratio pages nobody."""
import json
import math

import pytest

from exporter.parse import roles
from exporter.sim.simulator import Scenario
from exporter.parse.vllm_metrics import parse

from helpers import backtest_with_engine

from scenarios import lines

MODEL = "demo/llama-3-8b"


def decode_body(prefill_body: str, p2p: bool = False) -> str:
    """The decode pod of a prefill pod's traffic, as vLLM with NixlConnector counts it:
    every prompt token looked up, no local hit, the connector loads all but the last
    token of each request (prompt_len - block-aligned local hit), which the decode pod
    computes; TTFT as the prefill pod saw it. With `p2p`, vLLM 0.33's tiers too."""
    snap = parse(prefill_body)
    out = [f"process_start_time_seconds {snap.process_start_time}"]
    for s in snap.series:
        labels = f'engine="{s.engine}",model_name="{MODEL}"'
        prompt = s.prompt_tokens
        requests = s.ttft.count
        transferred = prompt - requests
        out += ["# TYPE vllm:prefix_cache_queries counter", f"vllm:prefix_cache_queries_total{{{labels}}} {prompt}",
                "# TYPE vllm:prefix_cache_hits counter", f"vllm:prefix_cache_hits_total{{{labels}}} 0.0",
                "# TYPE vllm:external_prefix_cache_queries counter", f"vllm:external_prefix_cache_queries_total{{{labels}}} {prompt}",
                "# TYPE vllm:external_prefix_cache_hits counter", f"vllm:external_prefix_cache_hits_total{{{labels}}} {transferred}",
                "# TYPE vllm:prompt_tokens counter", f"vllm:prompt_tokens_total{{{labels}}} {prompt}",
                "# TYPE vllm:prompt_tokens_by_source counter",
                f'vllm:prompt_tokens_by_source_total{{{labels},source="local_compute"}} {requests}',
                f'vllm:prompt_tokens_by_source_total{{{labels},source="local_cache_hit"}} 0.0',
                f'vllm:prompt_tokens_by_source_total{{{labels},source="external_kv_transfer"}} {transferred}',
                "# TYPE vllm:prompt_tokens_cached counter", f"vllm:prompt_tokens_cached_total{{{labels}}} {transferred}"]
        if p2p:
            out += ["# TYPE vllm:prompt_tokens_cached_by_source counter"]
            out += [f'vllm:prompt_tokens_cached_by_source_total{{{labels},source="{src}"}} {transferred if src == "p2p" else 0.0}'
                    for src in ("device", "host", "p2p", "disk", "external_unspecified")]
        out.append("# TYPE vllm:time_to_first_token_seconds histogram")
        for le, count in s.ttft.buckets:
            out.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{"+Inf" if math.isinf(le) else le}"}} {count}')
        out += [f"vllm:time_to_first_token_seconds_count{{{labels}}} {s.ttft.count}",
                f"vllm:time_to_first_token_seconds_sum{{{labels}}} {s.ttft.sum}"]
    return "\n".join(out) + "\n"


def pd_pair(duration=900, p2p=False, labels=None):
    """vllm-0 prefills, vllm-1 decodes the same requests."""
    out = []
    for line in lines(Scenario(request_rate=5.0), duration=duration, replicas=1):
        obj = json.loads(line)
        out.append(json.dumps(obj))
        decode = {"t": obj["t"], "target": "decode-0", "body": decode_body(obj["body"], p2p)}
        if labels is not None:
            decode["labels"] = labels
        out.append(json.dumps(decode))
    return out



@pytest.mark.slow
@pytest.mark.parametrize("p2p", [False, True])
def test_a_pd_pair_at_normal_operation_stays_quiet_and_the_decode_pods_transfers_are_not_hits(p2p):
    transitions, engine, warnings = backtest_with_engine(pd_pair(p2p=p2p))
    assert transitions == [] and warnings == []
    decode = engine.tracks["decode-0"]
    assert roles.role(decode.target.labels, decode.view.snapshot)[0] == roles.DECODE
    ws = decode.view.stats[MODEL]["5m"]
    # its ratios count no transfer as a hit: the local ratio is 0, the transfer is external
    assert ws.hit_ratio == 0.0 and ws.admitted_hit_ratio == 0.0 and ws.external_hit_ratio > 0.95
    prefill = engine.tracks["vllm-0"]
    assert roles.role(prefill.target.labels, prefill.view.snapshot)[0] is None
    assert prefill.view.stats[MODEL]["5m"].hit_ratio > 0.8


def test_without_the_decode_role_the_same_pod_would_page():
    """What the role prevents: the decode pod's numbers judged as a cache."""
    rec = [line for line in pd_pair() if json.loads(line)["target"] == "decode-0"]
    shape_off = pytest.MonkeyPatch()
    shape_off.setattr(roles, "DECODE_SHARE", 1.01)
    try:
        transitions, _, _ = backtest_with_engine(rec)
    finally:
        shape_off.undo()
    # its own hits stand at zero while it takes prompts: judged as a cache, that pages (the
    # transfer it receives counts as an external tier, so the low-ratio rule sees it as cached)
    assert "PrefixCacheHitsStuckAtZero" in {t["alertname"] for t in transitions if t["state"] == "firing"}


def test_a_role_label_the_user_sets_wins_over_the_shape():
    assert roles.role((("role", "decode"),), None) == (roles.DECODE, "target label role=decode")
    snap = parse(decode_body(json.loads(lines(Scenario(request_rate=5.0), duration=300, replicas=1)[-1])["body"]))
    assert roles.role((), snap)[0] == roles.DECODE
    assert roles.role((("role", "prefill"),), snap)[0] == roles.PREFILL


def test_too_few_tokens_say_nothing_about_the_role():
    text = ('vllm:prompt_tokens_total{engine="0",model_name="m"} 1000\n'
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 990\n')
    assert roles.transfer_share(parse(text))[:2] == (0.99, 1000.0)
    assert roles.role((), parse(text))[0] is None


def test_vllm_0_33_cached_tiers_are_parsed_and_p2p_counts_as_a_transfer():
    text = ('vllm:prompt_tokens_total{engine="0",model_name="m"} 100000\n'
            'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="p2p"} 95000\n'
            'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="host"} 0\n'
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 95000\n'
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 0\n'
            'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="gpu"} 1\n')
    snap = parse(text)
    (s,) = snap.series
    assert dict(s.prompt_tokens_cached_by_source) == {"p2p": 95000.0, "host": 0.0}
    assert any("unknown source 'gpu'" in w for w in snap.warnings)
    share, tokens, _ = roles.transfer_share(snap)
    assert share == pytest.approx(0.95) and tokens == 100000.0


def test_the_decode_pod_is_exported_as_such():
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from exporter.serve.collector import PrefixCacheCollector
    from exporter.config.sections import Target
    from exporter.serve.state import State
    from exporter.monitor.targetview import TargetView

    body = json.loads(lines(Scenario(request_rate=5.0), duration=300, replicas=1)[-1])["body"]
    state = State()
    state.set_targets([TargetView(target=Target("decode-0", "http://d:8000/metrics"), snapshot=parse(decode_body(body)), up=True),
                       TargetView(target=Target("prefill-0", "http://p:8000/metrics"), snapshot=parse(body), up=True)])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["1m", "5m"]))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert {s.labels["target"]: s.value for s in fams["prefixcache_decode_target"].samples} == {"decode-0": 1.0, "prefill-0": 0.0}

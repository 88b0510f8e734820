"""(a) Parse a realistic ~200 KB current-generation /metrics payload: ours against
prometheus_client's text parser extracting the same values, and ours with the memo a
poller keeps per target (its series seen in the last body: only the values are read
again). Prints the three and the ratios."""
import statistics
import time

from prometheus_client.parser import text_string_to_metric_families

from exporter.sim import simulator
from exporter.parse.vllm_metrics import parse

WANTED = {"vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:external_prefix_cache_queries",
          "vllm:external_prefix_cache_hits", "vllm:time_to_first_token_seconds", "vllm:kv_cache_usage_perc",
          "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:cache_config_info", "process_start_time_seconds"}


def payload() -> str:
    models = ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3",
              "google/gemma-2-9b-it"]
    replica = simulator.Replica("r", simulator.Scenario(), start=0.0, seed=1, generation="current", model_names=models, engines=2)
    replica.advance(900.0)
    return replica.render()


def reference(text: str) -> dict:
    """The same values through prometheus_client: (name, model, engine, le) -> value."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name not in WANTED:
            continue
        for s in fam.samples:
            out[(s.name, s.labels.get("model_name"), s.labels.get("engine"), s.labels.get("le"))] = s.value
    return out


def ours(text: str, memo: dict | None = None) -> dict:
    out = {}
    snap = parse(text, memo=memo)
    for s in snap.series:
        out[("q", s.model_name, s.engine)] = s.prefix_cache.queries
        out[("ttft", s.model_name, s.engine)] = s.ttft.buckets
    return out


def best_of(fn, text, repeat=7, number=5):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn(text)
        best = min(best, (time.perf_counter() - start) / number)
    return best


def main() -> dict:
    text = payload()
    ref = reference(text)
    snap = parse(text)
    # the two parsers agree on what they extract
    for s in snap.series:
        assert ref[("vllm:prefix_cache_queries_total", s.model_name, s.engine, None)] == s.prefix_cache.queries
        assert ref[("vllm:time_to_first_token_seconds_count", s.model_name, s.engine, None)] == s.ttft.count
    memo: dict = {}
    assert repr(parse(text, memo=memo)) == repr(snap) == repr(parse(text, memo=memo))  # filled, then used
    with_memo = lambda t: ours(t, memo)  # noqa: E731
    # the three interleaved, round by round: on a shared machine the load changes between
    # rounds, and a ratio of timings taken a moment apart is what holds
    rounds = [(best_of(ours, text, repeat=3), best_of(reference, text, repeat=3), best_of(with_memo, text, repeat=3))
              for _ in range(9)]
    ratios = sorted(ref_t / ours_t for ours_t, ref_t, _ in rounds)
    memo_ratios = sorted(ref_t / memo_t for _, ref_t, memo_t in rounds)
    gains = sorted(ours_t / memo_t for ours_t, _, memo_t in rounds)
    t_ours, t_ref, t_memo = (min(r[i] for r in rounds) for i in range(3))
    result = {"payload_bytes": len(text.encode()), "lines": text.count("\n"), "series": len(snap.series),
              "ours_ms": t_ours * 1000, "prometheus_client_ms": t_ref * 1000, "speedup": statistics.median(ratios),
              "speedup_range": (ratios[0], ratios[-1]), "ours_memo_ms": t_memo * 1000,
              "memo_speedup": statistics.median(memo_ratios), "memo_gain": statistics.median(gains)}
    print(f"parse: {result['payload_bytes'] / 1024:.0f} KiB, {result['lines']} lines, {result['series']} series | "
          f"ours {result['ours_ms']:.2f} ms | with the memo {result['ours_memo_ms']:.2f} ms | "
          f"prometheus_client {result['prometheus_client_ms']:.2f} ms | "
          f"ours {result['speedup']:.1f}x faster (median of 9 interleaved rounds, {ratios[0]:.1f}x to {ratios[-1]:.1f}x), "
          f"with the memo {result['memo_speedup']:.1f}x ({memo_ratios[0]:.1f}x to {memo_ratios[-1]:.1f}x): "
          f"the memo {result['memo_gain']:.2f}x ({gains[0]:.2f}x to {gains[-1]:.2f}x)")
    return result


if __name__ == "__main__":
    main()

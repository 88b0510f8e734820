"""Ingest cost per poll of one target as its number of models grows: 1, 100, 1,000 and
10,000 models (one engine each, with vLLM's full TTFT histogram), measured side by side
in one run. Each poll is parsed, then handed to the engine (history, windows, detectors,
change point), as the poller does; the engine part is what runs under the target's lock.

Goals: linear (the cost per model stays flat from 100 to 10,000 models) and under 50 ms
at 1,000 models. Usual size (1 model) x10 and x100 and more are all on one line."""
import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.sidecar import GC_THRESHOLDS  # noqa: E402
from exporter.config.sections import load  # noqa: E402
from exporter.monitor.engine import Engine  # noqa: E402
from exporter.parse.vllm_metrics import parse  # noqa: E402

BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


def body(models: int, poll: int) -> str:
    """A current-generation /metrics text: per model, the prefix-cache pair, the TTFT
    histogram, prompt tokens, preemptions and KV usage; counters grow with `poll`."""
    out = []
    for m in range(models):
        labels = f'engine="0",model_name="model-{m}"'
        q = 10000.0 * poll + m
        out.append(f"vllm:prefix_cache_queries_total{{{labels}}} {q}")
        out.append(f"vllm:prefix_cache_hits_total{{{labels}}} {q * 0.8}")
        out.append(f"vllm:prompt_tokens_total{{{labels}}} {q}")
        out.append(f"vllm:num_preemptions_total{{{labels}}} 0.0")
        out.append(f"vllm:kv_cache_usage_perc{{{labels}}} 0.4")
        count = 10.0 * poll
        for i, le in enumerate(BOUNDS):
            out.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{le}"}} {count * min(1.0, (i + 1) / 12)}')
        out.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {count}')
        out.append(f"vllm:time_to_first_token_seconds_count{{{labels}}} {count}")
        out.append(f"vllm:time_to_first_token_seconds_sum{{{labels}}} {count * 0.2}")
    return "\n".join(out) + "\n"


def bench(models: int, polls: int, measured: int, thresholds: tuple) -> dict:
    gc.collect()
    gc.set_threshold(*thresholds)
    cfg = load({"targets": [{"name": "t", "url": "http://127.0.0.1:1/metrics"}],
                "global": {"model_limit": 0, "series_limit": 0}})
    engine = Engine(cfg)
    parse_ms, ingest_ms = [], []
    for p in range(polls):
        text = body(models, p + 1)
        t0 = time.perf_counter()
        snap = parse(text)
        t1 = time.perf_counter()
        engine.ingest("t", 1000.0 + 5.0 * p, snap)
        t2 = time.perf_counter()
        engine.evaluate(1000.0 + 5.0 * p)
        if p >= polls - measured:
            parse_ms.append((t1 - t0) * 1000)
            ingest_ms.append((t2 - t1) * 1000)
    assert len(engine.tracks["t"].view.stats) == models
    del engine
    gc.set_threshold(*DEFAULT_GC)
    return {"models": models, "body_kib": len(text) / 1024, "parse_ms": statistics.median(parse_ms),
            "ingest_ms": statistics.median(ingest_ms)}


DEFAULT_GC = gc.get_threshold()


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1,100,1000,10000")
    p.add_argument("--polls", type=int, default=24, help="polls per size; the last half are timed")
    args = p.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",")]
    print("ingest: one target; median per poll: parse | engine ingest (history, windows, detectors), with the sidecar's GC "
          f"thresholds {GC_THRESHOLDS} and, side by side, Python's default {DEFAULT_GC}")
    rows = []
    ref = {}
    for n in sizes:
        for label, thresholds in (("sidecar GC", GC_THRESHOLDS), ("default GC", DEFAULT_GC)):
            r = bench(n, args.polls, args.polls // 2, thresholds)
            r["gc"] = label
            rows.append(r)
            per_model = r["ingest_ms"] * 1000 / n
            if n >= 100 and label not in ref:
                ref[label] = per_model
            ratio = f"{per_model / ref[label]:.2f}x its 100-model cost per model" if label in ref else ""
            print(f"ingest: {n:>6} models, body {r['body_kib']:7.0f} KiB | parse {r['parse_ms']:8.2f} ms | "
                  f"ingest ({label}) {r['ingest_ms']:8.2f} ms, {per_model:6.1f} us per model {ratio}")
    at_1000 = next((r for r in rows if r["models"] == 1000 and r["gc"] == "sidecar GC"), None)
    if at_1000:
        print(f"ingest: at 1,000 models: {at_1000['ingest_ms']:.1f} ms a poll")
    return rows


if __name__ == "__main__":
    main()

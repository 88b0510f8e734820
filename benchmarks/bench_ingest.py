"""Ingest cost per poll of one target as its number of models grows: 1, 100, 1,000 and
10,000 models (one engine each, with vLLM's full TTFT histogram), measured side by side
in one run. Each poll is parsed, then handed to the engine (history, windows, detectors,
change point), as the poller does; the engine part is what runs under the target's lock.

Goals: linear (the cost per model stays flat from 100 to 10,000 models) and under 50 ms
at 1,000 models. Usual size (1 model) x10 and x100 and more are all on one line.

With --old REV, the code of REV is measured beside this checkout's, each size and code in
a fresh process of its own, the two codes taking turns (--repeat N rounds, the order
swapped each round), so that both see the same load; each code's ratios are its own."""
import argparse
import gc
import math
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# --code DIR: measure the exporter package of DIR (an old revision's) instead of this checkout's
_code = sys.argv[sys.argv.index("--code") + 1] if "--code" in sys.argv[:-1] else str(HERE.parent)
sys.path.insert(0, _code)
sys.path.insert(1, str(HERE))

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
    """One target of `models` models polled `polls` times (the last `measured` timed),
    again with a fresh engine until 10,000 model-polls (or 240 polls) were timed: a 100-model
    poll allocates so little that its share of the collector's work shows only over many
    polls, which one run of 12 leaves out of its median (and mostly out of its mean)."""
    parse_ms: list[float] = []
    ingest_ms: list[float] = []
    text = ""
    while not ingest_ms or (len(ingest_ms) * models < 10_000 and len(ingest_ms) < 240):
        text = _run(models, polls, measured, thresholds, parse_ms, ingest_ms)
    return {"models": models, "body_kib": len(text) / 1024, "parse_ms": statistics.median(parse_ms),
            "ingest_ms": statistics.median(ingest_ms), "ingest_mean_ms": statistics.fmean(ingest_ms),
            "timed_polls": len(ingest_ms)}


def _run(models: int, polls: int, measured: int, thresholds: tuple, parse_ms: list, ingest_ms: list) -> str:
    gc.collect()
    gc.set_threshold(*thresholds)
    cfg = load({"targets": [{"name": "t", "url": "http://127.0.0.1:1/metrics"}],
                "global": {"model_limit": 0, "series_limit": 0}})
    engine = Engine(cfg)
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
    return text


DEFAULT_GC = gc.get_threshold()


def _one(n: int, polls: int, gcs: str) -> list[dict]:
    out = []
    for label, thresholds in (("sidecar GC", GC_THRESHOLDS), ("default GC", DEFAULT_GC)):
        if gcs in ("both", label.split()[0]):
            r = bench(n, polls, polls // 2, thresholds)
            r["gc"] = label
            out.append(r)
    return out


def this_and_old_interleaved(args, sizes: list[int]) -> None:
    """Each (round, size, code) in a fresh process, this checkout and `args.old` taking turns."""
    from bench_discovery import old_checkout

    codes = {"new": str(HERE.parent), f"old {args.old}": str(old_checkout(args.old))}
    rows: dict[str, list[dict]] = {c: [] for c in codes}
    try:
        for rnd in range(args.repeat):
            order = list(codes) if rnd % 2 == 0 else list(reversed(codes))
            for n in sizes:
                for code in order:
                    cmd = [sys.executable, __file__, "--code", codes[code], "--sizes", str(n), "--polls", str(args.polls),
                           "--gc", args.gc, "--json"]
                    env = {**os.environ, "PYTHONPATH": codes[code]}
                    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, timeout=3600)
                    load = os.getloadavg()[0]
                    for r in json.loads(done.stdout.splitlines()[-1]):
                        r["round"], r["load"] = rnd + 1, load
                        rows[code].append(r)
                        print(f"ingest: round {r['round']} {code:>12}: {n:>6} models | parse {r['parse_ms']:8.2f} ms | "
                              f"ingest ({r['gc']}) {r['ingest_ms']:8.2f} ms, {r['ingest_ms'] * 1000 / n:6.1f} us per model "
                              f"(mean of {r.get('timed_polls', 0)} polls: {r.get('ingest_mean_ms', math.nan) * 1000 / n:6.1f} us) "
                              f"(load average {load:.1f})", flush=True)
    finally:
        shutil.rmtree(codes[f"old {args.old}"], ignore_errors=True)
    base = min(sizes)
    for code, rs in rows.items():
        for rnd in range(1, args.repeat + 1):
            for label in sorted({r["gc"] for r in rs}):
                for stat in ("ingest_ms", "ingest_mean_ms"):
                    per = {r["models"]: r.get(stat, math.nan) * 1000 / r["models"] for r in rs if r["round"] == rnd and r["gc"] == label}
                    ratios = ", ".join(f"{n}: {per[n]:.1f} us ({per[n] / per[base]:.2f}x)" for n in sizes)
                    print(f"ingest: round {rnd} {code} ({label}) per model, {'median' if stat == 'ingest_ms' else 'mean'}: {ratios}")


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1,100,1000,10000")
    p.add_argument("--polls", type=int, default=24, help="polls per size; the last half are timed")
    p.add_argument("--gc", choices=("both", "sidecar", "default"), default="both", help="which GC thresholds to measure")
    p.add_argument("--old", default="", help="a git revision whose code is measured beside this checkout's, taking turns")
    p.add_argument("--repeat", type=int, default=2, help="with --old: rounds of every size and both codes")
    p.add_argument("--code", default="", help=argparse.SUPPRESS)  # read at import: the package measured
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one process of --old's: rows as JSON
    args = p.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",")]
    if args.json:
        rows = [r for n in sizes for r in _one(n, args.polls, args.gc)]
        print(json.dumps(rows))
        return rows
    if args.old:
        this_and_old_interleaved(args, sizes)
        return []
    print("ingest: one target; median (and mean) per poll: parse | engine ingest (history, windows, detectors), with the sidecar's GC "
          f"thresholds {GC_THRESHOLDS} and, side by side, Python's default {DEFAULT_GC}")
    rows = []
    ref = {}
    for n in sizes:
        for r in _one(n, args.polls, args.gc):
            label = r["gc"]
            rows.append(r)
            per_model, mean_per_model = r["ingest_ms"] * 1000 / n, r["ingest_mean_ms"] * 1000 / n
            if n >= 100 and label not in ref:
                ref[label] = (per_model, mean_per_model)
            ratio = (f"{per_model / ref[label][0]:.2f}x its 100-model cost per model (mean: {mean_per_model:.1f} us, "
                     f"{mean_per_model / ref[label][1]:.2f}x)" if label in ref else f"(mean: {mean_per_model:.1f} us)")
            print(f"ingest: {n:>6} models, body {r['body_kib']:7.0f} KiB | parse {r['parse_ms']:8.2f} ms | "
                  f"ingest ({label}) {r['ingest_ms']:8.2f} ms, {per_model:6.1f} us per model (median of {r['timed_polls']} polls) {ratio}")
    at_1000 = next((r for r in rows if r["models"] == 1000 and r["gc"] == "sidecar GC"), None)
    if at_1000:
        print(f"ingest: at 1,000 models: {at_1000['ingest_ms']:.1f} ms a poll")
    return rows


if __name__ == "__main__":
    main()

"""`whatif` speed: prompt tokens analysed per second for one routing policy, on a sample
of 100,000 requests of ~3,000 tokens (a 2,000-token system prompt, one of 50, and 1,000
tokens of conversation), 6 replicas round robin with 20,000 blocks each (LRU).

The analysis per request is what `whatif` does for every policy: the chained block
hashes of the prompt, the routing decision and the replica's pool (look-up, insert,
evict). Reading the sample from JSON is measured apart: it is the same work for any
analysis. Goal: at least 5 million tokens a second on one core.

Then a real trace: Mooncake's FAST'25 conversation trace (12,031 requests, block-hash
format), replayed whole as `whatif TRACE --block-size 512 --replicas 4 --cache-tokens
3000000 --capacity-curve` does (3M tokens a replica is the local cache of the paper's
Figure 9), and once through a single unlimited cache, the paper's "cache ratio". Goal:
the whole trace in under 10 s. The trace is not in the repository (3 MB) and this
script does not download it; it reads --trace, else $WHATIF_TRACE, else
~/.cache/vllm-prefix-cache-exporter/mooncake/conversation_trace.jsonl. To get it:

  mkdir -p ~/.cache/vllm-prefix-cache-exporter/mooncake
  curl -fL -o ~/.cache/vllm-prefix-cache-exporter/mooncake/conversation_trace.jsonl \
    https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/conversation_trace.jsonl

(Apache-2.0; tests/fixtures/mooncake/SOURCES.md names it). The script checks the file's
git blob id, so the figures are known to be of that file.

Then a trace in the Qwen-Bailian format (Alibaba's, github.com/alibaba-edu/qwen-bailian-usagetraces-anon;
its files are Git LFS, so none is read here): 100,000 requests made by `bailian_trace` below,
and `whatif TRACE --replicas 4 --json` timed on them, the command itself in a process of its own
(every routing policy but observed, prefill at the command's default rate, prefix groups), then
with `--svg` (the capacity curve). Goal: the `--json` run in under 30 s. `--write-bailian FILE` writes that trace (to run the command on it),
`--write-bailian-fixture FILE` the small one in tests/fixtures/bailian/."""
import argparse
import hashlib
import heapq
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.tools import cachemodel, capacitycurve, whatif  # noqa: E402
from exporter.tools.whatif import read_requests  # noqa: E402

TRACE_BLOB = "5a371794b81d7fc7487ec8a02a2c631bcc7fbdf8"  # FAST25-release/traces/conversation_trace.jsonl
PAPER_RATIO = 0.40  # the FAST'25 paper's Table 2, conversation workload
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-prefix-cache-exporter"


def sample(n: int, seed: int = 1):
    rng = random.Random(seed)
    systems = [list(range(1_000_000 * k, 1_000_000 * k + 2000)) for k in range(50)]
    for i in range(n):
        tokens = systems[rng.randrange(50)] + list(range(100_000_000 + i * 1000, 100_000_000 + i * 1000 + 1000))
        yield i, f"conv-{rng.randrange(5000)}", tokens


def bench(n: int, replicas: int, cache_blocks: int, block_size: int = 16) -> dict:
    pools = [cachemodel.BlockPool(cache_blocks) for _ in range(replicas)]
    rng = random.Random(0)
    hits = total = 0
    start = time.perf_counter()
    for i, session, tokens in sample(n):
        hashes = cachemodel.block_hashes(tokens, block_size)
        pool = pools[cachemodel.route(cachemodel.ROUND_ROBIN, i, replicas, session, hashes, rng)]
        hits += pool.serve(hashes, len(tokens), block_size)
        total += len(tokens)
    seconds = time.perf_counter() - start
    return {"requests": n, "tokens": total, "seconds": seconds, "tokens_per_second": total / seconds, "hit_ratio": hits / total}


def bench_reading(n: int) -> dict:
    lines = [json.dumps({"t": i, "session": s, "prompt_token_ids": tokens}) for i, s, tokens in sample(n)]
    start = time.perf_counter()
    count = sum(1 for _ in read_requests(lines))
    seconds = time.perf_counter() - start
    tokens = n * 3000
    return {"requests": count, "seconds": seconds, "tokens_per_second": tokens / seconds}


def trace_path(given: str | None) -> Path:
    return Path(given or os.environ.get("WHATIF_TRACE") or CACHE_DIR / "mooncake" / "conversation_trace.jsonl")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def per_request_average(requests, block_size: int) -> float:
    """The paper's way of stating a workload's cache ratio: each request's own ratio,
    then their mean (one cache, unlimited, counted as the model counts a hit)."""
    seen, ratios = set(), []
    for r in sorted(requests, key=lambda r: r.t):
        ids = r.hash_ids[: r.input_length // block_size]
        run = 0
        while run < len(ids) and ids[run] in seen:
            run += 1
        ratios.append(min(run, (r.input_length - 1) // block_size) * block_size / r.input_length)
        seen.update(ids)
    return sum(ratios) / len(ratios)


def bench_trace(path: Path, svg: str | None = None) -> dict | None:
    if not path.is_file():
        print(f"whatif on Mooncake's conversation trace: skipped, {path} is missing (see this script's docstring to get it)")
        return None
    data = path.read_bytes()
    if git_blob_id(data) != TRACE_BLOB:
        print(f"whatif on a trace: {path} is not Mooncake's conversation trace at the pinned commit; the figures are of this file")
    # CPU time beside wall time: on a shared machine the wall clock counts other work too
    start, cpu_start = time.perf_counter(), time.process_time()
    requests = [r for r in read_requests(data.decode("utf-8").splitlines()) if isinstance(r, whatif.Request)]
    read = time.process_time() - cpu_start
    policies = (cachemodel.ROUND_ROBIN, cachemodel.RANDOM, cachemodel.PREFIX_HASH)
    a = whatif.analyze(requests, 4, policies, None, 512, cache_tokens=3_000_000, curve=True)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    one = whatif.analyze(requests, 1, (cachemodel.ROUND_ROBIN,), None, 512, cache_tokens=3_000_000, curve=True)
    averaged = per_request_average(requests, 512)
    at_3m = one.curve["policies"][cachemodel.ROUND_ROBIN][one.curve["sizes_tokens"].index(3_162_278)]
    print(f"whatif on Mooncake's conversation trace: {a.requests} requests, {a.prompt_tokens / 1e6:.1f}M prompt tokens, "
          f"512 tokens a hash id | whole analysis (reading, 4 replicas x 3M tokens, 3 policies, capacity curve) "
          f"{cpu:.1f} s of CPU ({read:.1f} s reading; {seconds:.1f} s wall): {a.prompt_tokens / cpu / 1e6:.0f}M tokens/s "
          f"(goal: the trace in < 10 s)")
    print(f"  one unlimited cache: {a.ceiling:.1%} of prompt tokens hit, beside the paper's {PAPER_RATIO:.0%} (Table 2). "
          f"The paper averages each request's own ratio ({averaged:.1%} here, counted that way), so a short request that "
          f"reuses most of its prompt weighs as much as a long one; whatif weights by tokens, as vLLM's hit and query "
          f"counters do, and long prompts reuse a smaller share here.")
    print(f"  one cache of 3.16M tokens: {at_3m:.1%}, {at_3m / a.ceiling:.0%} of the unlimited ratio "
          f"(the paper's Figure 9: a 3M-token local cache stays under 50% of the maximum in most workloads)")
    for line in capacitycurve.report_lines(a.curve):
        print("  " + line)
    if svg:
        Path(svg).write_text(capacitycurve.svg(a.curve, "Mooncake FAST'25 conversation trace, 4 replicas"), encoding="utf-8")
    return {"requests": a.requests, "prompt_tokens": a.prompt_tokens, "seconds": seconds, "cpu_seconds": cpu, "read_cpu_seconds": read,
            "tokens_per_second": a.prompt_tokens / cpu, "unlimited_ratio": a.ceiling, "per_request_average": averaged,
            "paper_ratio": PAPER_RATIO, "policies": a.policies, "curve": a.curve}


# --- a synthetic trace in the Qwen-Bailian format ----------------------------------------------------
BAILIAN_BLOCK = 16
FIXTURE = dict(n=300, seed=33, roots_per_s=1.5, think_s=15.0, bursts=1, tenants=12, system_blocks=(4, 40))  # tests/fixtures/bailian/SOURCES.md
BENCH = dict(n=100_000, seed=1, roots_per_s=7.0, think_s=60.0, bursts=3, tenants=50, system_blocks=(8, 120))
TYPES = (("text", 0.70), ("search", 0.15), ("image", 0.10), ("file", 0.05))


class _Prompt:
    """A prompt as the format sees it: its blocks' ids, each the remapped hash of one block's
    content (a block's content: the pieces of segments it holds), the partial last block too."""

    def __init__(self, ids: dict):
        self.ids, self.full, self.tail, self.tail_len, self.length = ids, [], [], 0, 0

    def copy(self) -> "_Prompt":
        other = _Prompt(self.ids)
        other.full, other.tail, other.tail_len, other.length = list(self.full), list(self.tail), self.tail_len, self.length
        return other

    def extend(self, segment, length: int) -> "_Prompt":
        pos = 0
        while pos < length:
            take = min(BAILIAN_BLOCK - self.tail_len, length - pos)
            self.tail.append((segment, pos, pos + take))
            self.tail_len += take
            pos += take
            if self.tail_len == BAILIAN_BLOCK:
                self.full.append(self.ids.setdefault(tuple(self.tail), len(self.ids)))
                self.tail, self.tail_len = [], 0
        self.length += length
        return self

    def hash_ids(self) -> list[int]:
        return self.full + ([self.ids.setdefault(tuple(self.tail), len(self.ids))] if self.tail else [])


def bailian_trace(n: int, seed: int, roots_per_s: float, think_s: float, bursts: int, tenants: int, system_blocks: tuple[int, int]):
    """`n` lines in the Qwen-Bailian format, in timestamp order: conversations that start at
    `roots_per_s` (a Poisson process), each with one of `tenants` system prompts (Zipf
    popularity, `system_blocks` blocks of 16 tokens, low and high), and go on with another turn after a
    think time (mean `think_s`) with probability 0.6, a turn's prompt being the turn
    before, its answer and a new message; search requests open their message with the same
    64-token header, image and file requests carry 300-1,500 tokens of their own. A block's
    id depends on its content only, as the format's per-block hashes do, so the search header
    has the same ids behind every system prompt: a replay must chain them. Plus `bursts`
    stampedes: 30 conversations with a new 2,000-token system prompt within 0.2 s."""
    rng = random.Random(seed)
    ids: dict = {}
    weights = [1 / (k + 1) ** 1.1 for k in range(tenants)]
    systems = [_Prompt(ids).extend(("system", k), BAILIAN_BLOCK * rng.randint(*system_blocks)) for k in range(tenants)]
    span = n / (roots_per_s / 0.4)  # a conversation has 1 / (1 - 0.6) turns on average
    events, seq, unique = [], 0, 0
    t = 0.0
    while t < span * 1.2:
        t += rng.expovariate(roots_per_s)
        events.append((t, seq, None, rng.choices(range(tenants), weights)[0]))
        seq += 1
    for b in range(bursts):
        start = span * (b + 0.5) / (bursts + 1)
        systems.append(_Prompt(ids).extend(("campaign", b), 2000))
        for _ in range(30):
            events.append((start + rng.uniform(0, 0.2), seq, None, len(systems) - 1))
            seq += 1
    heapq.heapify(events)
    chat_ids = rng.sample(range(1, 10 * n + 100), n)
    for count in range(n):
        t, _, parent, tenant = heapq.heappop(events)
        kind = rng.choices([k for k, _ in TYPES], [w for _, w in TYPES])[0]
        prompt = systems[tenant].copy() if parent is None else parent["prompt"]
        unique += 1
        if kind == "search":
            prompt.extend(("search-header",), 64)
        if kind in ("image", "file"):
            prompt.extend(("attachment", unique), rng.randint(300, 1500))
        prompt.extend(("message", unique), max(5, min(3000, int(rng.lognormvariate(4.2, 1.0)))))
        output = max(1, min(4000, int(rng.lognormvariate(5.3, 0.8))))
        turn = 1 if parent is None else parent["turn"] + 1
        yield {"chat_id": chat_ids[count], "parent_chat_id": -1 if parent is None else parent["chat_id"], "timestamp": round(t, 3),
               "input_length": prompt.length, "output_length": output, "type": kind, "turn": turn, "hash_ids": prompt.hash_ids()}
        if turn < 12 and prompt.length < 30_000 and rng.random() < 0.6:
            answered = prompt.copy().extend(("answer", unique), output)
            later = t + output / 50 + rng.expovariate(1 / think_s)  # the answer streams at 50 tokens/s, then the user thinks
            heapq.heappush(events, (later, seq, {"prompt": answered, "turn": turn, "chat_id": chat_ids[count]}, tenant))
            seq += 1


def write_bailian(path: str, preset: dict) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for line in bailian_trace(**preset):
            out.write(json.dumps(line) + "\n")


def bench_bailian(preset: dict = BENCH) -> dict:
    """`whatif TRACE --replicas 4 --json`, the command itself in a process of its own (its
    reading, its defaults: every policy but observed, prefill at the default rate, prefix
    groups), then again with `--svg`, on the generated trace written to a temporary file."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}  # the checkout's code, whatever this Python has installed
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "bailian.jsonl"
        write_bailian(str(trace), preset)

        def timed(*extra: str) -> tuple[float, float, str]:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "exporter", "whatif", str(trace), "--replicas", "4", *extra],
                                  cwd=root, env=env, capture_output=True, text=True, timeout=1800, check=True)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout

        seconds, cpu, out = timed("--json")
        curve_seconds, curve_cpu, _ = timed("--json", "--svg", str(Path(tmp) / "curve.svg"))
    a = json.loads(out)
    losses = {l["kind"]: l["points"] for l in a["losses"]}
    print(f"whatif on a synthetic Qwen-Bailian trace: {a['requests']} requests, {a['prompt_tokens'] / 1e6:.0f}M prompt tokens, 16 tokens "
          f"a hash id | `whatif TRACE --replicas 4 --json` ({len(a['policies'])} policies, prefill at "
          f"{a['prefill_tokens_per_s']:g} tokens/s, prefix groups): {seconds:.1f} s wall, {cpu:.1f} s of CPU (goal: < 30 s) | "
          f"with --svg (the capacity curve): {curve_seconds:.1f} s wall, {curve_cpu:.1f} s of CPU")
    print(f"  ceiling {a['ceiling']:.1%}; " + ", ".join(f"{p} {v:.1%}" for p, v in a["policies"].items())
          + f"; stampede {losses['stampede']} points under {a['policy']}")
    return {"requests": a["requests"], "prompt_tokens": a["prompt_tokens"], "seconds": seconds, "cpu_seconds": cpu,
            "curve_seconds": curve_seconds, "curve_cpu_seconds": curve_cpu, "ceiling": a["ceiling"], "policies": a["policies"],
            "losses": a["losses"]}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--trace", default=None, help="a block-hash trace (default: $WHATIF_TRACE, else the package cache)")
    p.add_argument("--svg", default=None, help="draw the trace's capacity curve into this file")
    p.add_argument("--write-bailian", default=None, metavar="FILE", help="write the 100,000-request Qwen-Bailian-format trace and stop")
    p.add_argument("--write-bailian-fixture", default=None, metavar="FILE", help="write the tests' small Qwen-Bailian-format trace and stop")
    p.add_argument("--bailian-only", action="store_true", help="time only the Qwen-Bailian-format trace")
    args = p.parse_args(argv)
    if args.write_bailian or args.write_bailian_fixture:
        write_bailian(args.write_bailian or args.write_bailian_fixture, BENCH if args.write_bailian else FIXTURE)
        return {}
    if args.bailian_only:
        return {"bailian": bench_bailian()}
    r = bench(args.requests, 6, 20_000)
    read = bench_reading(min(args.requests, 5_000))
    print(f"whatif: {r['requests']} requests, {r['tokens'] / 1e6:.0f}M prompt tokens, round robin over 6 replicas x 20000 blocks "
          f"(hit ratio {r['hit_ratio']:.1%}) | analysis {r['seconds']:.1f} s: {r['tokens_per_second'] / 1e6:.1f}M tokens/s on one core "
          f"(goal >= 5M) | reading JSON lines apart: {read['tokens_per_second'] / 1e6:.1f}M tokens/s")
    trace = bench_trace(trace_path(args.trace), args.svg)
    return {"analysis": r, "reading": read, "trace": trace, "bailian": bench_bailian()}


if __name__ == "__main__":
    main()

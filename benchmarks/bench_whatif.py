"""`whatif` speed: prompt tokens analysed per second for one routing policy, on a sample
of 100,000 requests of ~3,000 tokens (a 2,000-token system prompt, one of 50, and 1,000
tokens of conversation), 6 replicas round robin with 20,000 blocks each (LRU).

The analysis per request is what `whatif` does for every policy: the chained block
hashes of the prompt, the routing decision and the replica's pool (look-up, insert,
evict). Reading the sample from JSON is measured apart: it is the same work for any
analysis. Goal: at least 5 million tokens a second on one core."""
import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter import cachemodel  # noqa: E402
from exporter.whatif import read_requests  # noqa: E402


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


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=100_000)
    args = p.parse_args(argv)
    r = bench(args.requests, 6, 20_000)
    read = bench_reading(min(args.requests, 5_000))
    print(f"whatif: {r['requests']} requests, {r['tokens'] / 1e6:.0f}M prompt tokens, round robin over 6 replicas x 20000 blocks "
          f"(hit ratio {r['hit_ratio']:.1%}) | analysis {r['seconds']:.1f} s: {r['tokens_per_second'] / 1e6:.1f}M tokens/s on one core "
          f"(goal >= 5M) | reading JSON lines apart: {read['tokens_per_second'] / 1e6:.1f}M tokens/s")
    return {"analysis": r, "reading": read}


if __name__ == "__main__":
    main()

"""vLLM's block-hash prefix cache, against hand-computed cases."""
import pytest

from exporter.tools import cachemodel
from exporter.tools.cachemodel import BlockPool, block_hashes, replay

BS = 16


def serve(pool, tokens, lora=None, salt=None):
    return pool.serve(block_hashes(tokens, BS, lora, salt), len(tokens), BS)


@pytest.mark.parametrize("n, second_hit", [
    pytest.param(32, 16, id="two-full-blocks-last-token-always-computed"),
    pytest.param(33, 32, id="two-full-blocks-and-one-token"),
    pytest.param(15, 0, id="shorter-than-a-block"),
    pytest.param(48, 32, id="three-blocks"),
])
def test_a_repeated_prompt_hits_its_full_blocks_but_never_the_last_token(n, second_hit):
    pool = BlockPool()
    tokens = list(range(n))
    assert serve(pool, tokens) == 0
    assert serve(pool, tokens) == second_hit


def test_a_divergence_inside_a_block_loses_that_block_and_every_one_after():
    pool = BlockPool()
    a = list(range(64))
    b = a[:20] + [999] + a[21:]  # differs in block 1 (tokens 16-31)
    serve(pool, a)
    assert serve(pool, b) == 16
    c = a[:40] + [999] + a[41:]  # differs in block 2
    assert serve(pool, c) == 32


def test_cache_salt_and_lora_isolate_tenants():
    pool = BlockPool()
    tokens = list(range(64))
    serve(pool, tokens, salt="tenant-a")
    assert serve(pool, tokens, salt="tenant-b") == 0
    assert serve(pool, tokens, salt="tenant-a") == 48
    assert serve(pool, tokens, lora="sql") == 0
    assert serve(pool, tokens) == 0  # no salt, no adapter: a third namespace
    assert serve(pool, tokens) == 48


def test_lru_evicts_the_least_recently_used_blocks_first():
    pool = BlockPool(capacity=4)
    a, b, c = list(range(0, 33)), list(range(100, 133)), list(range(200, 233))  # 2 full blocks each
    serve(pool, a)
    serve(pool, b)  # pool: a0 a1 b0 b1
    assert serve(pool, a) == 32  # a is touched: b is now the oldest
    serve(pool, c)  # evicts b0 b1
    assert len(pool) == 4
    assert serve(pool, a) == 32
    assert serve(pool, b) == 0


def multi_turn(sessions=13, turns=5, system=64, turn_tokens=32):
    """Each session: a shared system prompt, then turns that extend the conversation,
    interleaved: every session's turn 0, then every session's turn 1, ..."""
    requests = []
    for turn in range(turns):
        for s in range(sessions):
            tokens = list(range(system))
            for k in range(turn + 1):
                tokens += [10_000 + s * 1000 + k * 50 + i for i in range(turn_tokens)]
            requests.append((block_hashes(tokens, BS), len(tokens), f"s{s}", None))
    return requests


def test_six_replicas_round_robin_vs_session_affinity():
    """13 sessions x 5 turns; turn t has 64 + 32 (t + 1) tokens."""
    import zlib
    requests = multi_turn()
    one_hits, total = replay(requests, BS, cachemodel.ROUND_ROBIN, 1, None)
    rr_hits, _ = replay(requests, BS, cachemodel.ROUND_ROBIN, 6, None)
    sticky_hits, _ = replay(requests, BS, cachemodel.SESSION, 6, None)
    assert total == 13 * sum(64 + 32 * (t + 1) for t in range(5))
    # one replica: the very first request computes all; the other 12 first turns hit the
    # system prompt; every later turn hits the whole turn before (64 + 32 t tokens)
    assert one_hits == 12 * 64 + 13 * sum(64 + 32 * t for t in range(1, 5))
    # round robin: request i = 13 t + s goes to replica (t + s) mod 6, never the one that
    # served the session's previous turn, so a request hits the system prompt only, and
    # not even that as the first request on each of the 6 replicas
    assert rr_hits == (65 - 6) * 64
    # affinity: a session stays on crc32(name) mod 6; its first turn hits the system
    # prompt unless it is the first session on its replica, later turns hit the turn before
    homes = [zlib.crc32(f"s{s}".encode()) % 6 for s in range(13)]
    firsts = len(set(homes))
    assert sticky_hits == (13 - firsts) * 64 + 13 * sum(64 + 32 * t for t in range(1, 5))
    assert rr_hits < sticky_hits < one_hits


def test_routing_is_deterministic_and_observed_needs_replicas():
    requests = multi_turn()
    assert replay(requests, BS, cachemodel.RANDOM, 6, None) == replay(requests, BS, cachemodel.RANDOM, 6, None)
    assert replay(requests, BS, cachemodel.PREFIX_HASH, 6, None)[0] > 0
    with pytest.raises(ValueError):
        replay(requests, BS, cachemodel.OBSERVED, 2, None)


def test_a_request_gives_its_blocks_back_tail_first_as_vllm_frees_them():
    """vLLM's KV-cache manager frees a finished request's blocks in reverse order, so
    eviction takes a prompt's last block before its first and the rest still hits."""
    pool = BlockPool(capacity=3)
    a, b, c = list(range(0, 33)), list(range(100, 117)), list(range(200, 217))  # 2, 1, 1 full blocks
    serve(pool, a)
    serve(pool, b)  # full: a0 a1 b0
    serve(pool, c)  # evicts a1, a's tail, not a0
    assert serve(pool, a) == 16


def test_a_block_cached_behind_a_miss_counts_as_used_by_that_request():
    """Hash ids from a trace need not chain: a block held behind a missing one is
    computed again by the request and is as recent as the request's other blocks."""
    pool = BlockPool(capacity=3)
    pool.serve([1, 2], 33, BS)
    pool.serve([3], 17, BS)
    assert pool.serve([9, 2], 33, BS) == 0  # 2 is held, but 9 before it is not
    pool.serve([4], 17, BS)  # evicts 3, the least recently used, not 2
    assert pool.serve([2], 17, BS) == 16


@pytest.mark.parametrize("policy, replicas", [
    pytest.param(cachemodel.ROUND_ROBIN, 1, id="one-replica"),
    pytest.param(cachemodel.ROUND_ROBIN, 3, id="round-robin"),
    pytest.param(cachemodel.RANDOM, 3, id="random"),
    pytest.param(cachemodel.SESSION, 3, id="session"),
    pytest.param(cachemodel.PREFIX_HASH, 3, id="prefix-hash"),
])
def test_one_pass_gives_every_capacity_the_hits_of_replaying_it(policy, replicas):
    requests = multi_turn(turns=6)
    # some requests only warm the caches, as with --measure-from
    requests = [r + (i % 7 != 0,) for i, r in enumerate(requests)]
    capacities = [0, 1, 3, 5, 8, 13, 21, 34, 55, 89, None]
    assert cachemodel.chained(requests)
    one_pass = cachemodel.hits_by_capacity(requests, BS, policy, replicas, capacities)
    assert one_pass == [replay(requests, BS, policy, replicas, c)[0] for c in capacities]
    assert one_pass == sorted(one_pass) and one_pass[0] == 0 < one_pass[-1]


def test_hash_ids_that_do_not_chain_are_told_apart():
    assert cachemodel.chained([([1, 2, 3], 64, None, None), ([1, 2, 4], 64, None, None)])
    assert not cachemodel.chained([([1, 2, 3], 64, None, None), ([5, 2, 3], 64, None, None)])


# --- prefill time: a block is reusable when the prefill that computes it ends ----------------------
def burst(count=30, prefix=2000, own=50, within=0.1):
    """`count` requests of one new `prefix`-token prompt start, each with `own` tokens of its
    own, arriving evenly within `within` seconds."""
    shared = list(range(prefix))
    requests, arrivals = [], []
    for i in range(count):
        tokens = shared + [1_000_000 + i * own + k for k in range(own)]
        requests.append((block_hashes(tokens, BS), len(tokens), None, None))
        arrivals.append(within * i / count)
    return requests, arrivals


def test_a_burst_within_one_prefill_misses_the_new_prefix_and_a_later_request_reuses_it():
    requests, arrivals = burst()
    rate = 8000.0
    first_ends = (2000 + 50) / rate  # the first request computes all its 2,050 tokens
    assert arrivals[-1] < first_ends
    after = list(range(2000)) + list(range(5_000_000, 5_000_050))
    requests.append((block_hashes(after, BS), len(after), None, None))
    arrivals.append(first_ends + 0.01)
    timed = cachemodel.replay_each(requests, BS, cachemodel.ROUND_ROBIN, 1, None, arrivals=arrivals, prefill_tokens_per_s=rate)
    instant = cachemodel.replay_each(requests, BS, cachemodel.ROUND_ROBIN, 1, None)
    assert timed == [0] * 30 + [2000]  # the prefix's 125 blocks, once the first prefill has ended
    assert instant == [0] + [2000] * 30
    assert cachemodel.replay_each(requests, BS, cachemodel.ROUND_ROBIN, 1, None, arrivals=arrivals) == instant


def test_a_request_arriving_as_a_prefill_ends_reuses_its_blocks():
    tokens = list(range(160 + 1))  # 10 full blocks and one token
    request = (block_hashes(tokens, BS), len(tokens), None, None)
    ends = len(tokens) / 1000.0
    for at, hit in ((ends - 1e-6, 0), (ends, 160)):
        assert cachemodel.replay_each([request, request], BS, cachemodel.ROUND_ROBIN, 1, None,
                                      arrivals=[0.0, at], prefill_tokens_per_s=1000.0) == [0, hit]


def test_a_hit_shortens_the_prefill_its_blocks_wait_for():
    """Only uncached tokens take prefill time: a request that reuses most of its prompt
    finishes sooner, and its new blocks are reusable sooner."""
    base = list(range(320))
    longer = base + list(range(10_000, 10_161))  # 320 cached tokens and 161 new
    requests = [(block_hashes(t, BS), len(t), None, None) for t in (base + [7], longer, longer)]
    # base (321 tokens) ends at 0.321 s; `longer` arrives at 1 s, hits 320 tokens, computes 161: ends at 1.161 s
    hits = cachemodel.replay_each(requests, BS, cachemodel.ROUND_ROBIN, 1, None, arrivals=[0.0, 1.0, 1.162], prefill_tokens_per_s=1000.0)
    assert hits == [0, 320, 480]


@pytest.mark.parametrize("policy, replicas, capacity", [
    pytest.param(cachemodel.ROUND_ROBIN, 1, None, id="one-replica"),
    pytest.param(cachemodel.ROUND_ROBIN, 3, 8, id="round-robin-lru"),
    pytest.param(cachemodel.RANDOM, 3, None, id="random"),
    pytest.param(cachemodel.SESSION, 3, 13, id="session-lru"),
    pytest.param(cachemodel.PREFIX_HASH, 3, None, id="prefix-hash"),
])
def test_a_prefill_far_faster_than_the_arrivals_is_the_replay_without_prefill_time(policy, replicas, capacity):
    requests = multi_turn(turns=6)
    arrivals = [float(i) for i in range(len(requests))]  # a second apart: every prefill ends before the next
    instant = cachemodel.replay_each(requests, BS, policy, replicas, capacity)
    assert cachemodel.replay_each(requests, BS, policy, replicas, capacity, arrivals=arrivals, prefill_tokens_per_s=1e9) == instant
    assert sum(instant) == replay(requests, BS, policy, replicas, capacity)[0]


@pytest.mark.parametrize("capacity", [None, 3, 8], ids=["unlimited", "lru-3", "lru-8"])
def test_bisecting_chained_hashes_finds_the_run_the_scan_finds(capacity):
    requests = multi_turn(turns=6)
    scan = cachemodel.replay_each(requests, BS, cachemodel.ROUND_ROBIN, 2, capacity)
    assert cachemodel.replay_each(requests, BS, cachemodel.ROUND_ROBIN, 2, capacity, chained=True) == scan
    arrivals = [i * 0.01 for i in range(len(requests))]
    assert cachemodel.replay_each(requests, BS, cachemodel.ROUND_ROBIN, 2, capacity, arrivals=arrivals, prefill_tokens_per_s=5000.0) == \
        cachemodel.replay_each(requests, BS, cachemodel.ROUND_ROBIN, 2, capacity, arrivals=arrivals, prefill_tokens_per_s=5000.0, chained=True)

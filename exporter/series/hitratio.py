"""The hit ratio the alerts judge, the cache tiers it adds up, and the units its counters
come in. Pure, no I/O.

The policy: the ratio the alerts judge is the EFFECTIVE one, every cached prompt token
over the prompt tokens queried, whichever tier served it: the GPU's own prefix cache and
what a KV connector (LMCache, NIXL, CPU offload) brought. A GPU-local 30% beside 55% from
the connector is a healthy 85%: judging the local 30% alone raised alarms on a healthy
fleet and none when the connector went away. It is read from the admitted-prefill counters
where the target has them (vLLM 0.16 on: each request counted once, when it is scheduled,
immune to the lookup counters' over-count on scheduler retries: local cache hits plus
`external_kv_transfer` over prompt tokens), else from the lookup counters (local hits plus
`external_prefix_cache_hits` over queries: since vLLM PR 30522 the connector is asked for
exactly the tokens the GPU cache missed). SGLang's and TensorRT-LLM's own pair counts
every tier already.

The tiers: where the engine names them (SGLang `cache_source`, TensorRT-LLM `cache_tier`,
vLLM 0.33 `prompt_tokens_cached_by_source`) its names, normalised; else `device` (the GPU
prefix cache) and `external` (the connector). Each tier's share is its cached tokens over
the same queried tokens, so the shares add up to the effective ratio.

The units: lookup counters count tokens, or blocks (vLLM 0.7.3-0.8.x's `gpu_` pair,
TensorRT-LLM without its tokens per block); a block holds the target's own block size in
tokens (vLLM's `cache_config_info`, carried by each window), DEFAULT_BLOCK_SIZE only where
the target never said. Every count this module hands out for a threshold or a pool is in
tokens, and every ratio is in [0, 1].

A window here is anything with WindowStats' counter fields (exporter/series/window.py).
"""
from __future__ import annotations

DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size on GPUs: for targets that do not say theirs

TOKENS, BLOCKS = "tokens", "blocks"
DEVICE, EXTERNAL = "device", "external"  # the tiers of a vLLM that does not name its own


def ratio(part: float, whole: float) -> float:
    """part / whole within [0, 1]: hits above queries (counters read at different
    moments) are all hits, never 150%."""
    r = part / whole
    return 1.0 if r > 1.0 else r if r > 0.0 else 0.0  # NaN and -0.0 give 0.0, as min(1, max(0, r)) does


def tokens_per_block(block_size: int | None) -> int:
    return block_size or DEFAULT_BLOCK_SIZE


def tokens(count: float, unit: str | None, block_size: int | None) -> float:
    """A counter's value in tokens: blocks times the target's block size; a count in
    tokens (or in an unknown unit) as it is."""
    return count * tokens_per_block(block_size) if unit == BLOCKS else count


def _in_tokens(ws, count: float | None) -> float:
    return 0.0 if count is None else tokens(count, ws.unit, getattr(ws, "block_size", None))


def query_tokens(ws) -> float:
    """The lookup counters' queries over the window, in tokens (0 without any): the
    traffic floor of the rules that judge those counters themselves."""
    return 0.0 if ws is None else _in_tokens(ws, ws.query_increase)


def hit_tokens(ws) -> float:
    """The lookup counters' (GPU-local) hits over the window, in tokens."""
    return 0.0 if ws is None else max(0.0, _in_tokens(ws, ws.hit_increase))


def token_rates(ws) -> tuple[float | None, float | None]:
    """(query, hit) tokens per second of the lookup counters over the window: a block
    counter's rate times the target's tokens per block (vLLM 0.7.3-0.8.x), so rates of a
    mixed fleet add up in one unit; None where the window has no rate."""
    size = getattr(ws, "block_size", None)
    return tuple(None if r is None else tokens(r, ws.unit, size) for r in (ws.query_rate, ws.hit_rate))  # type: ignore[return-value]


def lookup_ratio(ws) -> float | None:
    """The lookup counters' (GPU-local) ratio over the window, or None without a query."""
    if ws.hit_increase is None or not ws.query_increase:
        return None
    return ratio(ws.hit_increase, ws.query_increase)


def _admitted(ws) -> bool:
    return ws.admitted_hit_increase is not None and bool(ws.admitted_prompt_increase)


def tier_tokens(ws) -> dict[str, float]:
    """Cached prompt tokens over the window by tier (see the module's docstring), never
    below zero; {} without data."""
    if ws is None:
        return {}
    named = {tier: max(0.0, n) for tier, n in (getattr(ws, "tier_increases", None) or ())}
    if named and any(named.values()):
        return named
    if _admitted(ws):
        out = {DEVICE: max(0.0, ws.admitted_hit_increase)}
        if getattr(ws, "external_transfer_increase", None) is not None:
            out[EXTERNAL] = max(0.0, ws.external_transfer_increase)
        return out
    if ws.hit_increase is None or not ws.query_increase:
        return named
    out = {DEVICE: hit_tokens(ws)}
    if getattr(ws, "external_hit_increase", None) is not None:
        out[EXTERNAL] = max(0.0, _in_tokens(ws, ws.external_hit_increase))
    return out


def effective_counts(ws) -> tuple[float, float]:
    """(cached tokens of every tier, queried tokens) over the window, in tokens; (0, 0)
    without data. What the judged ratio is over, and what replicas pool."""
    if ws is None:
        return 0.0, 0.0
    return counts(ws.query_increase, ws.hit_increase, getattr(ws, "external_hit_increase", None), ws.admitted_hit_increase,
                  ws.admitted_prompt_increase, getattr(ws, "external_transfer_increase", None), getattr(ws, "unit", None),
                  getattr(ws, "block_size", None))


def counts(queries: float | None, hits: float | None, external_hits: float | None, admitted_hits: float | None,
           admitted_prompt: float | None, external_transfer: float | None, unit: str | None,
           block_size: int | None) -> tuple[float, float]:
    """effective_counts from a window's fields, for the summary that has them at hand
    before the window is built (it runs per model, window and poll)."""
    if admitted_hits is not None and admitted_prompt:
        transfer = external_transfer or 0.0
        return (admitted_hits if admitted_hits > 0.0 else 0.0) + (transfer if transfer > 0.0 else 0.0), admitted_prompt
    if hits is None or not queries:
        return 0.0, 0.0
    hits, external_hits = tokens(hits, unit, block_size), tokens(external_hits or 0.0, unit, block_size)
    # 0.0 for negatives and NaN, as max(0.0, x) gives
    return (hits if hits > 0.0 else 0.0) + (external_hits if external_hits > 0.0 else 0.0), tokens(queries, unit, block_size)


def judged_ratio(ws) -> float | None:
    """The ratio the rules judge over the window, every tier counted (whatever its
    traffic; the rules apply their own token floors)."""
    hits, queries = effective_counts(ws)
    return ratio(hits, queries) if queries > 0 else None


def judged_counts(ws) -> tuple[float, float]:
    """(hits, queries) the judged ratio is over, in tokens: what replicas pool,
    token-weighted, into one ratio (the rollout gate, the fleet). (0, 0) without data."""
    return effective_counts(ws)


def judged_tokens(ws, block_size: int | None = None) -> float:
    """The tokens the judged ratio is over, for the rules' traffic floors: admitted
    prompt tokens where the target counts admitted prefill, else the lookup queries in
    tokens (of `block_size` where given, else the window's own)."""
    if ws is None:
        return 0.0
    if ws.admitted_prompt_increase is not None and ws.admitted_hit_increase is not None:
        return ws.admitted_prompt_increase
    if ws.query_increase is None:
        return 0.0
    size = block_size if block_size is not None else getattr(ws, "block_size", None)
    return tokens(ws.query_increase, ws.unit, size)


def tier_shares(ws) -> dict[str, float]:
    """Each tier's cached tokens as a share of the queried tokens ({} without a query):
    they add up to the judged ratio."""
    _, queries = effective_counts(ws)
    if queries <= 0:
        return {}
    return {tier: ratio(n, queries) for tier, n in tier_tokens(ws).items()}


def tiers_in_use(windows) -> set[str]:
    """The tiers that served any token in any of the windows (a model's, longest
    included): vLLM declares its connector's counters at 0 without a connector, which is
    no second tier; one that stopped stays in use until it leaves the longest window."""
    return {tier for ws in windows for tier, n in tier_tokens(ws).items() if n > 0}


def shown_ratio(ws) -> float | None:
    """The judged ratio as the windows publish it, only where the window's traffic
    passed `global.min_query_tokens` (WindowStats' ratios are None under it): what the
    status page shows and ranks targets by."""
    if ws is None:
        return None
    effective = getattr(ws, "effective_hit_ratio", None)
    if effective is not None:
        return effective
    return ws.admitted_hit_ratio if ws.admitted_hit_ratio is not None else ws.hit_ratio

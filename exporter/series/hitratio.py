"""The hit ratio the alerts judge, and the units its counters come in. Pure, no I/O.

The policy: the admitted-prefill ratio where the target has it (vLLM 0.16 on: each request
counted once, when it is scheduled, immune to the lookup counters' over-count on scheduler
retries), else the lookup ratio. The units: lookup counters count tokens, or blocks (vLLM
0.7.3-0.8.x's `gpu_` pair, TensorRT-LLM without its tokens per block); a block holds the
target's own block size in tokens (vLLM's `cache_config_info`), DEFAULT_BLOCK_SIZE only
where the target never said. Every ratio is in [0, 1].

A window here is anything with WindowStats' counter fields (exporter/series/window.py).
"""
from __future__ import annotations

DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size on GPUs: for targets that do not say theirs

TOKENS, BLOCKS = "tokens", "blocks"


def ratio(part: float, whole: float) -> float:
    """part / whole within [0, 1]: hits above queries (counters read at different
    moments) are all hits, never 150%."""
    return min(1.0, max(0.0, part / whole))


def tokens_per_block(block_size: int | None) -> int:
    return block_size or DEFAULT_BLOCK_SIZE


def tokens(count: float, unit: str | None, block_size: int | None) -> float:
    """A counter's value in tokens: blocks times the target's block size; a count in
    tokens (or in an unknown unit) as it is."""
    return count * tokens_per_block(block_size) if unit == BLOCKS else count


def lookup_ratio(ws) -> float | None:
    """The lookup counters' ratio over the window, or None without a query."""
    if ws.hit_increase is None or not ws.query_increase:
        return None
    return ratio(ws.hit_increase, ws.query_increase)


def _admitted(ws) -> bool:
    return ws.admitted_hit_increase is not None and bool(ws.admitted_prompt_increase)


def judged_ratio(ws) -> float | None:
    """The ratio the rules judge over the window (whatever its traffic; the rules apply
    their own token floors)."""
    if _admitted(ws):
        return ratio(ws.admitted_hit_increase, ws.admitted_prompt_increase)
    return lookup_ratio(ws)


def judged_counts(ws) -> tuple[float, float]:
    """(hits, queries) the judged ratio is over, hits never below zero, in the counters'
    own unit: what replicas pool, token-weighted, into one ratio. (0, 0) without data."""
    if ws is None:
        return 0.0, 0.0
    if _admitted(ws):
        return max(0.0, ws.admitted_hit_increase), ws.admitted_prompt_increase
    if ws.hit_increase is None or not ws.query_increase:
        return 0.0, 0.0
    return max(0.0, ws.hit_increase), ws.query_increase


def judged_tokens(ws, block_size: int | None) -> float:
    """The tokens the rules' ratio is over, for their traffic floors: admitted prompt
    tokens where the target counts admitted prefill, else the lookup queries in tokens."""
    if ws.admitted_prompt_increase is not None and ws.admitted_hit_increase is not None:
        return ws.admitted_prompt_increase
    if ws.query_increase is None:
        return 0.0
    return tokens(ws.query_increase, ws.unit, block_size)


def shown_ratio(ws) -> float | None:
    """The judged ratio as the windows publish it, only where the window's traffic
    passed `global.min_query_tokens` (WindowStats' ratios are None under it): what the
    status page shows and ranks targets by."""
    if ws is None:
        return None
    return ws.admitted_hit_ratio if ws.admitted_hit_ratio is not None else ws.hit_ratio

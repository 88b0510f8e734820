"""A replica's role in prefill/decode disaggregation, and why we think so. Pure.

On a decode pod (vLLM with NIXL and the like) nearly every prompt token arrives as KV sent
by a prefill pod: `prompt_tokens_by_source{source="external_kv_transfer"}`, the external
(connector) hits, and from vLLM 0.33 `prompt_tokens_cached_by_source{source="p2p"}`. That
KV moved; it was not found in a cache. So a decode pod's local hit ratio is near zero by
design: its ratios never count transfers as hits, and the hit-rate rules do not judge it.

No metric names the role (vLLM's cache_config_info carries no kv_role, and
num_requests_kv_fetch_by_stage also exists for kv_both). So the role comes from a target
label the user sets (`role: decode` or `role: prefill`), else from the shape of the
counters since the process started: at least DECODE_SHARE of the prompt tokens arrived by
transfer, over at least MIN_TOKENS tokens.
"""
from __future__ import annotations

from .snapshot import Snapshot

DECODE = "decode"
PREFILL = "prefill"
ROLE_LABEL = "role"
DECODE_SHARE = 0.9
MIN_TOKENS = 20000.0
# a tier of prompt_tokens_cached_by_source that is KV moved between replicas, not a cache hit
TRANSFER_TIERS = ("p2p",)


def role(labels: tuple[tuple[str, str], ...], snapshot: Snapshot | None) -> tuple[str | None, str]:
    """(DECODE, PREFILL or None, why). A label the user set wins over the shape."""
    given = dict(labels).get(ROLE_LABEL, "").strip().lower()
    if given in (DECODE, PREFILL):
        return given, f"target label {ROLE_LABEL}={given}"
    if snapshot is None:
        return None, ""
    share, tokens, source = transfer_share(snapshot)
    if share is not None and tokens >= MIN_TOKENS and share >= DECODE_SHARE:
        return DECODE, f"{share:.0%} of {tokens:.0f} prompt tokens since start arrived as KV transfer ({source})"
    return None, ""


def transfer_share(snapshot: Snapshot) -> tuple[float | None, float, str]:
    """(transferred share of prompt tokens, prompt tokens, where it was read) since the
    process started, over every series of the target; None where nothing tells."""
    transferred = prompt = 0.0
    by_source = p2p = lookups = external_hits = 0.0
    for s in snapshot.series:
        sources = dict(s.prompt_tokens_by_source or ())
        if "external_kv_transfer" in sources and s.prompt_tokens:
            by_source += sources["external_kv_transfer"]
            prompt += s.prompt_tokens
        tiers = dict(s.prompt_tokens_cached_by_source or ())
        p2p += sum(tiers.get(t, 0.0) for t in TRANSFER_TIERS)
        if s.prefix_cache is not None and s.prefix_cache.unit == "tokens" and s.prefix_cache.queries and \
                s.external_prefix_cache is not None and s.external_prefix_cache.hits is not None:
            lookups += s.prefix_cache.queries
            external_hits += s.external_prefix_cache.hits
    if prompt > 0:
        # p2p is part of external_kv_transfer where both exist: the larger, never the sum
        transferred = max(by_source, p2p)
        return min(1.0, transferred / prompt), prompt, "prompt_tokens_by_source"
    if lookups > 0:
        return min(1.0, external_hits / lookups), lookups, "external prefix-cache hits over lookups"
    return None, 0.0, ""

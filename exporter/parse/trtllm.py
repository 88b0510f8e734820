"""TensorRT-LLM's KV-cache block counters -> the token pair the windows judge. The
upstream names live in exporter/parse/names.py's table; callers pass them for warnings."""
from __future__ import annotations

from .snapshot import CounterPair


def tokens_per_block(value: float | None) -> int | None:
    if value is None or not (0 < value < 1e9) or value != int(value):
        return None
    return int(value)


def block_size(values: list[dict[str, float]], size_name: str, warnings: list[str]) -> int | None:
    sizes = {v["trtllm_tokens_per_block"] for v in values if "trtllm_tokens_per_block" in v}
    good = {tokens_per_block(s) for s in sizes} - {None}
    if len(good) < len(sizes):
        warnings.append(f"{size_name}: {sorted(sizes)[:3]!r} is not a positive whole number of tokens")
    return good.pop() if len(good) == 1 else None


def block_pair(v: dict[str, float], what: str, warnings: list[str], names: tuple[str, str, str]) -> CounterPair | None:
    """Queries = reused + missed blocks, hits = reused, in tokens where the block size is
    known; otherwise in blocks (the window then assumes 16 tokens a block for its floor)."""
    reused_name, missed_name, size_name = names
    reused, missed = v.get("trtllm_reused"), v.get("trtllm_missed")
    if reused is None and missed is None:
        return None
    if reused is None or missed is None:
        warnings.append(f"{what}: only one of {reused_name} and {missed_name} is present")
        return CounterPair(queries=None, hits=reused, unit="blocks")
    size = tokens_per_block(v.get("trtllm_tokens_per_block"))
    if size is None:
        warnings.append(f"{what}: no usable {size_name}; the hit ratio is counted in blocks")
        return CounterPair(queries=reused + missed, hits=reused, unit="blocks")
    return CounterPair(queries=(reused + missed) * size, hits=reused * size, unit="tokens")

"""vLLM's info gauges (cache_config_info, lora_requests_info) -> the settings the windows
need: whether prefix caching is on, and the block size. Pure."""
from __future__ import annotations


def single_info(rows: list[dict[str, str]] | None, what: str, warnings: list[str]) -> dict[str, str] | None:
    if not rows:
        return None
    merged = {k: v for k, v in rows[0].items() if k != "engine"}
    if any({k: v for k, v in r.items() if k != "engine"} != merged for r in rows[1:]):
        warnings.append(f"{what}: engines disagree; using the first")
    return merged


def settings(cache_config: dict[str, str] | None, v0_gauges: list[float], warnings: list[str]) -> tuple[bool | None, int | None]:
    enabled: bool | None = None
    block_size: int | None = None
    if cache_config is not None:
        flag = cache_config.get("enable_prefix_caching")
        if flag is not None:
            enabled = flag.strip().lower() == "true"
        size = cache_config.get("block_size")
        if size is not None:
            try:
                block_size = int(float(size))  # "inf" and "1e999" raise OverflowError, "nan" ValueError
            except (ValueError, OverflowError):
                block_size = None
            if block_size is None or block_size <= 0 or block_size != float(size):
                warnings.append(f"cache_config_info: bad block_size {size[:40]!r}; a positive whole number of tokens is expected")
                block_size = None
    if enabled is None and v0_gauges:
        # V0 reports -1 in its hit-rate gauge when prefix caching is off
        enabled = not any(value < 0 for value in v0_gauges)
    return enabled, block_size

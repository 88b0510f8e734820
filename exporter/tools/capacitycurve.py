"""How much cache would get the hit rate back: the hit ratio against the cache size per
replica, for each routing policy, as a table and as an SVG drawing. Pure.

Sizes are log-spaced from 10^5 to 10^9 tokens a replica, four a decade, and unlimited.
LRU is a stack algorithm, so chained hashes give the whole curve in one replay per
policy (cachemodel.hits_by_capacity); hashes that do not chain replay each size.
"""
from __future__ import annotations

import math
from typing import Sequence
from xml.sax.saxutils import escape

from . import cachemodel

SIZES_TOKENS = tuple(round(10 ** (5 + k / 4)) for k in range(17))
REACH = 0.9  # the size that gets this share of the unlimited ratio is the one to ask for


def sweep(prepared: Sequence[tuple], block_size: int, policies: Sequence[str], replicas: int,
          configured_blocks: int | None = None, sizes_tokens: Sequence[int] = SIZES_TOKENS, chained: bool | None = None) -> dict:
    """The curve as JSON: `sizes_tokens` (per replica, the last null: unlimited), the
    token-weighted hit ratio at each per policy, and the smallest size reaching 90% of
    the policy's unlimited ratio (null when the unlimited ratio is 0). `chained`: whether
    the hashes chain, when the caller knows (else it is checked)."""
    capacities: list[int | None] = [t // block_size for t in sizes_tokens] + [None]
    total = sum(p[1] for p in prepared if len(p) < 5 or p[4])
    one_pass = cachemodel.chained(prepared) if chained is None else chained
    ratios: dict[str, list[float]] = {}
    for policy in policies:
        if one_pass:
            hits = cachemodel.hits_by_capacity(prepared, block_size, policy, replicas, capacities)
        else:
            hits = [cachemodel.replay(prepared, block_size, policy, replicas, c)[0] for c in capacities]
        ratios[policy] = [h / total if total else 0.0 for h in hits]
    reaches = {}
    for policy, values in ratios.items():
        unlimited = values[-1]
        reaches[policy] = next((size for size, v in zip(sizes_tokens, values) if unlimited > 0 and v >= REACH * unlimited), None)
    return {"replicas": replicas, "block_size": block_size, "sizes_tokens": list(sizes_tokens) + [None],
            "policies": ratios, "reaches_90_percent": reaches,
            "configured_tokens": configured_blocks * block_size if configured_blocks is not None else None}


def human(tokens: int | None) -> str:
    if tokens is None:
        return "unlimited"
    rounded = float(f"{tokens:.3g}")  # three digits, and 999,936 reads 1M, not 1e+03k
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rounded >= scale:
            return f"{rounded / scale:g}{unit}"
    return f"{rounded:g}"


def report_lines(curve: dict) -> list[str]:
    policies = list(curve["policies"])
    width = max([11] + [len(p) for p in policies])
    lines = [f"capacity curve: token-weighted hit ratio by cache size per replica ({curve['replicas']} replica(s), LRU)",
             "  tokens/replica " + "".join(f"{p:>{width + 2}}" for p in policies)]
    configured = curve["configured_tokens"]
    for i, size in enumerate(curve["sizes_tokens"]):
        mark = "  <- configured" if configured is not None and size is not None and _same_bucket(size, configured) else ""
        lines.append(f"  {human(size):>14} " + "".join(f"{curve['policies'][p][i] * 100:>{width + 1}.1f}%" for p in policies) + mark)
    reach = "  ".join(f"{p} {human(curve['reaches_90_percent'][p]) if curve['reaches_90_percent'][p] else 'never (no hits)'}"
                      for p in policies)
    lines.append(f"  {REACH:.0%} of the unlimited ratio from: {reach}")
    if configured is not None:
        lines.append(f"  configured: {human(configured)} tokens per replica")
    return lines


def _same_bucket(size: int, configured: int) -> bool:
    """The swept size nearest the configured one (on the log scale)."""
    nearest = min(SIZES_TOKENS, key=lambda s: abs(math.log10(s) - math.log10(max(configured, 1))))
    return size == nearest and 10 ** 4.875 <= configured <= 10 ** 9.125


# --- the drawing --------------------------------------------------------------------------------
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
_W, _H = 760, 440
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 170, 48, 56
_LOG_MIN, _LOG_MAX, _LOG_UNLIMITED = 5.0, 9.0, 9.5


def svg(curve: dict, title: str = "") -> str:
    """Hit ratio against log cache size, one polyline per policy, the unlimited ratio a
    dot on its own column, the configured size a dashed line. Plain SVG 1.1."""
    finite = [s for s in curve["sizes_tokens"] if s is not None]
    top = max([0.1] + [v for values in curve["policies"].values() for v in values])
    top = min(1.0, math.ceil(top * 10 + 1e-9) / 10)
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    x = lambda lg: _LEFT + (lg - _LOG_MIN) / (_LOG_UNLIMITED - _LOG_MIN) * plot_w
    y = lambda ratio: _TOP + plot_h - ratio / top * plot_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect x="0" y="0" width="{_W}" height="{_H}" fill="white"/>',
           f'<text x="{_LEFT}" y="22" font-size="14">{escape(title or "Prefix-cache hit ratio against cache size per replica")}</text>',
           f'<text x="{_LEFT}" y="38" fill="#555">{curve["replicas"]} replica(s), {curve["block_size"]} tokens a block, '
           'token-weighted, LRU</text>']
    steps = max(1, round(top * 10))  # a line every 10 points
    for k in range(steps + 1):
        ratio = top * k / steps
        out.append(f'<line x1="{_LEFT}" y1="{y(ratio):.1f}" x2="{x(_LOG_UNLIMITED):.1f}" y2="{y(ratio):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y(ratio) + 4:.1f}" text-anchor="end">{ratio * 100:.0f}%</text>')
    for lg in range(int(_LOG_MIN), int(_LOG_MAX) + 1):
        out.append(f'<line x1="{x(lg):.1f}" y1="{_TOP}" x2="{x(lg):.1f}" y2="{_TOP + plot_h}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{x(lg):.1f}" y="{_TOP + plot_h + 16}" text-anchor="middle">{human(10 ** lg)}</text>')
    out.append(f'<text x="{x(_LOG_UNLIMITED):.1f}" y="{_TOP + plot_h + 16}" text-anchor="middle">unlimited</text>')
    out.append(f'<text x="{x((_LOG_MIN + _LOG_MAX) / 2):.1f}" y="{_H - 12}" text-anchor="middle">cache size per replica (tokens, log scale)</text>')
    out.append(f'<line x1="{_LEFT}" y1="{_TOP + plot_h}" x2="{x(_LOG_UNLIMITED):.1f}" y2="{_TOP + plot_h}" stroke="black"/>')
    out.append(f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + plot_h}" stroke="black"/>')
    configured = curve["configured_tokens"]
    at = _LOG_UNLIMITED if configured is None or configured > 10 ** _LOG_MAX else max(_LOG_MIN, math.log10(max(configured, 1)))
    out.append(f'<line class="configured" x1="{x(at):.1f}" y1="{_TOP}" x2="{x(at):.1f}" y2="{_TOP + plot_h}" '
               'stroke="#444" stroke-dasharray="5,4"/>')
    out.append(f'<text x="{x(at) + 4:.1f}" y="{_TOP + 12}" fill="#444">configured: {escape(human(configured))}</text>')
    for n, (policy, values) in enumerate(curve["policies"].items()):
        colour = _COLOURS[n % len(_COLOURS)]
        points = " ".join(f"{x(math.log10(s)):.1f},{y(v):.1f}" for s, v in zip(finite, values))
        out.append(f'<polyline data-policy="{escape(policy)}" fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
        out.append(f'<circle cx="{x(_LOG_UNLIMITED):.1f}" cy="{y(values[-1]):.1f}" r="4" fill="{colour}"/>')
        ly = _TOP + 16 + n * 18
        out.append(f'<line x1="{_W - _RIGHT + 16}" y1="{ly}" x2="{_W - _RIGHT + 40}" y2="{ly}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{_W - _RIGHT + 46}" y="{ly + 4}">{escape(policy)} {values[-1] * 100:.1f}%</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"

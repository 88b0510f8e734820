"""The demo's live console table: a pure function of the published views."""
from __future__ import annotations

from typing import Sequence

from .state import TargetView


def _pct(v: float | None) -> str:
    return "   -  " if v is None else f"{v * 100:5.1f}%"


def _ms(v: float | None) -> str:
    return "    -  " if v is None else f"{v * 1000:6.0f}ms"


def table(views: Sequence[TargetView], elapsed: float, windows: Sequence[str], alerts: Sequence[str] = ()) -> str:
    short, long_ = windows[0], windows[1] if len(windows) > 1 else windows[0]
    lines = [f"t={elapsed:5.1f}s  {'target':<10} {'up':<4} {'hit ' + short:>9} {'hit ' + long_:>9} "
             f"{'TTFT p50':>9} {'TTFT p99':>9} {'corr':>6}"]
    for v in sorted(views, key=lambda v: v.target.name):
        for model, stats in sorted(v.stats.items()) or [("-", {})]:
            s, l = stats.get(short), stats.get(long_)
            corr = l.correlation if l else None
            lines.append(
                f"{'':9}{v.target.name:<10} {'yes' if v.up else 'no':<4} {_pct(s.hit_ratio if s else None):>9} "
                f"{_pct(l.hit_ratio if l else None):>9} {_ms(s.ttft_quantiles.get(0.5) if s else None):>9} "
                f"{_ms(s.ttft_quantiles.get(0.99) if s else None):>9} {('%+.2f' % corr) if corr is not None else '   -':>6}")
    for a in alerts:
        lines.append(f"{'':9}ALERT {a}")
    return "\n".join(lines)

"""The demo's console: a table that is a pure function of the published views, and a
screen that redraws it in place on a terminal or prints a scrolling log elsewhere."""
from __future__ import annotations

from typing import Sequence, TextIO

from ..monitor.targetview import TargetView

_CLEAR = "\x1b[H\x1b[2J"


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


class Screen:
    """On a terminal: the header, the table and the story so far, redrawn in place. Not on
    a terminal (a pipe, CI): each story line once, and the table every `every` seconds."""

    def __init__(self, out: TextIO, tty: bool, every: float = 10.0):
        self.out, self.tty, self.every = out, tty, every
        self.header: list[str] = []
        self.story: list[str] = []
        self._last_table = -1e18

    def say(self, line: str, header: bool = False) -> None:
        (self.header if header else self.story).append(line)
        if not self.tty:
            print(line, file=self.out, flush=True)

    def show(self, table_text: str, elapsed: float) -> None:
        if self.tty:
            body = "\n".join(self.header + ["", table_text, ""] + self.story[-30:])
            self.out.write(_CLEAR + body + "\n")
            self.out.flush()
        elif elapsed - self._last_table >= self.every:
            self._last_table = elapsed
            print(table_text, file=self.out, flush=True)

"""One line of the Prometheus text format: a sample's labels and value text, and a
histogram's `le`. Pure; the parsers of every engine's /metrics read their lines here."""
from __future__ import annotations

import re

_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,|$)')
_UNESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def labels(text: str) -> dict[str, str] | None:
    """Label text between the braces -> dict, or None when it is not well formed."""
    out: dict[str, str] = {}
    pos = 0
    end = len(text)
    while pos < end:
        m = _LABEL.match(text, pos)
        if m is None:
            return None
        value = m.group(2)
        if "\\" in value:
            value = _UNESCAPE.sub(lambda e: _UNESCAPED.get(e.group(1), "\\" + e.group(1)), value)
        out[m.group(1)] = value
        pos = m.end()
        if m.group(3) == "" and pos < end:
            return None
    return out


def sample(line: str, brace: int) -> tuple[dict[str, str] | None, str] | None:
    """One sample line -> (labels or None if malformed, value text), or None."""
    if brace == -1:
        rest = line.split()
        if len(rest) not in (2, 3):
            return None
        return {}, rest[1]
    close = line.rfind("}")
    if close < brace:
        return None
    rest = line[close + 1:].split()
    if len(rest) not in (1, 2):
        return None
    text = line[brace + 1:close]
    if "\\" in text:
        return labels(text), rest[0]
    # without a backslash no value can hold a quote, so '",' only separates labels
    parts = text.split('",')
    last = parts[-1]
    if last.endswith('"'):
        parts[-1] = last[:-1]
    elif not last.strip():
        parts.pop()  # a trailing comma
    else:
        return None, rest[0]
    found = {}
    for part in parts:
        key, sep, value = part.partition('="')
        key = key.strip()
        if not sep or not key or '"' in value or not (key[0].isalpha() or key[0] == "_"):
            return None, rest[0]
        found[key] = value
    return found, rest[0]


def le(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None

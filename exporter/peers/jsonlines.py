"""Reading JSON from files a user hands the command line (recordings, request samples,
chat requests, lint inputs): every line and every file has a bound, and whatever is in
them becomes a counted bad line or a clear error, never a traceback (a whole file is read
by exporter/peers/files.py).

Python's json module accepts NaN and Infinity, turns 1e400 into inf, and recurses once
per nesting level (a line of 100,000 `[` raises RecursionError); files may hold bytes
that are not UTF-8, lines of any length, or be a FIFO nobody writes to. Pure.
"""
from __future__ import annotations

import json
import math
from typing import IO, Iterable, Iterator

# deeper than any request or recording line we read; far under Python's recursion limit,
# so that code walking what was read (rendering a chat request) cannot hit it either
MAX_DEPTH = 64
MAX_LINE_BYTES = 64 * 1024 * 1024  # a recording line holds one /metrics body (16 MiB by default)
MAX_FILE_BYTES = 16 * 1024 * 1024  # a chat request or a prompt template


class JSONInputError(ValueError):
    """A line or file that is not acceptable JSON; the message says why, without a traceback."""


def _no_constant(name: str):
    raise JSONInputError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONInputError(f"{text[:40]} is out of range")
    return value


def loads(text: str | bytes, max_depth: int = MAX_DEPTH):
    """json.loads, strict: no NaN, Infinity or numbers that overflow a float, at most
    `max_depth` levels of nesting. Raises JSONInputError."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONInputError(f"not UTF-8 at byte {exc.start}") from None
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise JSONInputError(f"nested more than {max_depth} levels deep") from None
    except JSONInputError:
        raise
    except ValueError as exc:  # JSONDecodeError, and int() of more digits than Python converts
        raise JSONInputError(getattr(exc, "msg", None) or str(exc)) from None
    # counting brackets costs C time; the walk runs only where they could nest that deep
    if text.count("[") + text.count("{") > max_depth and _depth(value) > max_depth:
        raise JSONInputError(f"nested more than {max_depth} levels deep")
    return value


def _depth(value) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in item if isinstance(child, (list, dict)))
    return deepest


def finite_number(value) -> float | None:
    """A JSON number as a finite float, or None (a bool, a string, an int too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def lines(stream: IO[bytes] | Iterable, max_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str | JSONInputError]]:
    """(line number, text) of each line of a binary stream, or (line number, JSONInputError)
    for a line that is not UTF-8 or longer than `max_bytes` (its rest is skipped, never
    held). An iterable of str (a test's list) passes through."""
    readline = getattr(stream, "readline", None)
    if readline is None or isinstance(stream, (list, tuple)):
        for n, line in enumerate(stream, 1):
            yield n, line
        return
    n = 0
    while True:
        raw = readline(max_bytes + 1)
        if not raw:
            return
        n += 1
        if isinstance(raw, str):
            yield n, raw
            continue
        if len(raw) > max_bytes and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = readline(1024 * 1024)
            yield n, JSONInputError(f"longer than {max_bytes} bytes")
            continue
        try:
            yield n, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield n, JSONInputError(f"not UTF-8 at byte {exc.start}")

"""A strict logfmt reader for the tests, after go-logfmt's decoder (the parser of Loki's
`| logfmt`, promtail and the Go tools): keys are runs of bytes above space other than `=`
and `"`; a value is bare (no space, `=` or `"` in it) or quoted with JSON's escapes. What
go-logfmt refuses, this refuses: a line our logs write must read back whole."""
from __future__ import annotations


class LogfmtError(ValueError):
    pass


_SIMPLE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _unquote(body: str, line: str) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            if c < " ":
                raise LogfmtError(f"raw control character in a quoted value: {line!r}")
            out.append(c)
            i += 1
            continue
        esc = body[i + 1:i + 2]
        if esc in _SIMPLE:
            out.append(_SIMPLE[esc])
            i += 2
        elif esc == "u":
            code = int(body[i + 2:i + 6], 16)
            i += 6
            if 0xD800 <= code < 0xDC00 and body[i:i + 2] == "\\u":
                low = int(body[i + 2:i + 6], 16)
                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                i += 6
            out.append(chr(code))
        else:
            raise LogfmtError(f"invalid escape \\{esc} in {line!r}")
    return "".join(out)


def parse(line: str) -> list[tuple[str, str]]:
    """(key, value) pairs in order; LogfmtError where go-logfmt would fail."""
    if "\n" in line or "\r" in line:
        raise LogfmtError("more than one line")
    pairs, i, n = [], 0, len(line)
    while i < n:
        if line[i] <= " ":
            i += 1
            continue
        start = i
        while i < n and line[i] > " " and line[i] not in '="':
            i += 1
        key = line[start:i]
        if i < n and line[i] == '"':
            raise LogfmtError(f"unexpected '\"' in a key: {line!r}")
        if i >= n or line[i] != "=":
            raise LogfmtError(f"key {key!r} without a value: {line!r}")
        i += 1
        if i < n and line[i] == '"':
            j, escaped = i + 1, False
            while j < n and (escaped or line[j] != '"'):
                escaped = not escaped and line[j] == "\\"
                j += 1
            if j >= n:
                raise LogfmtError(f"unterminated quoted value: {line!r}")
            value = _unquote(line[i + 1:j], line)
            i = j + 1
            if i < n and line[i] > " ":
                raise LogfmtError(f"no space after a quoted value: {line!r}")
        else:
            start = i
            while i < n and line[i] > " ":
                if line[i] in '="':
                    raise LogfmtError(f"unexpected {line[i]!r} in a bare value: {line!r}")
                i += 1
            value = line[start:i]
        pairs.append((key, value))
    return pairs

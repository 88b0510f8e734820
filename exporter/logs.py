"""Log lines that log pipelines parse: logfmt as go-logfmt writes it, or JSON, with the
field names of the Prometheus ecosystem's go-kit style (prometheus/common promslog):
`ts` (RFC 3339, UTC, milliseconds), `level` (debug, info, warn, error), `caller`
(file:line), `msg`, then what the line is about as keys of their own (`alert`, `state`,
`target`, `namespace`, `model`, `cause`, ...: `fields()`, so that Loki's `| logfmt |
cause="..."` finds them; never inside `msg`), then ours (`logger`, `err` for a traceback).

Every record is one line whatever it holds: a newline or an escape sequence from a request
(a deploy version) or a target is escaped inside a quoted value, never written raw, so no
input can forge a log line.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime, timezone

from .logfields import FIELD_KEYS

FORMATS = ("logfmt", "json")
LEVELS = ("debug", "info", "warn", "warning", "error")
# Python's level names as go-kit and slog spell them
_LEVEL_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error",
                logging.CRITICAL: "error"}
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def timestamp(t: float) -> str:
    """RFC 3339 in UTC with three fixed decimals, as promslog's go-kit style writes `ts`."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _needs_quotes(value: str) -> bool:
    # go-logfmt quotes a value holding a byte <= ' ', '=', '"' or an invalid rune; a
    # character that is not printable (a line or paragraph separator, DEL, a bidi control)
    # is quoted and escaped too, so that a viewer never breaks or reorders a line on it
    return any(c <= " " or c in '="\ufffd' or not c.isprintable() for c in value)


def logfmt_value(value: str) -> str:
    """`value` as go-logfmt writes it: bare when it can be, else quoted with `\\`, `"`,
    newline, carriage return and tab escaped and other control characters as \\uXXXX
    (\\u00XX for the ASCII ones, as go-logfmt has them)."""
    if value == "null":  # go-logfmt quotes it, so that no parser takes it for a nil
        return '"null"'
    if not _needs_quotes(value):
        return value
    out = []
    for c in value:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif c < " " or not c.isprintable():
            out.append(_unicode_escape(ord(c)))
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _unicode_escape(code: int) -> str:
    """\\uXXXX, as a surrogate pair above the BMP (go-logfmt unquotes as encoding/json does)."""
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def one_line(text: str) -> str:
    """`text` for a line of its own on stderr, as the offline commands print what they found:
    every character that is not printable (a newline, an escape sequence, a line separator,
    a bidi control) escaped as logfmt escapes it, so a target or key named in a recording or
    a config cannot end the line and forge the next one."""
    if text.isprintable():
        return text
    return "".join(_ESCAPES.get(c, c) if c in "\n\r\t" else c if c.isprintable() else _unicode_escape(ord(c)) for c in text)


def logfmt_line(fields: list[tuple[str, str]]) -> str:
    return " ".join(f"{key}={logfmt_value(value)}" for key, value in fields)


class StructuredFormatter(logging.Formatter):
    """One record -> one logfmt or JSON line with ts, level, caller, msg, logger (and err)."""

    def __init__(self, fmt: str = "logfmt"):
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
        self.fmt = fmt

    def fields(self, record: logging.LogRecord) -> list[tuple[str, str]]:
        fields = [("ts", timestamp(record.created)),
                  ("level", _LEVEL_NAMES.get(record.levelno, record.levelname.lower())),
                  ("caller", f"{os.path.basename(record.pathname)}:{record.lineno}"),
                  ("msg", record.getMessage())]
        about = getattr(record, "fields", None)
        if isinstance(about, dict):
            fields += [(key, about[key]) for key in FIELD_KEYS if key in about]
        fields.append(("logger", record.name))
        if record.exc_info:
            fields.append(("err", self.formatException(record.exc_info)))
        return fields

    def format(self, record: logging.LogRecord) -> str:
        fields = self.fields(record)
        if self.fmt == "json":
            # ensure_ascii: every control or separator character is escaped, one line always
            return json.dumps(dict(fields), ensure_ascii=True)
        return logfmt_line(fields)


def setup(level: str = "info", fmt: str = "logfmt", path: str | None = None) -> None:
    """The root logger writes `fmt` lines at `level` and above to stderr, or to `path`."""
    handler = logging.FileHandler(path) if path else logging.StreamHandler(sys.stderr)
    handler.setFormatter(StructuredFormatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, "WARNING" if level == "warn" else level.upper(), logging.INFO))
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("cheroot").setLevel(logging.WARNING)

"""Prompt-template lint: volatile content standing before static content defeats the
prefix cache. Pure: file text in, findings out."""
from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from typing import Sequence

from ..peers import jsonlines
from .divergence import PATTERNS, REQUEST_ID, TIMESTAMP, TOOLS_ORDER, USER, UUID, content_problem, render, tool_names

# About one 16-token block of static text: less than that after the volatile part
# costs at most one block, so it is not worth a finding.
MIN_STATIC_AFTER = 64

_PLACEHOLDERS: dict[str, re.Pattern] = {
    TIMESTAMP: re.compile(r"\{\{[^}]*\b(now|current_(time|date|datetime)|datetime|timestamp|today|time|date)\b[^}]*\}\}|strftime\(|\$\{?(DATE|TIME|NOW)\b", re.I),
    UUID: re.compile(r"\{\{[^}]*\buuid\w*[^}]*\}\}", re.I),
    REQUEST_ID: re.compile(r"\{\{[^}]*\b(request|trace|span|correlation|session)_?id\b[^}]*\}\}", re.I),
    USER: re.compile(r"\{\{[^}]*\b(user(\.|_)?name|username|user\.\w+|customer\w*|tier|plan)\b[^}]*\}\}", re.I),
}
_LITERALS = {TIMESTAMP: re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{1,2}:\d{2}:\d{2}|\b\d{1,2}:\d{2}:\d{2}\b"
                                   # 12-hour clock times (8:38 PM) and Unix epoch seconds or
                                   # milliseconds from 2001 to 2286 (1000000000-9999999999)
                                   r"|\b(1[0-2]|0?[1-9]):[0-5]\d\s?(?:[AaPp]\.?[Mm]\.?)(?![A-Za-z])"
                                   r"|(?<![\d.])[1-9]\d{9}(?:\d{3})?(?!\.?\d)"),
             UUID: PATTERNS[UUID],
             REQUEST_ID: re.compile(r"\b(request|trace|span|correlation)[ _-]?id\s*[:=]\s*\S+", re.I)}
_TEMPLATE_EXPR = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.S)
MESSAGES = {
    TIMESTAMP: "a timestamp before static content: every request gets a new prefix",
    UUID: "a UUID before static content: no two requests share the prefix after it",
    REQUEST_ID: "a request/trace id before static content: no two requests share the prefix after it",
    USER: "a user name or tier before static content: users share nothing after it",
    TOOLS_ORDER: "tools are not in a stable (sorted) order: a reordering changes every block after them",
}


@dataclass(frozen=True)
class LintFinding:
    path: str
    line: int
    kind: str
    message: str
    snippet: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.message} ({self.snippet!r})"


_SPACE = re.compile(r"\s+")


def _static_after(text: str, ends) -> dict[int, int]:
    """For each offset in `ends`: how much static text follows it (what is left once
    template expressions and volatile content are taken out, without the whitespace
    around it). One pass over the text for all offsets, so that a file with a timestamp
    on every line costs time linear in its size, not quadratic."""
    n = len(text)
    kept = bytearray(b"\x01") * n  # 1 where the character is static
    for pattern in (_TEMPLATE_EXPR, *_PLACEHOLDERS.values(), *_LITERALS.values()):
        for m in pattern.finditer(text):
            kept[m.start():m.end()] = bytes(m.end() - m.start())
    solid = bytearray(kept)  # static and not whitespace
    for m in _SPACE.finditer(text):
        solid[m.start():m.end()] = bytes(m.end() - m.start())
    last = solid.rfind(1)
    if last == -1:
        return {end: 0 for end in ends}
    trailing = kept.count(1, last + 1, n)
    first = {end: solid.find(1, end) for end in set(ends)}
    out, total, at = {}, 0, n
    for end, start in sorted(first.items(), key=lambda item: -max(item[1], -1)):
        if start == -1:
            out[end] = 0
            continue
        total += kept.count(1, start, at)
        at = start
        out[end] = total - trailing
    return out


class _Lines:
    """Line numbers of offsets, from one list of line starts."""

    def __init__(self, text: str):
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def of(self, offset: int) -> int:
        return bisect_right(self.starts, offset)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def lint_template(path: str, text: str) -> list[LintFinding]:
    matches = [(kind, m) for kind, pattern in list(_PLACEHOLDERS.items()) + list(_LITERALS.items()) for m in pattern.finditer(text)]
    static = _static_after(text, [m.end() for _, m in matches])
    lines = _Lines(text)
    found = [LintFinding(path, lines.of(m.start()), kind, MESSAGES[kind], m.group(0))
             for kind, m in matches if static[m.end()] >= MIN_STATIC_AFTER]
    return _dedupe(found)


def lint_request(path: str, text: str, request: dict) -> list[LintFinding]:
    found = []
    names = tool_names(request)
    if names and names != sorted(names):
        at = text.find('"tools"')
        found.append(LintFinding(path, _line_of(text, max(0, at)), TOOLS_ORDER, MESSAGES[TOOLS_ORDER], ", ".join(names)))
    rendered = render(request)
    matches = [(kind, m) for kind, pattern in _LITERALS.items() for m in pattern.finditer(rendered)]
    static = _static_after(rendered, [m.end() for _, m in matches])
    for kind, m in matches:
        if static[m.end()] >= MIN_STATIC_AFTER:
            at = text.find(m.group(0))
            found.append(LintFinding(path, _line_of(text, at) if at >= 0 else 1, kind, MESSAGES[kind], m.group(0)))
    return _dedupe(found)


def lint(path: str, text: str) -> list[LintFinding]:
    """A request JSON file (an object with `messages`) or a prompt template."""
    if path.endswith(".json"):
        try:
            data = jsonlines.loads(text)
        except jsonlines.JSONInputError as exc:
            raise ValueError(f"{path}: not JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            raise ValueError(f"{path}: not a chat-completions request (no `messages` list)")
        if not isinstance(data.get("tools") or [], list):
            raise ValueError(f"{path}: `tools` must be a list")
        if problem := content_problem(data):
            raise ValueError(f"{path}: {problem}")
        return lint_request(path, text, data)
    return lint_template(path, text)


def allowed(finding: LintFinding, allow: Sequence[str]) -> bool:
    return any(finding.kind == a or re.search(a, finding.snippet) for a in allow)


def _dedupe(found: list[LintFinding]) -> list[LintFinding]:
    seen, out = set(), []
    for f in sorted(found, key=lambda f: (f.line, f.kind)):
        if (f.line, f.kind) not in seen:
            seen.add((f.line, f.kind))
            out.append(f)
    return out

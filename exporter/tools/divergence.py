"""Where two requests stop sharing a prefix, how many cache blocks survive, and what
probably made them differ. Pure: token ids, texts and requests in, a Finding out."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

# --- what changes between requests, and how to recognise it -------------------------------
TIMESTAMP = "timestamp"
UUID = "uuid"
REQUEST_ID = "request_id"
USER = "user_name_or_tier"
TOOLS_ORDER = "tools_order"
RAG_BEFORE_INSTRUCTIONS = "retrieved_text_before_instructions"

PATTERNS: dict[str, re.Pattern] = {
    TIMESTAMP: re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{1,2}:\d{2}(:\d{2})?|\b\d{1,2}:\d{2}:\d{2}\b|\b1[6-9]\d{8}(\.\d+)?\b"
                          r"|(date|time|now|timestamp)\s*[:=]", re.I),
    UUID: re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
    REQUEST_ID: re.compile(r"\b(request|req|trace|span|correlation|session)[ _-]?id\b|\b[0-9a-f]{16,}\b", re.I),
    USER: re.compile(r"\b(user(name)?|customer|name|tier|plan|account)\s*[:=]|\b(free|pro|premium|enterprise|gold|silver) (tier|plan)\b", re.I),
}
ADVICE = {
    TIMESTAMP: "move the date/time after all static content, or round it to the day",
    UUID: "move the id out of the prompt (a header or metadata), or after all static content",
    REQUEST_ID: "keep request and trace ids out of the prompt, or after all static content",
    USER: "put user names and tiers after the shared instructions, not before",
    TOOLS_ORDER: "serialize tools in a stable order (sort by name) with stable JSON keys",
    RAG_BEFORE_INSTRUCTIONS: "place retrieved documents after the static instructions",
}


@dataclass(frozen=True)
class Finding:
    first_divergence: int  # token index where A and B first differ (len of the shorter if one is a prefix)
    tokens_a: int
    tokens_b: int
    block_size: int
    reusable_blocks: int  # of B's full blocks, those that hit after A was cached
    total_blocks: int
    culprits: tuple[str, ...] = ()
    context_a: str = ""
    context_b: str = ""
    approximate: bool = False
    identical: bool = False  # A and B render to the same tokens (or text, offline)

    def to_json(self) -> dict:
        return {"identical": self.identical, "first_divergent_token": self.first_divergence, "tokens": [self.tokens_a, self.tokens_b],
                "block_size": self.block_size, "reusable_blocks": self.reusable_blocks, "total_blocks": self.total_blocks,
                "culprits": list(self.culprits), "advice": [ADVICE[c] for c in self.culprits],
                "context": {"a": self.context_a, "b": self.context_b}, "approximate": self.approximate}


def first_divergence(a: Sequence, b: Sequence) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def reusable_blocks(divergence: int, tokens_b: int, block_size: int) -> tuple[int, int]:
    """(blocks of B that hit once A is cached, B's full blocks). vLLM caches whole
    blocks only and always recomputes at least the last token."""
    total = tokens_b // block_size
    return min(divergence, max(0, tokens_b - 1)) // block_size, total


def culprits(text_a: str, text_b: str, request_a: dict | None = None, request_b: dict | None = None) -> tuple[str, ...]:
    """Likely causes, from the text around the divergence and the requests' structure."""
    found = []
    if request_a is not None and request_b is not None:
        if _tools_reordered(request_a, request_b):
            found.append(TOOLS_ORDER)
        if _retrieved_text_first(request_a, request_b):
            found.append(RAG_BEFORE_INSTRUCTIONS)
    for kind, pattern in PATTERNS.items():
        if pattern.search(text_a) or pattern.search(text_b):
            found.append(kind)
    return tuple(dict.fromkeys(found))


def tool_names(request: dict) -> list[str]:
    names = []
    for tool in request.get("tools") or []:
        if isinstance(tool, dict):
            fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
            names.append(str(fn.get("name", "")))
    return names


def _tools_reordered(a: dict, b: dict) -> bool:
    na, nb = tool_names(a), tool_names(b)
    return bool(na) and na != nb and sorted(na) == sorted(nb)


def content_problem(request: dict) -> str | None:
    """What in the messages' content no rendering can read, or None: a content part's
    `text` that is not a string (`{"type": "text", "text": 5}` was a TypeError)."""
    for i, m in enumerate(request.get("messages") or []):
        content = m.get("content") if isinstance(m, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and "text" in part and not isinstance(part["text"], str):
                return f"`messages[{i}].content[{j}].text` must be a string, not {type(part['text']).__name__}"
    return None


def _contents(request: dict) -> list[str]:
    out = []
    for m in request.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        out.append(content if isinstance(content, str) else "")
    return out


def _retrieved_text_first(a: dict, b: dict) -> bool:
    """A long message that differs comes before a long one that does not: dynamic
    (retrieved) text sits in front of static instructions."""
    ca, cb = _contents(a), _contents(b)
    first = next((i for i, (x, y) in enumerate(zip(ca, cb)) if x != y), None)
    if first is None or max(len(ca[first]), len(cb[first])) < 200:
        return False
    return any(x == y and len(x) >= 200 for x, y in zip(ca[first + 1:], cb[first + 1:]))


# --- the offline approximation ---------------------------------------------------------------
CHARS_PER_TOKEN = 4.0  # a rough average for English text and common tokenizers


def render(request: dict) -> str:
    """A neutral chat rendering: tools first (as most templates put them in the system
    turn), then each message. Not the model's template: only for the offline estimate."""
    parts = []
    if request.get("tools"):
        parts.append("<tools>" + json.dumps(request["tools"], ensure_ascii=False) + "</tools>\n")
    for m in request.get("messages") or []:
        role = m.get("role", "") if isinstance(m, dict) else ""
        content = _contents({"messages": [m]})[0]
        parts.append(f"<|{role}|>\n{content}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def offline(request_a: dict, request_b: dict, block_size: int) -> Finding:
    ta, tb = render(request_a), render(request_b)
    chars = first_divergence(ta, tb)
    est = int(chars / CHARS_PER_TOKEN)
    tokens_b = max(1, round(len(tb) / CHARS_PER_TOKEN))
    hit, total = reusable_blocks(est, tokens_b, block_size)
    same = ta == tb
    return Finding(est, round(len(ta) / CHARS_PER_TOKEN), tokens_b, block_size, hit, total,
                   () if same else culprits(_around(ta, chars), _around(tb, chars), request_a, request_b),
                   _around(ta, chars), _around(tb, chars), approximate=True, identical=same)


def _around(text: str, at: int, width: int = 60) -> str:
    return text[max(0, at - width): at + width]


def online(tokens_a: Sequence[int], tokens_b: Sequence[int], block_size: int, context_a: str, context_b: str,
           request_a: dict, request_b: dict) -> Finding:
    d = first_divergence(tokens_a, tokens_b)
    hit, total = reusable_blocks(d, len(tokens_b), block_size)
    same = list(tokens_a) == list(tokens_b)
    return Finding(d, len(tokens_a), len(tokens_b), block_size, hit, total,
                   () if same else culprits(context_a, context_b, request_a, request_b), context_a, context_b, identical=same)


def report(f: Finding) -> str:
    lines = []
    if f.approximate:
        lines.append("APPROXIMATION (--offline): character divergence mapped to a token index at ~4 characters a token; "
                     "run against vLLM (--target) for exact token ids.")
    if f.identical:
        lines.append(f"the two requests are identical ({f.tokens_a} tokens): B reuses every full block A cached "
                     f"({f.reusable_blocks} of {f.total_blocks}, block size {f.block_size}); their prefix is not the problem")
        return "\n".join(lines)
    lines.append(f"first divergent token: {f.first_divergence} (A has {f.tokens_a} tokens, B has {f.tokens_b})")
    lines.append(f"reusable blocks: {f.reusable_blocks} of {f.total_blocks} (block size {f.block_size}); "
                 f"{f.total_blocks - f.reusable_blocks} block(s) of B are prefilled again")
    lines.append(f"around the divergence, A: {f.context_a!r}")
    lines.append(f"around the divergence, B: {f.context_b!r}")
    if f.culprits:
        for c in f.culprits:
            lines.append(f"likely culprit: {c}: {ADVICE[c]}")
    else:
        lines.append("likely culprit: none recognised; compare the two texts above")
    return "\n".join(lines)

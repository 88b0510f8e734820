"""The samples `whatif` reads, one request a line: JSON request records (token ids, a chat
body or prompt text), lines of vLLM's request log (`--enable-log-requests`), or the lines
of a block-hash trace (hashtrace.py: Mooncake's FAST'25 format, timestamps in
milliseconds, or Qwen-Bailian's, in seconds). Pure: lines in, requests or errors out.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from ..peers import jsonlines
from . import hashtrace
from .divergence import content_problem


class SampleError(ValueError):
    pass


@dataclass(frozen=True)
class Request:
    line: int
    t: float | None = None
    session: str | None = None
    replica: str | None = None
    tokens: tuple[int, ...] | None = None
    prompt: str | None = None
    body: dict | None = None
    lora: str | None = None
    salt: str | None = None
    hash_ids: tuple[int, ...] | None = None  # a block-hash trace's line (hashtrace.py)
    input_length: int | None = None
    trace: str | None = None  # which block-hash format: hashtrace.MOONCAKE or hashtrace.BAILIAN
    chat_id: int | str | None = None  # a Qwen-Bailian line's conversation link
    parent_chat_id: int | str | None = None
    request_type: str | None = None
    turn: int | None = None

    @property
    def is_text(self) -> bool:
        return self.tokens is None and self.hash_ids is None

    @property
    def is_hashes(self) -> bool:
        return self.hash_ids is not None

    @property
    def has_session_key(self) -> bool:
        """A session, or a conversation link that gives one (a Qwen-Bailian chat id)."""
        return bool(self.session) or self.chat_id is not None


# --- input -------------------------------------------------------------------------------
_LOG_REQUEST = re.compile(r"Received request (?P<id>\S+?): prompt: (?P<rest>.*)$")
_LOG_TIME = re.compile(r"^\w+\s+(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})")
_LORA_NAME = re.compile(r"lora_name='([^']*)'")


def read_requests(lines: Iterable[str]) -> Iterator[Request | SampleError]:
    """Each non-blank line: a JSON request record, or a line of vLLM's request log
    (`--enable-log-requests`); anything else is a SampleError naming the line."""
    for n, line in jsonlines.lines(lines):  # a binary stream's lines are bounded and must be UTF-8
        if isinstance(line, jsonlines.JSONInputError):
            yield SampleError(f"line {n}: {line}")
            continue
        text = line.strip()
        if not text:
            continue
        if text.startswith("{"):
            yield _from_json(n, text)
        elif "Received request " in text:
            yield _from_log(n, text)
        else:
            yield SampleError(f"line {n}: neither a JSON request nor a vLLM request-log line")


def _from_json(n: int, text: str) -> Request | SampleError:
    try:
        obj = jsonlines.loads(text)
    except jsonlines.JSONInputError as exc:
        return SampleError(f"line {n}: not JSON ({exc})")
    if not isinstance(obj, dict):
        return SampleError(f"line {n}: a JSON object is required")
    t = obj.get("t")
    if t is not None and jsonlines.finite_number(t) is None:
        return SampleError(f"line {n}: `t` must be a number, and finite")
    for key in ("session", "replica", "lora", "cache_salt"):
        if obj.get(key) is not None and not isinstance(obj[key], (str, int)):
            return SampleError(f"line {n}: `{key}` must be a string")
    common = dict(line=n, t=None if t is None else float(t), session=_text(obj.get("session")), replica=_text(obj.get("replica")),
                  lora=_text(obj.get("lora")), salt=_text(obj.get("cache_salt")))
    if hashtrace.is_bailian(obj):
        try:
            rec = hashtrace.bailian_fields(obj)
        except ValueError as exc:
            return SampleError(f"line {n}: {exc}")
        if common["t"] is None:
            common["t"] = rec.timestamp  # seconds already, where Mooncake's are milliseconds
        return Request(hash_ids=rec.hash_ids, input_length=rec.input_length, trace=hashtrace.BAILIAN, chat_id=rec.chat_id,
                       parent_chat_id=rec.parent_chat_id, request_type=rec.request_type, turn=rec.turn, **common)
    if hashtrace.is_record(obj):
        try:
            stamp, ids, length = hashtrace.fields(obj)
        except ValueError as exc:
            return SampleError(f"line {n}: {exc}")
        if common["t"] is None and stamp is not None:
            common["t"] = stamp / 1000
        return Request(hash_ids=ids, input_length=length, trace=hashtrace.MOONCAKE, **common)
    if "prompt_token_ids" in obj:
        ids = obj["prompt_token_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            return SampleError(f"line {n}: `prompt_token_ids` must be a non-empty list of integers")
        if len(ids) > hashtrace.MAX_IDS_PER_LINE:
            return SampleError(f"line {n}: `prompt_token_ids` holds {len(ids):,} tokens, more than the {hashtrace.MAX_IDS_PER_LINE:,} a prompt can have")
        return Request(tokens=tuple(ids), **common)
    if "body" in obj:
        body = obj["body"]
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return SampleError(f"line {n}: `body` must be a chat-completions request with a non-empty `messages` list")
        if problem := content_problem(body):
            return SampleError(f"line {n}: `body`: {problem}")
        salt = common.pop("salt") or _text(body.get("cache_salt"))
        return Request(body=body, salt=salt, **common)
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            return SampleError(f"line {n}: `prompt` must be a non-empty string")
        return Request(prompt=obj["prompt"], **common)
    return SampleError(f"line {n}: one of `prompt_token_ids`, `body`, `prompt` or `hash_ids` with `input_length` is required")


def _text(value) -> str | None:
    return None if value is None else str(value)


def _from_log(n: int, text: str) -> Request | SampleError:
    """`Received request ID: prompt: 'text', params: ..., prompt_token_ids: [1, 2], ...
    lora_request: ...` as vLLM's request logger prints it (the params are called
    `sampling_params` in older versions, and newer ones add `prompt_embeds shape`)."""
    m = _LOG_REQUEST.search(text)
    if m is None:
        return SampleError(f"line {n}: a vLLM request-log line without `Received request ID: prompt:`")
    rest = m.group("rest")
    prompt, rest = _leading_literal(rest)
    ids = None
    at = rest.find("prompt_token_ids: ")
    if at >= 0:
        raw, _ = _leading_literal(rest[at + len("prompt_token_ids: "):])
        if isinstance(raw, list) and raw:
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in raw):
                return SampleError(f"line {n}: prompt_token_ids must be a list of integers")
            if len(raw) > hashtrace.MAX_IDS_PER_LINE:
                return SampleError(f"line {n}: prompt_token_ids holds {len(raw):,} tokens, more than the {hashtrace.MAX_IDS_PER_LINE:,} a prompt can have")
            ids = tuple(raw)
    lora = _LORA_NAME.search(rest)
    if ids is None and not isinstance(prompt, str):
        return SampleError(f"line {n}: the log line has neither prompt text nor prompt_token_ids (raise --max-log-len?)")
    return Request(line=n, t=_log_time(text), session=None, tokens=ids, prompt=prompt if ids is None else None,
                   lora=lora.group(1) if lora else None)


def _leading_literal(text: str):
    """The Python literal (a repr'd string, a list, None) at the start of `text`, and the rest."""
    text = text.lstrip()
    if text.startswith("None"):
        return None, text[4:]
    if text[:1] in ("'", '"'):
        quote, i = text[0], 1
        while i < len(text):
            if text[i] == "\\":
                i += 2
                continue
            if text[i] == quote:
                break
            i += 1
        try:
            return ast.literal_eval(text[: i + 1]), text[i + 1:]
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            return None, text
    if text.startswith("["):
        end = text.find("]")
        try:
            return ast.literal_eval(text[: end + 1]), text[end + 1:]
        except (ValueError, SyntaxError, RecursionError, MemoryError):  # a hostile line: `[[[[...` nests deeper than the parser goes
            return None, text
    return None, text


def _log_time(text: str) -> float | None:
    m = _LOG_TIME.match(text)
    if not m:
        return None
    month, day, hh, mm, ss = (int(x) for x in m.groups())
    return float(((month * 31 + day) * 24 + hh) * 3600 + mm * 60 + ss)  # ordering only: the log has no year

"""What a person reads of KV events: the tokens where a prompt changes, and a name for
each prompt group. Pure: the decoder (token ids -> text) is handed in, token ids are
shown as numbers without one."""
from __future__ import annotations

from typing import Callable, Sequence

from .blockindex import Divergence

Decode = Callable[[Sequence[int]], str]
SHOWN = 12  # tokens shown of a changed span and, without a tokenizer, of the context before it
LINE_TOKENS, LINE_CHARS = 64, 80  # the line a change is in: decoded from this far back, shown up to this long


def ids(tokens: Sequence[int]) -> str:
    return "[" + " ".join(map(str, tokens)) + "]"


def _quote(text: str) -> str:
    return "`" + " ".join(text.replace("`", "'").split()) + "`"


def divergence(d: Divergence, decode: Decode | None) -> str:
    """"the first 12 tokens of the prompt are the same; token 13 changes: `Current date and time: 2026-12-07 17:4`
    then `2:13.52` where the cached prefix has `1:58.07`": the line it changes in, from its start."""
    same = d.same_tokens
    where = (f"the first {same} tokens of the prompt are the same; token {same + 1} changes" if same is not None
             else f"{d.offset} tokens into a block whose place in the prompt is unknown, a token changes")
    now, was = d.after[d.offset:d.offset + SHOWN], d.before[d.offset:d.offset + SHOWN]
    if decode is None:
        return f"{where}: {ids(d.after[max(0, d.offset - SHOWN):d.offset])} then {ids(now)} where the cached prefix has {ids(was)}"
    line = decode(d.after[max(0, d.offset - LINE_TOKENS):d.offset]).rsplit("\n", 1)[-1][-LINE_CHARS:]
    cut = lambda tokens: decode(tokens).split("\n", 1)[0]
    return f"{where}: {_quote(line)} then {_quote(cut(now))} where the cached prefix has {_quote(cut(was))}"


def group_labels(reps: dict[str, tuple[Sequence[int], int]], decode: Decode | None, width: int = 40) -> dict[str, str]:
    """Each group's first block from where it differs from the groups before it (`reps`:
    group -> (tokens, that offset), fixed when the group was first seen, so its label
    stays), not from the template they share."""
    show = decode or ids
    out = {}
    for group, (tokens, start) in reps.items():
        text = " ".join(show(tokens[max(0, start - 2):]).split())
        out[group] = ("…" if start > 2 else "") + text[:width]
    return out

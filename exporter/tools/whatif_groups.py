"""The what-if analysis by group of requests: which prefixes lose the most. Pure.

The fleet's hit ratio is one number; under prefix-hash routing a cold or dead replica
hurts the prefixes it serves, and round robin hurts the long, rarely repeated ones most.
Grouping the sample's requests by their first block (the start of the system prompt: a
tenant or an application) and replaying once per policy gives each group its own ratio,
the points it lost from its own ceiling, and its share of the points the sample lost, so
"tenant X's prompt lost 30 points under round robin" is one line. Traces that say a
request's type or turn are grouped by those the same way.
"""
from __future__ import annotations

from typing import Callable, Hashable, Sequence

TOP_GROUPS = 10  # the groups shown; the rest are summed in one line
TURN_BUCKETS = ((1, "1"), (2, "2"), (4, "3-4"), (8, "5-8"))  # upper bound, label; beyond: "9+"


def turn_bucket(turn: int | None) -> str | None:
    if turn is None:
        return None
    return next((label for top, label in TURN_BUCKETS if turn <= top), "9+")


def distinct_starts(texts: dict[Hashable, str]) -> dict[Hashable, int]:
    """Where each text first differs from every other: the characters it shares with its
    closest text (its neighbours in sorted order), so prompts that differ only in a
    timestamp are told apart by the timestamp, not by the template they share."""
    ordered = sorted(texts.items(), key=lambda kv: kv[1])
    shared = lambda a, b: next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    out = {}
    for n, (key, text) in enumerate(ordered):
        near = [ordered[m][1] for m in (n - 1, n + 1) if 0 <= m < len(ordered)]
        out[key] = max((shared(text, other) for other in near), default=0)
    return out


def groups(keys: Sequence[Hashable], tokens: Sequence[int], counted: Sequence[bool], ceiling_hits: Sequence[int],
           hits: dict[str, Sequence[int]], describe: Callable[[int], dict], top: int | None = TOP_GROUPS,
           tags: Sequence[str | None] | None = None) -> dict:
    """The counted requests grouped by `keys` (one per request), the `top` groups by prompt
    tokens first (None: all): `{"groups": [...], "rest": {...} or None, "count": n}`.

    `ceiling_hits` are each request's hit tokens at the ceiling (1 replica, unlimited
    cache), `hits` each policy's; `describe(i)` names a group by its first request i;
    `tags` (a request's type) are counted per group."""
    policies = list(hits)
    columns = [hits[p] for p in policies]
    # per group, in one pass: [first request, requests, tokens, ceiling hits, each policy's hits]
    sums: dict[Hashable, list] = {}
    tagged: dict[Hashable, dict[str, int]] = {}
    for i, key in enumerate(keys):
        if not counted[i]:
            continue
        row = sums.get(key)
        if row is None:
            row = sums[key] = [i, 0, 0, 0] + [0] * len(policies)
        row[1] += 1
        row[2] += tokens[i]
        row[3] += ceiling_hits[i]
        for k, column in enumerate(columns):
            row[4 + k] += column[i]
        if tags is not None and tags[i] is not None:
            counts = tagged.setdefault(key, {})
            counts[tags[i]] = counts.get(tags[i], 0) + 1
    total = sum(row[2] for row in sums.values())
    lost = {p: sum(row[3] - row[4 + k] for row in sums.values()) for k, p in enumerate(policies)}
    ordered = sorted(sums.items(), key=lambda kv: (-kv[1][2], kv[1][0]))
    shown, rest = (ordered, []) if top is None else (ordered[:top], ordered[top:])
    out = []
    for key, row in shown:
        entry = {**describe(row[0]), **_stats(row, policies, total, lost)}
        if key in tagged:
            entry["types"] = dict(sorted(tagged[key].items(), key=lambda kv: (-kv[1], kv[0])))
        out.append(entry)
    summed = None
    if rest:
        row = [None] + [sum(r[k] for _, r in rest) for k in range(1, 4 + len(policies))]
        summed = {"groups": len(rest), **_stats(row, policies, total, lost)}
    return {"groups": out, "rest": summed, "count": len(sums)}


def _stats(row: list, policies: Sequence[str], total: int, lost: dict[str, int]) -> dict:
    _, requests, n, ceiling = row[:4]
    by_policy = dict(zip(policies, row[4:]))
    ratio = lambda h: h / n if n else 0.0
    return {"requests": requests, "prompt_tokens": n, "share_of_tokens": n / total if total else 0.0,
            "ceiling": ratio(ceiling), "policies": {p: ratio(h) for p, h in by_policy.items()},
            # the group's own ratio: its ceiling less what the policy gets
            "points_lost": {p: round((ceiling - h) / n * 100, 2) if n else 0.0 for p, h in by_policy.items()},
            # its part of what the whole sample lost under the policy (null: the sample lost nothing)
            "share_of_lost": {p: (ceiling - h) / lost[p] if lost[p] else None for p, h in by_policy.items()}}


def report_lines(title: str, grouped: dict, name: Callable[[dict], str], main: str) -> list[str]:
    """A table: one line per group (`name` of its entry), each policy's ratio with the points
    it lost from the group's ceiling, and the group's share of the sample's loss under `main`."""
    if not grouped["groups"]:
        return []
    policies = list(grouped["groups"][0]["policies"])
    widths = {p: max(15, len(p) + 2) for p in policies}
    human = lambda n: f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)
    lines = [title, f"  {'':<40} {'requests':>8} {'tokens (share)':>15} {'ceiling':>8}"
             + "".join(f"{p:>{widths[p]}}" for p in policies) + f"  share of the loss ({main})"]

    def line(label: str, g: dict) -> str:
        cells = "".join(f"{g['policies'][p] * 100:>{widths[p] - 7}.1f}% {-g['points_lost'][p]:+5.1f}" for p in policies)
        share = g["share_of_lost"].get(main)
        return (f"  {label[:40]:<40} {g['requests']:>8} {human(g['prompt_tokens']):>8} ({g['share_of_tokens']:>4.0%}) "
                f"{g['ceiling'] * 100:>7.1f}%{cells}  {'-' if share is None else f'{share:.0%}'}")

    lines += [line(name(g), g) for g in grouped["groups"]]
    if grouped["rest"]:
        lines.append(line(f"the other {grouped['rest']['groups']} group(s)", grouped["rest"]))
    return lines

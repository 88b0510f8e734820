"""vLLM's /metrics text -> Snapshot.

A parser that reads only the lines named in the one table of upstream names
(exporter/parse/names.py). Reading only what we need is what makes it fast: a current
vLLM payload is mostly histogram buckets we never look at.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable
from itertools import count
from operator import itemgetter
from sys import intern

# what the parser builds; the types live in snapshot.py, which their users import
from . import tiers
from .filing import SeriesBuilder, Warnings, finish
from .names import BY_SOURCE, CACHED_BY_SOURCE, DECLARED_FAMILY, ENGINE_OF, ROLE_BY_NAME, SGLANG_CACHED_TOKENS, SLEEP_STATES, UNIT_FROM_HELP
from .router_metrics import RouterBuilder
from .snapshot import Snapshot

# Why a sample is refused (counted per target): the parser refuses counters of +Inf, NaN
# or below zero, and start times (process_start_time_seconds, `_created`) that are not a
# finite time; the window refuses a counter that steps back a little without a restart,
# and the restart detector start times that flap between processes behind one URL. The
# Prometheus source refuses a sample at no finite time or after its query's time: a range
# selector answers none there, and one read became the pod's newest for good.
FUTURE_TIMESTAMP, NON_FINITE_TIMESTAMP = "future_timestamp", "non_finite_timestamp"
REJECT_REASONS = ("non_finite_counter", "negative_counter", "counter_too_large", "non_finite_start_time", "counter_step_back",
                  "flapping_start_time", "label_value_too_long", FUTURE_TIMESTAMP, NON_FINITE_TIMESTAMP)
# A counter above this is refused (counter_too_large): past 2**53 a float no longer holds
# every integer, and a reset after such a value adds it to every later sample as an
# offset (exporter/series/history.py), so one spike to 1e20 quantized a pod's windows for
# good (1e308 + x == 1e308). No engine counts that far: 2**53 tokens at a million a second
# take 285 years.
MAX_COUNTER = 2.0 ** 53
# A label value we key on and export (a model name, an engine, a cache setting) longer than
# this is refused with its sample: four 1.9 MB model names made our /metrics 144 MB.
MAX_LABEL_VALUE = 1024


# --- the parser ----------------------------------------------------------------------
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,|$)')
_UNESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def _labels(text: str) -> dict[str, str] | None:
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
        if m.group(1) in out:  # a label twice: Prometheus refuses the sample, so do we
            return None
        out[m.group(1)] = value
        pos = m.end()
        if m.group(3) == "" and pos < end:
            return None
    return out


def _sample(line: str, brace: int) -> tuple[dict[str, str] | None, str] | None:
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
        return _labels(text), rest[0]
    # without a backslash no value can hold a quote, so '",' only separates labels
    parts = text.split('",')
    last = parts[-1]
    if last.endswith('"'):
        parts[-1] = last[:-1]
    elif not last.strip():
        parts.pop()  # a trailing comma
    else:
        return None, rest[0]
    labels = {}
    for part in parts:
        key, sep, value = part.partition('="')
        key = key.strip()
        if not sep or not key or '"' in value or not (key[0].isalpha() or key[0] == "_") or key in labels:
            return None, rest[0]
        labels[key] = value
    return labels, rest[0]


def _le(text: str, known: dict[str, float]) -> float | None:
    """A bucket's bound, one float object per distinct bound text in a parse: the
    histograms of thousands of series share 23 objects instead of holding 23 each, which
    a history compares at every poll (NaN is never shared: it equals nothing, itself too)."""
    le = known.get(text)
    if le is None:
        try:
            le = float(text)
        except ValueError:
            return None
        if le == le:
            known[text] = le
    return le


# A `# TYPE` line names a family; families we never read are skipped whole.
_WANTED_FAMILIES = {n for name in ROLE_BY_NAME for n in (name, name.removesuffix("_total"), name.removesuffix("_bucket"),
                                                           name.removesuffix("_sum"), name.removesuffix("_count"))}


def _chunks(text: str):
    """(number of its first line, lines) of each stretch of the body that starts at a
    comment line (or the body's start) and runs up to the next one, split in one call,
    jumping over the samples of families we never read. The jump happens only when every
    line up to the next comment really starts with that family's name, so stray or
    misplaced samples are still seen: then the `# TYPE` line comes alone."""
    pos, lineno, end_of_text = 0, 1, len(text)
    crlf = "\r" in text
    while pos < end_of_text:
        # text.find("\n#", pos), at memchr's speed: '#' is rare and a one-character find is fast
        stop = text.find("#", pos + 1)
        while stop != -1 and text[stop - 1] != "\n":
            stop = text.find("#", stop + 1)
        stop = end_of_text if stop == -1 else stop - 1
        if text.startswith("# TYPE ", pos):
            eol = text.find("\n", pos, stop)
            eol = stop if eol == -1 else eol
            line = text[pos:eol]
            family = line[7:].partition(" ")[0]
            if family not in _WANTED_FAMILIES:
                samples = text.count("\n", eol, stop)
                if text.count("\n" + family, eol, stop) == samples:
                    yield lineno, (line.rstrip("\r"),)
                    lineno += 1 + samples
                    pos = stop + 1
                    continue
        lines = text[pos:stop].split("\n")
        if crlf:
            lines = [text_line.rstrip("\r") for text_line in lines]
        yield lineno, lines
        lineno += len(lines)
        pos = stop + 1


# the kinds whose values must be counters (finite, not negative), and start times (finite)
_COUNTER_KINDS = frozenset({"counter", "bucket", "sum", "max", "by_source", "by_cached_source", "bucket_sum", "router", "tier", "hist_bucket"})
_START_TIME_KINDS = frozenset({"process", "created"})
# the roles that split one family into a field a label value: (label, its known values)
_SPLIT_BY = {"by_source": ("source", BY_SOURCE), "by_sleep_state": ("sleep_state", SLEEP_STATES),
             "by_cached_source": ("source", CACHED_BY_SOURCE)}


# A memo keeps this many times the labelled samples of the last body (plus a floor) before it is emptied
MEMO_SLACK, MEMO_FLOOR = 4, 64


def parse(text: str, series_limit: int = 0, memo: dict[str, dict[str, str]] | None = None) -> Snapshot:
    """Parse one /metrics body. Never raises: what cannot be read becomes a warning. With
    `series_limit`, parsing stops at the first (model, engine) series past it: a body of
    236,000 series is refused after the limit's worth, not read whole first.

    `memo`, a dict the caller keeps for one target between its bodies (Prometheus's scrape
    cache): a series' text up to its value (`name{labels}`) -> its labels, so that a series
    seen before is not parsed again; the same Snapshot as without it. It holds at most
    MEMO_SLACK times the last body's labelled samples (plus MEMO_FLOOR): past that it is
    emptied, so a target whose labels keep changing costs memory in what it sends; a line
    longer than MAX_LABEL_VALUE is parsed every time, never kept. The labels it hands out
    are shared between snapshots and never changed."""
    warnings = Warnings()
    helps: dict[str, str] = {}
    declared: set[str] = set()  # TRT-LLM block-counter families with a `# TYPE` line
    seen = [0]
    snapshot = _build(_text_samples(text, warnings, helps, declared, memo, seen), series_limit, warnings, helps, declared)
    if memo is not None and len(memo) > MEMO_SLACK * seen[0] + MEMO_FLOOR:
        memo.clear()
    return snapshot


def parse_samples(samples: Iterable[tuple[str, dict[str, str], str, bool]], series_limit: int = 0,
                  plan: SamplePlan | None = None) -> Snapshot:
    """One scrape's samples as a source holds them apart (Prometheus's API): (name, its
    own labels, value text, long_labels(labels)) each, in the body's order -> the Snapshot
    parse() makes of the body they are (the same roles, checks and warnings; sample i
    stands for line i). No text is written and read back; a source has no HELP or TYPE
    lines to give. A series' labels and their `long` are the same at every sample: the
    source works `long` out once a series. With the `plan` of samples whose names,
    labels and `long` these equal, a scrape whose values are all fit is filed by it."""
    samples = list(samples)
    if plan is not None and plan.filed_as is not None and (not series_limit or len(plan.filed_as) <= series_limit) and samples:
        names, labels, values, longs = zip(*samples)
        if names == plan.names and longs == plan.longs and labels == plan.labels:
            snapshot = _build_planned(plan, values)
            if snapshot is not None:
                return snapshot
    warnings = Warnings()
    roles = ROLE_BY_NAME
    if samples and all(map(roles.__contains__, map(itemgetter(0), samples))):  # a source asks for these names alone
        numbered = zip(count(1), *zip(*samples))
    else:
        numbered = ((i, name, labels, value, long) for i, (name, labels, value, long) in enumerate(samples, 1) if name in roles)
    return _build(numbered, series_limit, warnings, {}, set())


def long_labels(labels: dict[str, str]) -> bool:
    """Whether `labels` may hold a value over MAX_LABEL_VALUE: a value over the bound makes
    the values' total over it (the cheap test, for the few whose values are checked one by one)."""
    return len("".join(labels.values())) > MAX_LABEL_VALUE


def _text_samples(text: str, warnings: Warnings, helps: dict[str, str], declared: set[str],
                  memo: dict[str, dict[str, str]] | None, seen: list[int]):
    """(line number, name, labels, value text, whether the line is long enough to hold a
    label value over the bound) of the body's samples that the table names;
    HELP and TYPE lines noted, malformed samples warned of. With `memo` (see parse), the
    labels of a series seen before are taken from it; `seen[0]` counts the labelled samples."""
    roles = ROLE_BY_NAME
    memo_get = memo.get if memo is not None else None
    for first, chunk in _chunks(text):
        for lineno, line in enumerate(chunk, first):
            if not line:
                continue
            if line[0] == "#":
                if line.startswith("# HELP "):
                    name, _, help_text = line[7:].partition(" ")
                    if name in UNIT_FROM_HELP:
                        helps[name] = help_text
                elif line.startswith("# TYPE "):
                    family = line[7:].partition(" ")[0]
                    if family in DECLARED_FAMILY:
                        declared.add(DECLARED_FAMILY[family])
                continue
            brace = line.find("{")
            space = line.find(" ")
            cut = brace if brace != -1 and (space == -1 or brace < space) else space
            name = line[:cut] if cut != -1 else line
            if name not in roles:
                continue
            if memo_get is not None and cut == brace:
                # the labels are line[brace + 1:close] and nothing else, whatever _sample makes of them
                seen[0] += 1
                head = line[:line.rfind("}") + 1]
                labels = memo_get(head)
                if labels is not None:
                    rest = line[len(head):].split()
                    if len(rest) in (1, 2):
                        yield lineno, name, labels, rest[0], len(line) > MAX_LABEL_VALUE
                        continue
                parsed = _sample(line, brace)
                if parsed is not None and parsed[0] is not None and len(line) <= MAX_LABEL_VALUE:
                    # names and values interned: the memos of a thousand targets share one copy of each;
                    # a line over the bound is not kept (its sample may be refused; a memo stays small)
                    parsed = {intern(k): intern(v) for k, v in parsed[0].items()}, parsed[1]
                    memo[head] = parsed[0]
            else:
                parsed = _sample(line, cut if cut == brace else -1)
            if parsed is None:
                warnings.append(f"line {lineno}: malformed sample for {name}")
                continue
            labels, value_text = parsed
            if labels is None:
                warnings.append(f"line {lineno}: malformed labels for {name} (bad syntax or a label twice)")
                continue
            # a value is part of its line: a line within the bound holds no value beyond it
            yield lineno, name, labels, value_text, len(line) > MAX_LABEL_VALUE


def _build(samples, series_limit: int, warnings: Warnings, helps: dict[str, str], declared: set[str]) -> Snapshot:
    """(line number, name, labels, value text, long) of the named samples -> the Snapshot;
    a long sample's label values are checked against the bound."""
    series: dict[tuple[str, str | None], SeriesBuilder] = {}
    infos: dict[str, list[dict[str, str]]] = {}
    process_start: float | None = None
    rejected: dict[str, int] = {}
    kinds: set[str] = set()
    trtllm_keys: set[tuple[str, str | None]] = set()
    router = RouterBuilder()
    bounds: dict[str, float] = {}  # le text -> its float, shared by every series
    roles = ROLE_BY_NAME
    over_series_limit = False

    for lineno, name, labels, value_text, long in samples:
        role = roles[name]
        if long and labels and any(len(v) > MAX_LABEL_VALUE for v in labels.values()):
            rejected["label_value_too_long"] = rejected.get("label_value_too_long", 0) + 1
            warnings.append(f"line {lineno}: {name} has a label value over {MAX_LABEL_VALUE} characters; sample dropped")
            continue
        try:
            value = float(value_text)
        except ValueError:
            warnings.append(f"line {lineno}: bad value {value_text[:40]!r} for {name}")
            continue
        kind, field_name = role
        if kind in _COUNTER_KINDS and not (0.0 <= value <= MAX_COUNTER):
            # one +Inf or NaN would poison every window of the series for good, one huge value too (MAX_COUNTER)
            reason = "negative_counter" if value < 0 else "counter_too_large" if math.isfinite(value) else "non_finite_counter"
            rejected[reason] = rejected.get(reason, 0) + 1
            warnings.append(f"line {lineno}: {name} has the value {value_text[:40]}; a counter must be finite, not negative "
                            f"and at most 2**53; sample dropped")
            continue
        if kind == "info":
            infos.setdefault(field_name, []).append(labels)
            continue
        if kind in _START_TIME_KINDS and not math.isfinite(value):
            # NaN != NaN: kept, it would be a changed start time, a restart, on every poll
            rejected["non_finite_start_time"] = rejected.get("non_finite_start_time", 0) + 1
            warnings.append(f"line {lineno}: {name} has the value {value_text[:40]}; a start time must be a finite time; sample dropped")
            continue
        if kind == "process":
            process_start = value
            continue
        if kind == "router":
            router.add(field_name, labels, value)
            continue
        model = labels.get("model_name")
        if model is None and ENGINE_OF[name] == "sglang":
            model = labels.get("name")  # pre-release SGLang builds
        if model is None:
            warnings.append(f"line {lineno}: {name} has no model_name label")
            continue
        engine_kind = ENGINE_OF[name]
        if engine_kind is not None:
            kinds.add(engine_kind)
        key = (model, labels.get("engine") if engine_kind == "vllm" else None)
        builder = series.get(key)
        if builder is None:
            if series_limit and len(series) >= series_limit:
                over_series_limit = True
                break
            builder = series[key] = SeriesBuilder()
        if engine_kind == "trtllm":
            trtllm_keys.add(key)
        if kind in ("bucket", "bucket_sum"):
            le = _le(labels.get("le", ""), bounds)
            if le is None:
                warnings.append(f"line {lineno}: {name} has a bad le label")
                continue
            builder.buckets[le] = value + (builder.buckets.get(le, 0.0) if kind == "bucket_sum" else 0.0)
        elif kind == "sum":
            builder.values[field_name] = builder.values.get(field_name, 0.0) + value
            if name == SGLANG_CACHED_TOKENS:
                tier = tiers.of_sglang(labels.get("cache_source"))
                builder.tiers[tier] = builder.tiers.get(tier, 0.0) + value
        elif kind == "tier":
            tier = tiers.of_trtllm(labels.get(field_name))
            builder.tiers[tier] = builder.tiers.get(tier, 0.0) + value
        elif kind == "hist_bucket":
            le = _le(labels.get("le", ""), bounds)
            if le is None:
                warnings.append(f"line {lineno}: {name} has a bad le label")
                continue
            builder.hists.setdefault(field_name, {})[le] = value
        elif kind in ("max", "gauge_max"):
            builder.values[field_name] = max(builder.values.get(field_name, value), value)
        elif kind in _SPLIT_BY:  # one field a value of the label, from a closed set
            label, known = _SPLIT_BY[kind]
            part = labels.get(label)
            if part not in known:
                warnings.append(f"line {lineno}: {name} has an unknown {label} {part!r}")
                continue
            builder.values[field_name + part] = value
        elif kind == "created":
            builder.created[field_name] = value
        elif field_name in builder.values:
            if kind != "gauge" or "pid" not in labels:
                warnings.append(f"line {lineno}: duplicate sample for {name} {key}; keeping the last")
                builder.values[field_name] = value
            else:
                # multiprocess mode gives some gauges a pid label, one row a process
                builder.values[field_name] = max(builder.values[field_name], value)
        else:
            builder.values[field_name] = value

    return finish(series, infos, process_start, rejected, kinds, trtllm_keys, router, warnings, helps, declared, over_series_limit)


# kinds a plan files by assignment alone
_ASSIGNED = frozenset({"counter", "gauge", "bucket", "created", "process", "info", *_SPLIT_BY})
_NOT_NEGATIVE, _NOT_TOO_LARGE, _PLUS_ZERO = (0.0).__le__, MAX_COUNTER.__ge__, (0.0).__add__


def _taker(indices: list[int]):
    """xs -> the tuple of xs at `indices` (itemgetter's, also for one index or none)."""
    if len(indices) > 1:
        return itemgetter(*indices)
    if indices:
        only = indices[0]
        return lambda xs: (xs[only],)
    return lambda xs: ()


class SamplePlan:
    """What parse_samples files a structure of samples as (their names, labels and
    `long`, in order), the values aside: the Prometheus source reads the same series of a
    pod at every scrape, and the roles, models, keys and bounds of its samples are the
    same each time. `filed_as` is None where filing depends on more than the values being
    fit (a warning the structure itself gives, a kind that adds or keeps a maximum, a
    router's samples): such samples go through the loop every time."""

    __slots__ = ("names", "labels", "longs", "filed_as", "infos", "process", "kinds", "trtllm_keys", "counters", "times")

    def __init__(self, names: tuple[str, ...], labels: tuple[dict[str, str], ...], longs: tuple[bool, ...]):
        self.names, self.labels, self.longs = names, labels, longs
        self.filed_as = None
        self.infos: dict[str, list[dict[str, str]]] = {}
        self.process = None
        self.kinds: set[str] = set()
        self.trtllm_keys: set[tuple[str, str | None]] = set()
        self.counters = self.times = _taker([])
        filed_as = self._file()
        if filed_as is not None:
            self.filed_as = {key: (fields, _taker(at), les, _taker(bucket_at), created, _taker(created_at))
                             for key, (fields, at, les, bucket_at, created, created_at) in filed_as.items()}

    def _file(self):
        """Each sample's place, as _build's loop would file it; None where that loop would
        warn, keep a maximum or add values up, whatever the values."""
        roles = ROLE_BY_NAME
        filed_as: dict[tuple[str, str | None], tuple[list, list, list, list, list, list]] = {}
        assigned: dict[tuple[str, str | None], set[str]] = {}  # each series' value fields so far
        bounds: dict[str, float] = {}
        counters, times, process = [], [], None
        for i, (name, labels, long) in enumerate(zip(self.names, self.labels, self.longs)):
            role = roles.get(name)
            if role is None:
                return None
            kind, field_name = role
            if kind not in _ASSIGNED or (long and labels and any(len(v) > MAX_LABEL_VALUE for v in labels.values())):
                return None
            if kind in _COUNTER_KINDS:
                counters.append(i)
            if kind in _START_TIME_KINDS:
                times.append(i)
            if kind == "info":
                self.infos.setdefault(field_name, []).append(labels)
                continue
            if kind == "process":
                process = i
                continue
            model = labels.get("model_name")
            if model is None and ENGINE_OF[name] == "sglang":
                model = labels.get("name")
            if model is None:
                return None
            engine_kind = ENGINE_OF[name]
            if engine_kind is not None:
                self.kinds.add(engine_kind)
            key = (model, labels.get("engine") if engine_kind == "vllm" else None)
            if engine_kind == "trtllm":
                self.trtllm_keys.add(key)
            fields, at, les, bucket_at, created, created_at = filed_as.setdefault(key, ([], [], [], [], [], []))
            if kind == "bucket":
                le = _le(labels.get("le", ""), bounds)
                if le is None or le != le:
                    return None  # a bad bound warns; NaN bounds are each their own key
                les.append(le)
                bucket_at.append(i)
            elif kind in _SPLIT_BY:
                label, known = _SPLIT_BY[kind]
                part = labels.get(label)
                if part not in known:
                    return None
                fields.append(field_name + part)  # written over by a second one, as the loop does
                at.append(i)
                assigned.setdefault(key, set()).add(field_name + part)
            elif kind == "created":
                created.append(field_name)
                created_at.append(i)
            else:  # counter, gauge: a second sample of a field warns (or keeps a maximum)
                if field_name in assigned.setdefault(key, set()):
                    return None
                assigned[key].add(field_name)
                fields.append(field_name)
                at.append(i)
        self.counters, self.times, self.process = _taker(counters), _taker(times), process
        return filed_as


def _build_planned(plan: SamplePlan, value_texts: tuple[str, ...]) -> Snapshot | None:
    """_build of samples of the plan's structure, when every value is a number and
    every counter and time is fit (else None: the loop files them, with its warnings)."""
    try:
        values = list(map(float, value_texts))
    except ValueError:
        return None
    counters = plan.counters(values)
    if not all(map(_NOT_NEGATIVE, counters)) or not all(map(_NOT_TOO_LARGE, counters)) or not all(map(math.isfinite, plan.times(values))):
        return None
    series: dict[tuple[str, str | None], SeriesBuilder] = {}
    for key, (fields, at, les, bucket_at, created, created_at) in plan.filed_as.items():
        builder = series[key] = SeriesBuilder()
        builder.values = dict(zip(fields, at(values)))
        builder.buckets = dict(zip(les, map(_PLUS_ZERO, bucket_at(values))))  # the loop's `value + 0.0`: -0.0 is 0.0 there
        builder.created = dict(zip(created, created_at(values)))
    infos = {field_name: list(labels) for field_name, labels in plan.infos.items()}
    process_start = values[plan.process] if plan.process is not None else None
    return finish(series, infos, process_start, {}, set(plan.kinds), set(plan.trtllm_keys), RouterBuilder(), Warnings(), {}, set(), False)


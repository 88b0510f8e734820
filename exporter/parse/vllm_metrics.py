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
from . import cacheconfig, tiers, trtllm
from .names import (BY_SOURCE, CACHED_BY_SOURCE, DECLARED_FAMILY, ENGINE_OF, GPU_PREFIX_HITS, GPU_PREFIX_QUERIES, ROLE_BY_NAME,
                    SGLANG_CACHED_TOKENS, SLEEP_STATES, TRTLLM_MISSED_BLOCKS, TRTLLM_REUSED_BLOCKS, TRTLLM_TOKENS_PER_BLOCK,
                    TRTLLM_ZERO_WHEN_DECLARED, UNIT_FROM_HELP)
from .router_metrics import RouterBuilder
from .snapshot import MAX_WARNINGS, CounterPair, Histogram, SeriesSnapshot, Snapshot

# Why a sample is refused (counted per target): the parser refuses counters of +Inf, NaN
# or below zero, and start times (process_start_time_seconds, `_created`) that are not a
# finite time; the window refuses a counter that steps back a little without a restart,
# and the restart detector start times that flap between processes behind one URL.
REJECT_REASONS = ("non_finite_counter", "negative_counter", "non_finite_start_time", "counter_step_back", "flapping_start_time",
                  "label_value_too_long")
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


# the roles that split one family into a field a label value: (label, its known values)
_SPLIT_BY = {"by_source": ("source", BY_SOURCE), "by_sleep_state": ("sleep_state", SLEEP_STATES),
             "by_cached_source": ("source", CACHED_BY_SOURCE)}


class _SeriesBuilder:
    __slots__ = ("values", "buckets", "created", "tiers", "hists")

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.buckets: dict[float, float] = {}
        self.created: dict[str, float] = {}
        self.tiers: dict[str, float] = {}  # cache tier -> cached prompt tokens
        self.hists: dict[str, dict[float, float]] = {}  # KV residency histograms: name -> le -> count


class _Warnings:
    """A list's `append` that keeps the first MAX_WARNINGS and counts every one."""

    __slots__ = ("kept", "total")

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.total = 0

    def append(self, warning: str) -> None:
        self.total += 1
        if len(self.kept) < MAX_WARNINGS:
            self.kept.append(warning)


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
    warnings = _Warnings()
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
    warnings = _Warnings()
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


def _text_samples(text: str, warnings: _Warnings, helps: dict[str, str], declared: set[str],
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


def _build(samples, series_limit: int, warnings: _Warnings, helps: dict[str, str], declared: set[str]) -> Snapshot:
    """(line number, name, labels, value text, long) of the named samples -> the Snapshot;
    a long sample's label values are checked against the bound."""
    series: dict[tuple[str, str | None], _SeriesBuilder] = {}
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
        if kind in ("counter", "bucket", "sum", "max", "by_source", "by_cached_source", "bucket_sum", "router", "tier", "hist_bucket") and not (0.0 <= value < math.inf):
            # one +Inf or NaN would poison every window of the series for good
            reason = "negative_counter" if value < 0 else "non_finite_counter"
            rejected[reason] = rejected.get(reason, 0) + 1
            warnings.append(f"line {lineno}: {name} has the value {value_text[:40]}; a counter must be finite and not negative; sample dropped")
            continue
        if kind == "info":
            infos.setdefault(field_name, []).append(labels)
            continue
        if kind in ("process", "created") and not math.isfinite(value):
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
            builder = series[key] = _SeriesBuilder()
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

    return _finish(series, infos, process_start, rejected, kinds, trtllm_keys, router, warnings, helps, declared, over_series_limit)


def _finish(series: dict[tuple[str, str | None], _SeriesBuilder], infos: dict[str, list[dict[str, str]]], process_start: float | None,
            rejected: dict[str, int], kinds: set[str], trtllm_keys: set[tuple[str, str | None]], router: RouterBuilder,
            warnings: _Warnings, helps: dict[str, str], declared: set[str], over_series_limit: bool) -> Snapshot:
    """What the samples were filed as -> the Snapshot."""
    gpu_unit = _gpu_pair_unit(helps)
    for key in trtllm_keys:
        values = series[key].values
        if any(f in values for f in TRTLLM_ZERO_WHEN_DECLARED.values()):
            for family, field_name in TRTLLM_ZERO_WHEN_DECLARED.items():
                if family in declared:
                    values.setdefault(field_name, 0.0)
    # LMCache's tokens stand in for vLLM's external counters only where those are missing
    vllm_external = {m for (m, _), b in series.items() if "external_queries" in b.values}
    built = []
    for (model, engine), b in sorted(series.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        built.append(_series(model, engine, b, gpu_unit, warnings, use_lmcache=model not in vllm_external))

    cache_config = cacheconfig.single_info(infos.get("cache_config"), "cache_config_info", warnings)
    lora = cacheconfig.single_info(infos.get("lora"), "lora_requests_info", warnings)
    v0_gauges = [b.values["v0_gpu_hit_rate"] for b in series.values() if "v0_gpu_hit_rate" in b.values]
    enabled, block_size = cacheconfig.settings(cache_config, v0_gauges, warnings)
    if block_size is None:
        block_size = trtllm.block_size([b.values for b in series.values()], TRTLLM_TOKENS_PER_BLOCK, warnings)
    if gpu_unit is None and any(b.values.get("gpu_queries") is not None and "queries" not in b.values for b in series.values()):
        warnings.append("vllm:gpu_prefix_cache_* has no HELP line; assuming tokens (0.9.x) not blocks (0.8.x)")
    return Snapshot(
        prefix_caching_enabled=enabled,
        block_size=block_size,
        series=tuple(built),
        warnings=tuple(warnings.kept),
        warnings_dropped=warnings.total - len(warnings.kept),
        process_start_time=process_start,
        cache_config=tuple(sorted(cache_config.items())) if cache_config is not None else None,
        lora_config=tuple(sorted((k, v) for k, v in lora.items() if k not in ("running_lora_adapters", "waiting_lora_adapters"))) if lora is not None else None,
        rejected=tuple(sorted(rejected.items())),
        engine_kind=_engine_kind(kinds),
        router=router.build(),
        over_series_limit=over_series_limit,
    )


# kinds a plan files by assignment alone, and those whose values must be counters or times
_ASSIGNED = frozenset({"counter", "gauge", "bucket", "created", "process", "info", *_SPLIT_BY})
_COUNTERS = frozenset({"counter", "bucket", "by_source", "by_cached_source"})
_TIMES = frozenset({"process", "created"})
_NOT_NEGATIVE, _BELOW_INF, _PLUS_ZERO = (0.0).__le__, math.inf.__gt__, (0.0).__add__


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
            if kind in _COUNTERS:
                counters.append(i)
            if kind in _TIMES:
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
    if not all(map(_NOT_NEGATIVE, counters)) or not all(map(_BELOW_INF, counters)) or not all(map(math.isfinite, plan.times(values))):
        return None
    series: dict[tuple[str, str | None], _SeriesBuilder] = {}
    for key, (fields, at, les, bucket_at, created, created_at) in plan.filed_as.items():
        builder = series[key] = _SeriesBuilder()
        builder.values = dict(zip(fields, at(values)))
        builder.buckets = dict(zip(les, map(_PLUS_ZERO, bucket_at(values))))  # the loop's `value + 0.0`: -0.0 is 0.0 there
        builder.created = dict(zip(created, created_at(values)))
    infos = {field_name: list(labels) for field_name, labels in plan.infos.items()}
    process_start = values[plan.process] if plan.process is not None else None
    return _finish(series, infos, process_start, {}, set(plan.kinds), set(plan.trtllm_keys), RouterBuilder(), _Warnings(), {}, set(), False)


def _engine_kind(kinds: set[str]) -> str | None:
    """Whose names the text uses; vLLM's where it holds several (LMCache and
    connectors write into vLLM's own /metrics)."""
    if "vllm" in kinds or len(kinds) > 1:
        return "vllm" if "vllm" in kinds else sorted(kinds)[0]
    return next(iter(kinds), None)


def _gpu_pair_unit(helps: dict[str, str]) -> str | None:
    for name in (GPU_PREFIX_QUERIES, GPU_PREFIX_HITS):
        text = helps.get(name, "").lower()
        if "block" in text:
            return "blocks"
        if "token" in text:
            return "tokens"
    return None


def _pair(values: dict[str, float], queries: str, hits: str, unit: str, what: str, warnings: list[str]) -> CounterPair | None:
    q, h = values.get(queries), values.get(hits)
    if q is None and h is None:
        return None
    if q is None or h is None:
        warnings.append(f"{what}: only {'hits' if q is None else 'queries'} of the hits/queries pair is present")
    return CounterPair(queries=q, hits=h, unit=unit)


def _prefix_pair(values: dict[str, float], gpu_unit: str | None, what: str, warnings: list[str]) -> CounterPair | None:
    """The new pair wins; the deprecated `gpu_` pair is never added to it. A half
    missing from the new pair (an excerpt, a cut body) is taken from the deprecated
    one, which counts the same tokens in 0.9.2-0.11.x."""
    new = _pair(values, "queries", "hits", "tokens", what, [])
    old_unit = gpu_unit or "tokens"
    old = _pair(values, "gpu_queries", "gpu_hits", old_unit, what, [])
    if new is None:
        if old is not None and (old.queries is None or old.hits is None):
            warnings.append(f"{what}: only one half of vllm:gpu_prefix_cache_* is present")
        return old
    if (new.queries is None or new.hits is None) and old is not None and old_unit == "tokens":
        queries = new.queries if new.queries is not None else old.queries
        hits = new.hits if new.hits is not None else old.hits
        warnings.append(f"{what}: vllm:prefix_cache_* is incomplete; the missing half is read from the deprecated gpu_ pair")
        new = CounterPair(queries=queries, hits=hits, unit="tokens")
    if new.queries is None or new.hits is None:
        warnings.append(f"{what}: only one half of vllm:prefix_cache_* is present")
    return new


def _series(model: str, engine: str | None, b: _SeriesBuilder, gpu_unit: str | None, warnings: list[str],
            use_lmcache: bool = True) -> SeriesSnapshot:
    v = b.values
    what = f"model_name={model!r} engine={engine!r}"
    # 0.9.2-0.11.x expose both pairs: the new one wins, they are never added.
    prefix = _prefix_pair(v, gpu_unit, what, warnings)
    if prefix is None and "sglang_prompt_tokens" in v:
        # SGLang: cached tokens of all tiers over prompt tokens, both counted at request finish
        prefix = CounterPair(queries=v["sglang_prompt_tokens"], hits=v.get("sglang_cached_tokens"), unit="tokens")
    if prefix is None:
        prefix = trtllm.block_pair(v, what, warnings, (TRTLLM_REUSED_BLOCKS, TRTLLM_MISSED_BLOCKS, TRTLLM_TOKENS_PER_BLOCK))
    external = _pair(v, "external_queries", "external_hits", "tokens", what + " external", warnings)
    if external is None and use_lmcache and ("lmcache_requested" in v or "lmcache_hit" in v):
        external = _pair(v, "lmcache_requested", "lmcache_hit", "tokens", what + " lmcache", warnings)
    by_source = tuple((s, v["source_" + s]) for s in BY_SOURCE if "source_" + s in v) or None
    cached_by_source = tuple((s, v["cached_source_" + s]) for s in CACHED_BY_SOURCE if "cached_source_" + s in v) or None
    # either `_created` dates the same process start; a change of it is a restart
    created = b.created.get("new", b.created.get("deprecated"))
    ttft = None
    if b.buckets or "ttft_count" in v or "ttft_sum" in v:
        buckets = tuple(sorted(b.buckets.items()))
        count = v.get("ttft_count")
        if not buckets or not math.isinf(buckets[-1][0]):
            warnings.append(f"{what}: TTFT histogram has no +Inf bucket (truncated?)")
        ttft = Histogram(buckets=buckets, count=count, sum=v.get("ttft_sum"))
    v0 = v.get("v0_gpu_hit_rate")
    return SeriesSnapshot(
        model_name=model,
        engine=engine,
        prefix_cache=prefix,
        external_prefix_cache=external,
        ttft=ttft,
        kv_cache_usage=v.get("kv_usage", v.get("gpu_cache_usage")),
        preemptions=v.get("preemptions"),
        prompt_tokens=v.get("prompt_tokens", v.get("sglang_prompt_tokens")),
        prompt_tokens_cached=v.get("prompt_tokens_cached"),
        generation_tokens=v.get("generation_tokens"),
        requests_running=v.get("requests_running"),
        requests_waiting=v.get("requests_waiting"),
        hit_rate_since_start=v0 if v0 is not None and 0 <= v0 <= 1 else None,  # -1: caching off; a ratio is 0-1
        created=created,
        prompt_tokens_by_source=by_source,
        prompt_tokens_cached_by_source=cached_by_source,
        cached_tokens_by_tier=tiers.by_tier(b.tiers, cached_by_source),
        kv_idle_before_evict=tiers.histogram(b.hists.get("idle_before_evict"), v.get("idle_before_evict_sum"), v.get("idle_before_evict_count")),
        kv_reuse_gap=tiers.histogram(b.hists.get("reuse_gap"), v.get("reuse_gap_sum"), v.get("reuse_gap_count")),
        prompt_tokens_recomputed=v.get("prompt_tokens_recomputed"),
        sleep_level=_sleep_level(v),
        prefill_kv_computed=(v["prefill_kv_computed_sum"], v.get("prefill_kv_computed_count", 0.0)) if "prefill_kv_computed_sum" in v else None,
        engine_hit_rate=_ratio_or_none(v.get("engine_hit_rate"), what, warnings),
        lmcache_lookups=tuple(v.get(k) for k in ("lmcache_lookup_requests", "lmcache_lookup_tokens", "lmcache_lookup_hits"))
        if any(k in v for k in ("lmcache_lookup_requests", "lmcache_lookup_tokens", "lmcache_lookup_hits")) else None,
    )


def _sleep_level(v: dict[str, float]) -> int | None:
    """0 awake, 1 or 2 the sleep level (a sleeping engine whose level is not set: 1),
    None where the engine does not say."""
    states = {state: v["sleep_" + state] for state in SLEEP_STATES if "sleep_" + state in v}
    if not states:
        return None
    if states.get("awake", 0.0) >= 1.0:
        return 0
    asleep = [level for state, level in SLEEP_STATES.items() if level and states.get(state, 0.0) >= 1.0]
    if asleep:
        return max(asleep)
    return 1 if "awake" in states else None


def _ratio_or_none(value: float | None, what: str, warnings: list[str]) -> float | None:
    """Released SGLang and TRT-LLM report their hit-rate gauge as 0-1; a percent came only
    from an unreleased SGLang branch."""
    if value is None or 0.0 <= value <= 1.0:
        return value
    warnings.append(f"{what}: the engine's cache hit rate gauge {value!r} is not a 0-1 ratio (an unreleased build?); ignored")
    return None

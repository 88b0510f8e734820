"""The engines' series as a Prometheus holds them -> one /metrics text per pod and
sample time. Pure: the reader (exporter/poll/promread.py) asks, this reads the answer.

The question is one instant query of a range selector,
`{__name__=~"<every name the parser reads>", <match_labels>}[<range>]`, whose answer is
a matrix of the raw samples each series got in the range (Prometheus's API, which Thanos
Querier, Mimir and VictoriaMetrics answer alike; no PromQL function is applied, so no
server-side extrapolation either). The samples of one scrape share its timestamp, so
grouping a pod's samples by timestamp gives back each scrape, whose samples the scrape
path's parser files (vllm_metrics.parse_samples: the same roles and checks as a body's
lines, without writing a text to read back): both paths run the same parser and engine.
A pod is named by its `target_label` (`pod`), else its `instance`; its labels are those
Prometheus gave its target (the labels of `process_start_time_seconds`, which has none of
its own, else the labels every series of the pod shares less the engine's own).

An answer in the exact layout Prometheus's API code writes (compact, `metric` then
`values`, no escape anywhere) is read from its text (pods_of_answer): a pod whose series'
label texts are those of the last answer reuses what they were read as (PodMemo), so at
fleet size each read decodes the pods' samples, not their labels again. Any other answer
is decoded whole and read as pods() reads it, to the same result.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any

from ..config.sections import Target
from ..parse.names import PROCESS_START_TIME, SAMPLE_NAMES
from ..parse.snapshot import Snapshot
from ..parse.vllm_metrics import long_labels, parse_samples
from .targets import DiscoveryError, Limits, _bounded_labels, _own_labels, _without_userinfo

# labels an engine puts on its own series: never a pod's
_ENGINE_LABELS = frozenset({"model_name", "engine", "le", "source", "name", "cache_source", "pid", "cache_level", "cache_tier",
                            "engine_type", "is_streaming", "target_model_name", "phase", "model", "quantile"})


_LAST = "0123456789abcdefghijklmnopqrstuvwxyz"


def partitions(target_label: str, count: int) -> list[str]:
    """Matchers that split the pods into `count` parts by the last character of their
    name (a pod's series all fall in one part, so each answer holds whole scrapes);
    the last part also takes every name that ends otherwise."""
    if count <= 1:
        return [""]
    size = math.ceil(len(_LAST) / count)
    groups = [_LAST[i:i + size] for i in range(0, len(_LAST), size)]
    out = [f'{target_label}=~".*[{g}]"' for g in groups[:-1]]
    out.append(f'{target_label}!~".*[{"".join(groups[:-1])}]"')
    return out


def query(match_labels: tuple[tuple[str, str], ...], seconds: float, part: str = "") -> str:
    """The range selector of every series the parser reads, of the matched targets (of
    one partition of them)."""
    names = "|".join(SAMPLE_NAMES)  # names hold no regex character but `:` and `_`
    matchers = [f'__name__=~"{names}"']
    matchers += [f'{k}="{_escape(v)}"' for k, v in match_labels]
    matchers += [part] if part else []
    return "{" + ",".join(matchers) + "}" + f"[{max(1, math.ceil(seconds))}s]"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class Pod:
    """One target's samples of one answer: sample time -> (name, own labels, value text,
    whether the labels may be over the bound) of each of that scrape's samples, in the
    answer's order."""

    name: str
    labels: dict[str, str]  # its target's labels (Prometheus's, after relabelling)
    times: dict[float, list[tuple[str, dict[str, str], str, bool]]] = field(default_factory=dict)

    def snapshot(self, t: float, series_limit: int = 0) -> Snapshot:
        """The scrape at `t` through the scrape path's parser (its samples, not a text)."""
        return parse_samples(self.times[t], series_limit)


def pods(payload: Any, target_label: str, where: str, newer_than: dict[str, float] | None = None) -> dict[str, Pod]:
    """A query answer -> pod name -> its samples, those of a pod at or before
    `newer_than[pod]` (already read) left out. A series' values are in time order (the
    API's matrix), so its reading stops at the first sample already read."""
    if not isinstance(payload, dict) or payload.get("status") != "success" or not isinstance(payload.get("data"), dict):
        raise DiscoveryError(f"{where}: not a successful query answer")
    data = payload["data"]
    if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise DiscoveryError(f"{where}: the answer is not a matrix (resultType {str(data.get('resultType'))[:40]!r})")
    newer_than = newer_than or {}
    series_of: dict[str, list[tuple[str, dict, list]]] = {}
    for i, series in enumerate(data["result"]):
        try:
            metric, values = series["metric"], series.get("values")
            name = metric["__name__"]
        except (KeyError, TypeError, AttributeError):
            raise DiscoveryError(f"{where}: result[{i}] is not a series with metric and values") from None
        if values is None and "histograms" in series:
            continue  # native histograms only (the API leaves out `values` then): no series the parser reads
        pod = metric.get(target_label) or metric.get("instance") or ""
        if not isinstance(pod, str) or not pod or not isinstance(values, list):
            continue  # a series of no pod cannot be anybody's
        series_of.setdefault(pod, []).append((name, metric, values))
    out: dict[str, Pod] = {}
    for pod, series in series_of.items():
        labels = _pod_labels(series)
        after = newer_than.get(pod, -math.inf)
        times: dict[float, list[tuple[str, dict[str, str], str, bool]]] = {}
        for name, metric, values in series:
            own, long = None, False  # one dict of the series' own labels, shared by its samples
            # a series' samples come oldest first: read from the newest back to the first already read
            for sample in reversed(values):
                try:
                    t, value = float(sample[0]), sample[1]
                except (TypeError, ValueError, IndexError, OverflowError):
                    raise DiscoveryError(f"{where}: a sample of {name} of {pod} is not [time, \"value\"]") from None
                if t <= after:
                    break
                if isinstance(value, str):
                    if own is None:
                        own = _own_labels_of(metric, labels)
                        long = long_labels(own)
                    scrape = times.get(t)
                    if scrape is None:
                        scrape = times[t] = []
                    scrape.append((name, own, value, long))
        if times:
            out[pod] = Pod(pod, labels, times)
    return out


def _own_labels_of(metric: dict, pod_labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in metric.items() if k != "__name__" and k not in pod_labels and isinstance(v, str)}


def _pod_labels(series: list[tuple[str, dict, list]]) -> dict[str, str]:
    for name, metric, _ in series:
        if name == PROCESS_START_TIME:
            return {k: v for k, v in metric.items() if k != "__name__"}
    common: dict[str, str] | None = None
    for _, metric, _ in series:
        if common is None:
            common = {k: v for k, v in metric.items() if k != "__name__" and k not in _ENGINE_LABELS}
        else:
            common = {k: v for k, v in common.items() if metric.get(k) == v}
    return common or {}


def target(pod: Pod, source_url: str, limits: Limits, dropped: Counter) -> Target:
    """A pod as a target: its name, its labels within the limits (as discovery's); its
    URL says where its samples come from."""
    kept = _bounded_labels(_without_userinfo(pod.labels), limits, dropped)
    name = pod.name.rpartition("@")[2]  # an instance may carry user:pass@: a name is shown everywhere
    return Target(name=name, url=f"{source_url}#{name}", labels=_own_labels(kept))


# The answer as Prometheus's API code (and the queriers that reuse it) writes it
_PROLOGUE = '{"status":"success","data":{"resultType":"matrix","result":['
_EPILOGUE = "]}}"
_SERIES = '{"metric":'
_VALUES = '},"values":[['
_NEXT = ']]},{"metric":'  # a series' end and the next one's start (the text gets one after its last)


@dataclass
class _Known:
    """A pod's series as an answer had them: the hash and length of their label texts
    joined and their number, each series' name, own labels and long_labels of them, in
    the answer's order, the pod's labels."""

    key: tuple[int, int, int]
    names: tuple[str, ...]
    owns: tuple[dict[str, str], ...]
    longs: tuple[bool, ...]
    labels: dict[str, str]


@dataclass
class PodMemo:
    """pod -> its series as the last answer had them (the reader keeps it between reads and
    forgets a pod with its other state). Some 3 KB a pod: the label texts are not kept, only
    their hash, length and count, and a pod whose texts hash, measure and count the same
    is read as it was (a 64-bit hash: one pod's changed labels match the old ones once in
    2^64). Only an answer read whole from its text teaches it."""

    pods: dict[str, _Known] = field(default_factory=dict)


def pods_of_answer(body: bytes, target_label: str, where: str, newer_than: dict[str, float] | None = None,
                   memo: PodMemo | None = None) -> dict[str, Pod]:
    """pods() of an answer's bytes, as pods(json.loads(body)) reads them. The layout
    Prometheus writes is read from the text (the module's doc); any other layout, or a
    text that is not what that layout promises, is decoded whole. `memo` learns only
    from an answer read whole from its text."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        text = None
    series_of = _scan(text, target_label) if text is not None else None
    read = _read_scanned(series_of, target_label, newer_than or {}, memo) if series_of is not None else None
    if read is not None:
        return read
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise DiscoveryError(f"{where}: answer is not JSON: {str(exc)[:200]}") from None
    return pods(payload, target_label, where, newer_than)


def _scan(text: str, target_label: str) -> dict[str, list[tuple[str, str]]] | None:
    """pod -> (label text, values text) of each of its series, in the answer's order, or
    None for a text not in Prometheus's layout. With no backslash in the text, no string in
    it holds a quote, so every token searched for that holds one is the answer's own, and
    each series' end is found with the next one's start. An answer with native histograms
    (a series of them has its own layout) is left to the decoder, as is a series whose pod
    the text does not name plainly (no such label, one that is not a string) and what the
    label texts hold: they are decoded when learnt (_learn), and the pod named here must
    be the one they name."""
    if not text.startswith(_PROLOGUE) or "\\" in text or '"histograms":' in text:
        return None
    stop = len(text.rstrip(" \t\r\n")) - len(_EPILOGUE)  # JSON's own whitespace only
    if stop < len(_PROLOGUE) or not text.startswith(_EPILOGUE, stop):
        return None
    series_of: dict[str, list[tuple[str, str]]] = {}
    if stop == len(_PROLOGUE):
        return series_of
    i = len(_PROLOGUE)
    if not text.startswith(_SERIES, i):
        return None
    text = text[:stop] + _NEXT[3:]  # the last series is followed by a start as every other is
    find = text.find
    own_key, instance_key = f'"{target_label}":"', '"instance":"'
    while i < stop:
        close = find(_VALUES, i)
        if close < 0:
            return None
        end = find(_NEXT, close)
        if end < 0:
            return None  # what follows a series is no series
        pod = _value_of(text, own_key, i, close) or _value_of(text, instance_key, i, close)
        if not pod:
            return None
        series = series_of.get(pod)
        if series is None:
            series = series_of[pod] = []
        series.append((text[i + len(_SERIES):close + 1], text[close + len(_VALUES):end]))
        i = end + 4
    return series_of


def _value_of(text: str, key: str, start: int, stop: int) -> str:
    """The string value of the label whose `"name":"` is `key` in the label text
    text[start:stop], "" when it has none. The first the text has: the decoder keeps the
    last, and _learn compares the two."""
    at = text.find(key, start, stop)
    if at < 0:
        return ""
    at += len(key)
    return text[at:text.find('"', at)]


def _read_scanned(series_of: dict[str, list[tuple[str, str]]], target_label: str, newer_than: dict[str, float],
                  memo: PodMemo | None) -> dict[str, Pod] | None:
    """The scanned pods' new samples, as pods() files them; None when a label or values
    text is not what the layout promises (the whole answer is then decoded, and the memo
    learns nothing of it)."""
    owns: dict[tuple, dict[str, str]] = {}  # one dict for the same own labels of many pods
    learnt: dict[str, _Known] = {}
    out: dict[str, Pod] = {}
    for pod, series in series_of.items():
        texts, values = zip(*series)
        # NUL is in no JSON text: joined texts that are equal were cut at the same places
        joined = "\0".join(texts)
        key = (hash(joined), len(joined), len(series))
        known = memo.pods.get(pod) if memo is not None else None
        if known is None or known.key != key:
            known = learnt[pod] = _learn(pod, target_label, texts, key, owns)
            if known is None:
                return None
        samples = "],[".join(values)
        if not samples.isascii() or "_" in samples or "[+" in samples or samples[:1] == "+" or not samples.isprintable():
            return None  # what float() reads and JSON has not: digits of other scripts, 1_0, +1, raw control characters
        after = newer_than.get(pod, -math.inf)
        times = _scrapes(samples, values, after, known)
        if times is None:
            times = _samples_of(values, after, known)
        if times is False:
            return None
        if times:
            out[pod] = Pod(pod, known.labels, times)
    if memo is not None:
        memo.pods.update(learnt)
    return out


def _scrapes(samples: str, values: tuple[str, ...], after: float, known: _Known):
    """A pod whose series all have their samples at the same times (one scrape each, as a
    regular read has them, or a few after a slow read), filed a scrape at a time, from
    the newest back to the first already read, without a loop over each series'
    samples. Its new scrapes ({} when none), or None for any other pod and any text this
    reading does not judge (read sample by sample, which does)."""
    each = set(map(str.count, values, repeat("],[")))
    if len(each) != 1:
        return None
    per_series = each.pop() + 1
    cut = samples.split("],[")
    if samples.count('"') != 2 * len(cut):
        return None  # a value that holds the separator (each sample has two quotes): read sample by sample
    scrapes: dict[float, list[tuple[str, dict[str, str], str, bool]]] = {}
    for back in range(1, per_series + 1):
        column = list(map(str.partition, cut[per_series - back::per_series], repeat(',"')))  # each series' sample
        times = set(map(itemgetter(0), column))
        if len(times) != 1:
            return None
        try:
            t = float(times.pop())
        except ValueError:
            return None
        scraped = list(map(itemgetter(2), column))
        # a value is a string with no quote in it: each ends at its one quote
        if not math.isfinite(t) or set(map(itemgetter(1), column)) != {',"'} or "".join(scraped).count('"') != len(scraped) \
                or not all(map(str.endswith, scraped, repeat('"'))):
            return None  # nan, inf: JSON has no such time
        if t <= after:
            break
        scrapes[t] = list(zip(known.names, known.owns, map(str.removesuffix, scraped, repeat('"')), known.longs))
    return scrapes


def _samples_of(values: tuple[str, ...], after: float, known: _Known):
    """The pod's samples newer than `after`, series by series (False when a text is not
    what the layout promises)."""
    isfinite = math.isfinite
    times: dict[float, list[tuple[str, dict[str, str], str, bool]]] = {}
    for name, own, long, text in zip(known.names, known.owns, known.longs, values):
        # a series' samples come oldest first: read from the newest back to the first already read
        # (those before it are not read at all: a broken one there goes unnoticed, where decoding fails)
        for sample in reversed(text.split("],[")):
            time_text, comma, value = sample.partition(',"')
            # a value is a string with no quote in it: a cut inside one leaves it open
            if not comma or not value or value.find('"') != len(value) - 1:
                return False
            try:
                t = float(time_text)
            except ValueError:
                return False
            if not isfinite(t):  # nan, inf: JSON has no such number
                return False
            if t <= after:
                break
            scrape = times.get(t)
            if scrape is None:
                scrape = times[t] = []
            scrape.append((name, own, value[:-1], long))
    return times


def _learn(pod: str, target_label: str, texts: tuple[str, ...], key: tuple[int, int, int],
           owns: dict[tuple, dict[str, str]]) -> _Known | None:
    """A pod's series read from their label texts, as pods() reads the decoded ones; None
    when one is not a JSON object with a name, or names another pod than the scan read."""
    metrics = []
    for labels in texts:
        try:
            metric = json.loads(labels)
        except (ValueError, RecursionError):
            return None
        if not isinstance(metric, dict) or not isinstance(metric.get("__name__"), str):
            return None
        if (metric.get(target_label) or metric.get("instance")) != pod:
            return None  # a label twice, or inside another value: the decoder's reading differs
        metrics.append((metric["__name__"], metric, None))
    pod_labels = _pod_labels(metrics)
    names, own_labels = [], []
    for name, metric, _ in metrics:
        own = _own_labels_of(metric, pod_labels)
        names.append(name)
        own_labels.append(owns.setdefault(tuple(own.items()), own))
    return _Known(key, tuple(names), tuple(own_labels), tuple(map(long_labels, own_labels)), pod_labels)

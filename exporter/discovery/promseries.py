"""The engines' series as a Prometheus holds them -> one /metrics text per pod and
sample time. Pure: the reader (exporter/poll/promread.py) asks, this reads the answer.

The question is one instant query of a range selector, `{__name__=~"<every name the
parser reads but those nothing reads on>", <match_labels>}[<range>]`, whose answer is a
matrix of the raw samples each series got in the range (Prometheus's API, which Thanos
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
import re
from array import array
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any

from ..config.sections import Target
from ..parse.names import PROCESS_START_TIME, QUERY_NAMES
from ..parse.snapshot import Snapshot
from ..parse.vllm_metrics import FUTURE_TIMESTAMP, NON_FINITE_TIMESTAMP, SamplePlan, long_labels, parse_samples
from .answercost import PROLOGUE, WHOLE_COST, decoded_cost, too_costly
from .targets import DiscoveryError, Limits, _bounded_labels, _own_labels, _without_userinfo

# labels an engine puts on its own series: never a pod's
_ENGINE_LABELS = frozenset({"model_name", "engine", "le", "source", "name", "cache_source", "pid", "cache_level", "cache_tier",
                            "engine_type", "is_streaming", "target_model_name", "phase", "model", "quantile"})
# the label an engine files its series by: the engine's on each series that has it, whatever the pod has
_MODEL_LABEL = "model_name"
# Prometheus keeps a scraped label that clashes with a target label as exported_<name> (honor_labels: false)
_RENAMED = "exported_"


_LAST = "0123456789abcdefghijklmnopqrstuvwxyz"


def partitions(target_label: str, count: int) -> list[str]:
    """Matchers that split the pods into `count` parts by the last character of their
    name (a pod's series all fall in one part, so each answer holds whole scrapes);
    the last part also takes every name that ends otherwise. The characters are dealt
    out in turn, so that names that end in a digit (a StatefulSet's) spread over every
    part: in runs of the alphabet, 10,000 such pods made two answers of 61 MB, not eight
    of 16 MB."""
    if count <= 1:
        return [""]
    groups = [group for group in (_LAST[k::count] for k in range(count)) if group]
    out = [f'{target_label}=~".*[{g}]"' for g in groups[:-1]]
    out.append(f'{target_label}!~".*[{"".join(groups[:-1])}]"')
    return out


def query(match_labels: tuple[tuple[str, str], ...], seconds: float, part: str = "") -> str:
    """The range selector of every series the parser reads and something reads on
    (names.QUERY_NAMES), of the matched targets (of one partition of them)."""
    names = "|".join(QUERY_NAMES)  # names hold no regex character but `:` and `_`
    matchers = [f'__name__=~"{names}"']
    matchers += [f'{k}="{_escape(v)}"' for k, v in match_labels]
    matchers += [part] if part else []
    return "{" + ",".join(matchers) + "}" + f"[{max(1, math.ceil(seconds))}s]"


def up_query(match_labels: tuple[tuple[str, str], ...], target_label: str, pods: list[str] | None) -> str:
    """Prometheus's `up` of the matched targets (whose `target_label` is one of `pods`): is
    each one's scrape target still there (a series), and is it scraped (1) or failing (0)?"""
    matchers = ['__name__="up"'] + [f'{k}="{_escape(v)}"' for k, v in match_labels]
    if pods is not None:
        alternatives = "|".join(re.sub(r"([\\.+*?()\[\]{}|^$])", r"\\\1", p) for p in pods)
        matchers.append(f'{target_label}=~"{_escape(alternatives)}"')
    return "{" + ",".join(matchers) + "}"


def scrape_health(payload: Any, target_label: str, names: "PodNames", where: str) -> dict[str, float]:
    """An instant answer of up_query -> pod name (as `names` gave it) -> its `up` value;
    pods never named are left out. DiscoveryError for an answer that is not a vector."""
    if not isinstance(payload, dict) or payload.get("status") != "success" or not isinstance(payload.get("data"), dict) \
            or payload["data"].get("resultType") != "vector" or not isinstance(payload["data"].get("result"), list):
        raise DiscoveryError(f"{where}: not an instant vector answer")
    out = {}
    for series in payload["data"]["result"]:
        try:
            metric, value = series["metric"], float(series["value"][1])
        except (KeyError, TypeError, ValueError, IndexError):
            continue
        pod = metric.get(target_label) or metric.get("instance") or ""
        name = names.given.get((str(pod).rpartition("@")[2], metric.get("namespace") if isinstance(metric.get("namespace"), str) else ""))
        if name is not None:
            out[name] = value
    return out


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
    plan: SamplePlan | None = field(default=None, compare=False)  # what its series are filed as, when known

    def snapshot(self, t: float, series_limit: int = 0) -> Snapshot:
        """The scrape at `t` through the scrape path's parser (its samples, not a text)."""
        return parse_samples(self.times[t], series_limit, self.plan)


def pods(payload: Any, target_label: str, where: str, newer_than: dict[str, float] | None = None,
         present: set[str] | None = None, names: PodNames | None = None, not_after: float = math.inf,
         refused: dict[str, Counter] | None = None) -> dict[str, Pod]:
    """A query answer -> pod name -> its samples, those of a pod at or before
    `newer_than[pod]` (already read) left out. A series' values are in time order in the
    API's matrix, but not in every store's: each sample is judged, none is skipped for
    its place (one answer's values in reverse order were all taken for read). A sample at
    no finite time or after `not_after` (the query's time) is refused, counted in
    `refused` (pod -> reason -> samples). `present` gets the name of every pod the answer
    has a series of, new samples or none."""
    if not isinstance(payload, dict) or payload.get("status") != "success" or not isinstance(payload.get("data"), dict):
        raise DiscoveryError(f"{where}: not a successful query answer")
    data = payload["data"]
    if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise DiscoveryError(f"{where}: the answer is not a matrix (resultType {str(data.get('resultType'))[:40]!r})")
    newer_than = newer_than or {}
    names = names if names is not None else PodNames()
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
        series_of.setdefault(names.name(pod, metric.get("namespace")), []).append((name, metric, values))
    if present is not None:
        present.update(series_of)
    out: dict[str, Pod] = {}
    for pod, series in series_of.items():
        labels = _pod_labels(series)
        after = newer_than.get(pod, -math.inf)
        times: dict[float, list[tuple[str, dict[str, str], str, bool]]] = {}
        for name, metric, values in series:
            own, long = None, False  # one dict of the series' own labels, shared by its samples
            for sample in values:
                try:
                    t, value = float(sample[0]), sample[1]
                except (TypeError, ValueError, IndexError, OverflowError):
                    raise DiscoveryError(f"{where}: a sample of {name} of {pod} is not [time, \"value\"]") from None
                if not math.isfinite(t) or t > not_after:
                    if refused is not None:
                        refused.setdefault(pod, Counter())[NON_FINITE_TIMESTAMP if not math.isfinite(t) else FUTURE_TIMESTAMP] += 1
                    continue
                if t <= after:
                    continue
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
    """A series' labels as its engine exposed them, the pod's left out, as the scrape path
    has them (a pod's label that clashes is its target's exported_<name>). A pod label that
    an engine also uses (a PodMonitor relabelling that adds `model_name`) clashed when
    Prometheus scraped: Prometheus kept the pod's under the name and the engine's as
    exported_<name> (honor_labels: false), which is taken back; with honor_labels: true
    the engine's stayed under the name, and is told from the pod's by its value (the model
    label always: each series filed by model has the engine's)."""
    own: dict[str, str] = {}
    for k, v in metric.items():
        if k == "__name__" or not isinstance(v, str):
            continue
        if k.startswith(_RENAMED) and k[len(_RENAMED):] in _ENGINE_LABELS:
            own[k[len(_RENAMED):]] = v  # the engine's, renamed by Prometheus: over the pod's under the name
        elif k not in pod_labels or (k in _ENGINE_LABELS and (k == _MODEL_LABEL or v != pod_labels[k])):
            own.setdefault(k, v)
    return own


def _pod_labels(series: list[tuple[str, dict, list]]) -> dict[str, str]:
    for name, metric, _ in series:
        if name == PROCESS_START_TIME:
            return {k: v for k, v in metric.items() if k != "__name__"}
    common: dict[str, str] | None = None
    for _, metric, _ in series:
        if common is None:
            common = {k: v for k, v in metric.items() if k != "__name__" and k not in _ENGINE_LABELS
                      and not (k.startswith(_RENAMED) and k[len(_RENAMED):] in _ENGINE_LABELS)}  # nor one Prometheus renamed (_own_labels_of)
        else:
            common = {k: v for k, v in common.items() if metric.get(k) == v}
    return common or {}


def target(pod: Pod, source_url: str, limits: Limits, dropped: Counter) -> Target:
    """A pod as a target: its name, its labels within the limits (as discovery's); its
    URL says where its samples come from."""
    kept = _bounded_labels(_without_userinfo(pod.labels), limits, dropped)
    return Target(name=pod.name, url=f"{source_url}#{pod.name}", labels=_own_labels(kept))


# The answer as Prometheus's API code (and the queriers that reuse it) writes it
_PROLOGUE = PROLOGUE.decode()
_EPILOGUE = "]}}"
_SERIES = '{"metric":'
_VALUES = '},"values":[['
_NEXT = ']]},{"metric":'  # a series' end and the next one's start
_END = "]]}"  # the last series' end
_SERIES_APART = "]|["  # where _columns joins a pod's series: no valid values text holds it outside a string
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


@dataclass
class PodNames:
    """Which pod a series is: its `target_label` value (else its instance) and its
    namespace. One Prometheus read across namespaces holds pods of one name in several (a
    StatefulSet's vllm-0 in prod and in staging): named by the label alone they were one
    pod, their samples mixed. The first namespace seen with a name keeps it plain, as
    discovery keeps the first of two targets' name; the same name in another is
    `name@namespace`. A name given stays while its pod is known (forget() drops it with
    the pod; the reader drops one whose pod was never read at its next whole read), so a
    namespace that comes or goes renames no other's pod."""

    given: dict[tuple[str, str], str] = field(default_factory=dict)  # (label value, namespace) -> name
    owner: dict[str, tuple[str, str]] = field(default_factory=dict)  # the same, name -> (label value, namespace)

    def name(self, pod: str, namespace: Any) -> str:
        pod = pod.rpartition("@")[2]  # an instance may carry user:pass@: a name is shown everywhere
        key = (pod, namespace if isinstance(namespace, str) else "")
        name = self.given.get(key)
        if name is None:
            name = pod if pod not in self.owner else f"{pod}@{key[1] or '-'}"
            self.given[key], self.owner[name] = name, key
        return name

    def forget(self, name: str) -> None:
        key = self.owner.pop(name, None)
        if key is not None:
            del self.given[key]


@dataclass
class _Known:
    """A pod's series as an answer had them: the hash and length of their label texts
    joined and their number, the pod's labels, and the plan of its series (each one's
    name, own labels and long_labels of them, in the answer's order: what parse_samples
    files its scrapes as, one plan for the pods whose series are alike)."""

    key: tuple[int, int, int]
    labels: dict[str, str]
    plan: SamplePlan


@dataclass
class _Layout:
    """An answer's series as pods: the hashes of its label texts in the answer's order,
    the order that puts its series pod after pod (`take`: the values texts -> the same,
    so ordered), and each pod's name, its span in what `take` gives and what its series
    are. Both kept as machine integers: the memo holds a layout for each answer of a read,
    and as tuples of Python ints the two were some 40 MB at 10,000 pods."""

    hashes: array  # 'q': a label text's hash, as hash() gives it
    target_label: str  # the label its pods were named by (a reload may change it)
    order: array  # 'L': the answer's index of each series, pod after pod
    pods: tuple[tuple[str, int, int, _Known], ...]

    def take(self, values: list[str]) -> tuple[str, ...]:
        order = self.order
        return itemgetter(*order)(values) if len(order) > 1 else (values[order[0]],)


@dataclass
class PodMemo:
    """What the last answers' label texts were read as (the reader keeps it between reads
    and forgets a pod with its other state): pod -> its series (`pods`, some 3 KB a pod:
    the label texts are not kept, only their hash, length and count, and a pod whose
    texts hash, measure and count the same is read as it was), and the layout of each
    answer a read had (`layouts`, by the hash of its label texts' hashes: an answer
    whose label texts hash as one did before, series for series, is cut into the same
    pods without looking for a pod's name in each series; settle() keeps those of the
    last read). A 64-bit hash: changed labels match the old ones once in 2^64. Only an
    answer read whole from its text teaches it."""

    pods: dict[str, _Known] = field(default_factory=dict)
    layouts: dict[int, _Layout] = field(default_factory=dict)
    used: set[int] = field(default_factory=set)
    plans: dict[tuple, SamplePlan] = field(default_factory=dict)  # the pods' series (names, labels, long) -> their plan
    names: PodNames = field(default_factory=PodNames)

    def settle(self) -> None:
        """After a read: the layouts it did not use are forgotten, and the plans no pod has."""
        self.layouts = {key: layout for key, layout in self.layouts.items() if key in self.used}
        self.used = set()
        kept = {id(known.plan) for known in self.pods.values()}
        self.plans = {key: plan for key, plan in self.plans.items() if id(plan) in kept}


def pods_of_answer(body: bytes, target_label: str, where: str, newer_than: dict[str, float] | None = None,
                   memo: PodMemo | None = None, present: set[str] | None = None, not_after: float = math.inf,
                   refused: dict[str, Counter] | None = None, budget: int | None = None,
                   partitions: int = 1) -> dict[str, Pod]:
    """pods() of an answer's bytes, as pods(json.loads(body)) reads them. The layout
    Prometheus writes is read from the text (the module's doc); any other layout, or a
    text that is not what that layout promises, is decoded whole. `memo` learns only
    from an answer read whole from its text; `refused` counts only the reading that is kept.
    With a `budget` (decoded_budget of max_answer), an answer whose decoded_cost is over it is
    AnswerTooCostly before a str or an object of it is made, and so is one read from its text
    that must then be decoded whole at a cost over it (`partitions`: the read's, for the advice)."""
    if budget is not None:
        cost = decoded_cost(body)
        if cost > budget:
            raise too_costly(body, where, cost, budget, partitions)
    try:
        text = body.decode()
    except UnicodeDecodeError:
        text = None
    refused_here: dict[str, Counter] = {}
    read = _read_text(text, target_label, newer_than or {}, memo, present, not_after, refused_here) if text is not None else None
    text = None  # not held while the answer is decoded whole
    if read is not None:
        if refused is not None:
            for pod, counts in refused_here.items():
                if counts:
                    refused.setdefault(pod, Counter()).update(counts)
        return read
    if budget is not None and WHOLE_COST * len(body) > budget:
        raise too_costly(body, where, WHOLE_COST * len(body), budget, partitions)
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise DiscoveryError(f"{where}: answer is not JSON: {str(exc)[:200]}") from None
    return pods(payload, target_label, where, newer_than, present, memo.names if memo is not None else None, not_after, refused)


def _series_texts(text: str) -> tuple[list[str], list[str]] | None:
    """(label text less its closing brace, values text less the outer brackets) of each
    series, in the answer's order, or None for a text not in Prometheus's layout. With no
    backslash in the text, no string in it holds a quote, so every token that holds one
    is the answer's own and the series are cut at them. What the label and values texts
    hold is judged where they are read (_learn, _columns, _samples_of): a series of native
    histograms (its own layout) or a raw control character (none is in a JSON string)
    fails there, and the answer is decoded whole."""
    if not text.startswith(_PROLOGUE) or "\\" in text:
        return None
    stop = len(text.rstrip(" \t\r\n")) - len(_EPILOGUE)  # JSON's own whitespace only
    if stop < len(_PROLOGUE) or not text.startswith(_EPILOGUE, stop):
        return None
    if stop == len(_PROLOGUE):
        return [], []
    if not text.startswith(_SERIES, len(_PROLOGUE)) or not text.startswith(_END, stop - len(_END)):
        return None
    cut = list(map(str.partition, text[len(_PROLOGUE) + len(_SERIES):stop - len(_END)].split(_NEXT), repeat(_VALUES)))
    if not all(map(itemgetter(1), cut)):
        return None
    return list(map(itemgetter(0), cut)), list(map(itemgetter(2), cut))


def _read_text(text: str, target_label: str, newer_than: dict[str, float], memo: PodMemo | None,
               present: set[str] | None = None, not_after: float = math.inf,
               refused: dict[str, Counter] | None = None) -> dict[str, Pod] | None:
    """The new samples of an answer in Prometheus's layout, as pods() files them; None when
    a text is not what the layout promises (the whole answer is then decoded, and the memo
    learns nothing of it)."""
    texts = _series_texts(text)
    if texts is None:
        return None
    labels, values = texts
    if not labels:
        return {}
    hashes = array("q", map(hash, labels))
    key = hash(hashes.tobytes())
    layout = memo.layouts.get(key) if memo is not None else None
    learnt: dict[str, _Known] = {}
    if layout is None or layout.hashes != hashes or layout.target_label != target_label:
        layout = _lay_out(labels, hashes, target_label, memo, learnt)
        if layout is None:
            return None
    ordered = layout.take(values)
    if present is not None:  # a text that fails below is decoded whole, which names the same pods
        present.update(pod for pod, _, _, _ in layout.pods)
    out: dict[str, Pod] = {}
    for pod, start, stop, known in layout.pods:
        after = newer_than.get(pod, -math.inf)
        series = ordered[start:stop]
        times = _columns(series, after, known, not_after)
        if times is None:
            samples = "],[".join(series)
            if not samples.isascii() or "_" in samples or "[+" in samples or samples[:1] == "+" or not samples.isprintable():
                return None  # what float() reads and JSON has not: digits of other scripts, 1_0, +1
            times = _samples_of(series, after, known, not_after, refused.setdefault(pod, Counter()) if refused is not None else Counter())
            if times is False:
                return None
        if times:
            out[pod] = Pod(pod, known.labels, times, known.plan)
    if memo is not None:
        memo.pods.update(learnt)
        memo.layouts[key] = layout
        memo.used.add(key)
    return out


def _lay_out(labels: list[str], hashes: array, target_label: str, memo: PodMemo | None,
             learnt: dict[str, _Known]) -> _Layout | None:
    """The answer's series grouped by the pod each names, each pod read from its label texts
    (as the memo had it, else learnt, into `learnt`); None when a series names no pod
    plainly (no such label, one that is not a string: the decoder's reading is the one)
    or a label text is not what _learn can read."""
    own_key, instance_key = f'"{target_label}":"', '"instance":"'
    names = memo.names if memo is not None else PodNames()
    series_of: dict[str, list[int]] = {}
    for i, label_text in enumerate(labels):
        pod = _value_of(label_text, own_key) or _value_of(label_text, instance_key)
        if not pod:
            return None
        pod = names.name(pod, _value_of(label_text, '"namespace":"') or None)
        series = series_of.get(pod)
        if series is None:
            series = series_of[pod] = []
        series.append(i)
    plans = memo.plans if memo is not None else {}
    order: list[int] = []
    pods = []
    for pod, series in series_of.items():
        texts = [labels[i] for i in series]
        # NUL is in no JSON text: joined texts that are equal were cut at the same places
        joined = "\0".join(texts)
        key = (hash(joined), len(joined), len(series))
        known = memo.pods.get(pod) if memo is not None else None
        if known is None or known.key != key:
            known = learnt[pod] = _learn(pod, target_label, texts, key, plans, names)
            if known is None:
                return None
        pods.append((pod, len(order), len(order) + len(series), known))
        order += series
    return _Layout(hashes, target_label, array("L", order), tuple(pods))


def _value_of(label_text: str, key: str) -> str:
    """The string value of the label whose `"name":"` is `key` in a label text, "" when it
    has none. The first the text has: the decoder keeps the last, and _learn compares the
    two."""
    at = label_text.find(key)
    if at < 0:
        return ""
    at += len(key)
    return label_text[at:label_text.find('"', at)]


def _columns(values: tuple[str, ...], after: float, known: _Known, not_after: float = math.inf):
    """A pod whose series all have their samples at the same times (one scrape each, as a
    regular read has them, or a few after a slow read), filed a scrape at a time, from
    the newest back to the first already read, without a loop over each series' samples:
    the samples are cut at their quotes (no string holds one), so the times' texts come
    at even places and the values at odd ones, each series' times the same texts. Its
    new scrapes ({} when none), or None for any other pod and any text this reading does
    not judge (read sample by sample, which does: times not rising, or one after `not_after`). The series are joined at "]|[", which
    no valid values text holds outside a string: a series' first time comes after it, every
    other after "],[", so the times repeating a series at a time also says that every
    series has as many samples."""
    pieces = _SERIES_APART.join(values).split('"')
    count = len(values)
    per_series, rest = divmod(len(pieces) // 2, count)
    if rest or not per_series or pieces[-1]:
        return None
    stamps = pieces[0::2]  # "<time>," then "],[<time>," each ("]|[<time>," a series' first), "" after the last value
    if stamps[per_series:-1] != [_SERIES_APART + stamps[0], *stamps[1:per_series]] * (count - 1):
        return None
    times = []
    for stamp in ["],[" + stamps[0], *stamps[1:per_series]]:
        number = stamp[3:-1]
        if stamp[:3] != "],[" or stamp[-1:] != "," or not _JSON_NUMBER.fullmatch(number):
            return None
        t = float(number)
        if not math.isfinite(t) or (times and t <= times[-1]) or t > not_after:
            return None  # 1e999: JSON's number, not a time; times not rising, or in the future: read sample by sample
        times.append(t)
    scraped = pieces[1::2]
    if not "".join(scraped).isprintable():
        return None  # a raw control character (not JSON), or one JSON has and float() would strip: read sample by sample
    plan = known.plan
    scrapes: dict[float, list[tuple[str, dict[str, str], str, bool]]] = {}
    for column in range(per_series - 1, -1, -1):
        t = times[column]
        if t <= after:
            break
        scrapes[t] = list(zip(plan.names, plan.labels, scraped[column::per_series], plan.longs))
    return scrapes


def _samples_of(values: tuple[str, ...], after: float, known: _Known, not_after: float, refused: Counter):
    """The pod's samples newer than `after` and not after `not_after` (those counted in
    `refused`), series by series, each sample judged whatever its place (False when a
    text is not what the layout promises)."""
    isfinite = math.isfinite
    times: dict[float, list[tuple[str, dict[str, str], str, bool]]] = {}
    plan = known.plan
    for name, own, long, text in zip(plan.names, plan.labels, plan.longs, values):
        for sample in text.split("],["):
            time_text, comma, value = sample.partition(',"')
            # a value is a string with no quote in it: a cut inside one leaves it open
            if not comma or not value or value.find('"') != len(value) - 1:
                return False
            if not _JSON_NUMBER.fullmatch(time_text):
                return False  # 01, 1., .5, " 1": float() reads them, JSON has them not
            t = float(time_text)
            if not isfinite(t):  # 1e999: JSON's number, not a time (pods() refuses it)
                return False
            if t > not_after:
                refused[FUTURE_TIMESTAMP] += 1
                continue
            if t <= after:
                continue
            scrape = times.get(t)
            if scrape is None:
                scrape = times[t] = []
            scrape.append((name, own, value[:-1], long))
    return times


def _learn(pod: str, target_label: str, texts: list[str], key: tuple[int, int, int],
           plans: dict[tuple, SamplePlan], names: PodNames) -> _Known | None:
    """A pod's series read from their label texts, as pods() reads the decoded ones; None
    when one is not a JSON object with a name, or names another pod than the scan read.
    Pods whose series are alike share one plan and its label dicts (`plans`, the memo's:
    a plan is right for the series it was made of, whatever becomes of the answer)."""
    metrics = []
    for labels in texts:
        try:
            metric = json.loads(labels + "}")
        except (ValueError, RecursionError):
            return None
        if not isinstance(metric, dict) or not isinstance(metric.get("__name__"), str):
            return None
        named = metric.get(target_label) or metric.get("instance")
        if not isinstance(named, str) or names.name(named, metric.get("namespace")) != pod:
            return None  # a label twice, or inside another value: the decoder's reading differs
        metrics.append((metric["__name__"], metric, None))
    pod_labels = _pod_labels(metrics)
    names = tuple(name for name, _, _ in metrics)
    owns = tuple(_own_labels_of(metric, pod_labels) for _, metric, _ in metrics)
    longs = tuple(map(long_labels, owns))
    alike = (names, tuple(tuple(own.items()) for own in owns), longs)
    plan = plans.get(alike)
    if plan is None:
        plan = plans[alike] = SamplePlan(names, owns, longs)
    return _Known(key, pod_labels, plan)

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
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..config.sections import Target
from ..parse.names import PROCESS_START_TIME, SAMPLE_NAMES
from ..parse.snapshot import Snapshot
from ..parse.vllm_metrics import parse_samples
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
    """One target's samples of one answer: sample time -> (name, own labels, value text)
    of each of that scrape's samples, in the answer's order."""

    name: str
    labels: dict[str, str]  # its target's labels (Prometheus's, after relabelling)
    times: dict[float, list[tuple[str, dict[str, str], str]]] = field(default_factory=dict)

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
            metric, values = series["metric"], series["values"]
            name = metric["__name__"]
        except (KeyError, TypeError):
            raise DiscoveryError(f"{where}: result[{i}] is not a series with metric and values") from None
        pod = metric.get(target_label) or metric.get("instance") or ""
        if not isinstance(pod, str) or not pod or not isinstance(values, list):
            continue  # a series of no pod cannot be anybody's
        series_of.setdefault(pod, []).append((name, metric, values))
    out: dict[str, Pod] = {}
    for pod, series in series_of.items():
        labels = _pod_labels(series)
        after = newer_than.get(pod, -math.inf)
        times: dict[float, list[str]] = {}
        for name, metric, values in series:
            own = None  # one dict of the series' own labels, shared by its samples
            # a series' samples come oldest first: read from the newest back to the first already read
            for sample in reversed(values):
                try:
                    t, value = float(sample[0]), sample[1]
                except (TypeError, ValueError, IndexError):
                    raise DiscoveryError(f"{where}: a sample of {name} of {pod} is not [time, \"value\"]") from None
                if t <= after:
                    break
                if isinstance(value, str):
                    if own is None:
                        own = {k: v for k, v in metric.items() if k != "__name__" and k not in labels and isinstance(v, str)}
                    scrape = times.get(t)
                    if scrape is None:
                        scrape = times[t] = []
                    scrape.append((name, own, value))
        if times:
            out[pod] = Pod(pod, labels, times)
    return out


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

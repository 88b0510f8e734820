"""A prefix-aware router's own metrics, as the parser reads them from its /metrics body: cumulative counters per
model, before any window. The rule that compares them with the engines is exporter/alerting/router.py.

What each router gives (names in exporter/parse/names.py):
- EPP: a per-request histogram of predicted hit ratios (no labels), and of predicted hit
  bytes (matched blocks x block size x 4 bytes a token), with per-model input tokens
  (usage.prompt_tokens of the responses): token-weighted where both exist, else the
  per-request mean of the ratio histogram. Its prefix metrics carry no model: the
  prediction is pool-wide (model_name "").
- Dynamo: `router_kv_hit_rate`, a per-request histogram of predicted overlap (per-request
  mean), and in newer builds cached-prefix tokens on the selected worker with the input
  sequence tokens, per `model` (token-weighted). Decode-phase routing of a disaggregated
  deployment is left out: its overlap is KV the prefill pod sends, not a hit.
"""
from __future__ import annotations

from dataclasses import dataclass

ALL_MODELS = ""  # a prediction that names no model: the whole pool's


@dataclass(frozen=True, slots=True)
class RouterCounters:
    """Cumulative counters of one model's routing ("" for the pool); None where absent."""

    predicted_tokens: float | None = None
    input_tokens: float | None = None
    ratio_sum: float | None = None  # sum of per-request predicted ratios
    ratio_count: float | None = None  # requests they were observed for


@dataclass(frozen=True, slots=True)
class RouterSnapshot:
    kind: str  # "epp" or "dynamo"
    models: tuple[tuple[str, RouterCounters], ...]


_GENERATIONS = ("older", "old", "new")  # one value under several names: the newest name is read


class RouterBuilder:
    """Collects the router samples of one body. Where the EPP emits one value under its
    deprecated and its llm-d names, the newest name wins; they are never added."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str, str], float] = {}  # (model, field, generation) -> sum
        self.kinds: set[str] = set()

    def add(self, field: str, labels: dict[str, str], value: float) -> None:
        kind, _, rest = field.partition(".")
        what, _, generation = rest.partition(".")
        if what == "predicted_bytes":
            what, value = "predicted_tokens", value / 4  # the EPP estimates 4 bytes a token
        if kind == "dynamo" and labels.get("phase") == "decode":
            return
        model = labels.get("model", labels.get("model_name", ALL_MODELS)) if what in ("input_tokens", "predicted_tokens") else ALL_MODELS
        if kind == "epp" and what == "input_tokens":
            model = ALL_MODELS  # the prefix metrics name no model: compare pool with pool
        self.kinds.add(kind)
        key = (model, what, generation)
        self.values[key] = self.values.get(key, 0.0) + value

    def build(self) -> RouterSnapshot | None:
        if not self.kinds:
            return None
        models: dict[str, dict[str, float]] = {}
        best: dict[tuple[str, str], int] = {}
        for (model, what, generation), value in self.values.items():
            rank = _GENERATIONS.index(generation)
            if rank >= best.get((model, what), -1):
                best[(model, what)] = rank
                models.setdefault(model, {})[what] = value
        out = []
        for model, v in sorted(models.items()):
            out.append((model, RouterCounters(predicted_tokens=v.get("predicted_tokens"), input_tokens=v.get("input_tokens"),
                                              ratio_sum=v.get("ratio_sum"), ratio_count=v.get("ratio_count"))))
        return RouterSnapshot(kind="epp" if "epp" in self.kinds else "dynamo", models=tuple(out))

"""Read the fleet's hit ratio for a model from Prometheus, as a new pod's first baseline.

A sidecar in a pod that a rollout just created has no history: without help its first
comparison would be with its own cold start. With `fleet_baseline.prometheus_url` set,
it asks Prometheus (an instant query of the recording rules in alerts/ at the moment the
pod started) once per start, and the deploy rule compares the pod with that once its
cold start is over.
"""
from __future__ import annotations

import math

from .config import FleetBaselineConfig
from .promapi import PrometheusAPI, PrometheusAPIError
from .scrape import redact_url


class BaselineError(Exception):
    pass


class FleetBaselineReader:
    def __init__(self, cfg: FleetBaselineConfig):
        self.cfg = cfg
        self.api = PrometheusAPI(cfg.prometheus_url, cfg.timeout)

    def read(self, model: str, at: float) -> float | None:
        """The ratio at `at`, None when Prometheus has no sample for the model."""
        query = self.cfg.query.replace("$model", model.replace("\\", "\\\\").replace('"', '\\"'))
        where = redact_url(self.api.base_url + "/api/v1/query")
        try:
            body = self.api.get("/api/v1/query", {"query": query, "time": f"{at:.3f}"})
        except PrometheusAPIError as exc:
            raise BaselineError(str(exc)) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise BaselineError(f"{where}: not a successful query answer")
        result = (body.get("data") or {}).get("result")
        if not isinstance(result, list) or not result:
            return None
        if len(result) > 1:
            raise BaselineError(f"{where}: the query gives {len(result)} series for {model}; make it select one")
        try:
            value = float(result[0]["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            raise BaselineError(f"{where}: the answer is not an instant vector") from None
        return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None

    def close(self) -> None:
        self.api.close()

"""Read the fleet's hit ratio for a model from Prometheus, as a new pod's first baseline.

A sidecar in a pod that a rollout just created has no history: without help its first
comparison would be with its own cold start. With `fleet_baseline.prometheus_url` set,
it asks Prometheus (an instant query of the recording rules in alerts/ at the moment the
pod started) once per start, and the deploy rule compares the pod with that once its
cold start is over. The question is asked off the poll: a slow Prometheus delays the
comparison, never a poll, readiness or shutdown.
"""
from __future__ import annotations

import logging
import math
import threading
from typing import Callable, Sequence

from ..config.sections import FleetBaselineConfig
from ..logfields import fields
from ..peers.promapi import PrometheusAPI, PrometheusAPIError
from ..peers.urls import redact_url

log = logging.getLogger(__name__)


class BaselineError(Exception):
    pass


class FleetBaselineReader:
    def __init__(self, cfg: FleetBaselineConfig):
        self.cfg = cfg
        self.api = PrometheusAPI(cfg.prometheus_url, cfg.timeout, cfg.bearer_token, cfg.username, cfg.password)
        self._lock = threading.Lock()
        self._pending: tuple | None = None  # the latest start not yet asked about
        self._worker: threading.Thread | None = None
        self._closed = False

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

    def read_in_background(self, name: str, models: Sequence[str], at: float,
                           deliver: Callable[[str, float, float], None]) -> None:
        """Ask about `models` on a thread of its own and `deliver(model, ratio, at)` each
        ratio found; returns at once. One question in flight per reader: a start while one
        is asked replaces any start still waiting, as only the latest start matters."""
        with self._lock:
            if self._closed:
                return
            self._pending = (name, tuple(models), at, deliver)
            if self._worker is not None and self._worker.is_alive():
                return
            # a daemon: a Prometheus that never answers must not hold the process's exit
            self._worker = threading.Thread(target=self._work, name=f"fleet-baseline {name}", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                job, self._pending = self._pending, None
                if job is None or self._closed:
                    self._worker = None
                    return
            self._ask(*job)

    def _ask(self, name: str, models: Sequence[str], at: float, deliver: Callable[[str, float, float], None]) -> None:
        for model in models:
            try:
                ratio = self.read(model, at)
            except BaselineError as exc:
                log.warning("fleet baseline: %s; no comparison with the fleet", exc, extra=fields(target=name, model=model))
                continue
            except Exception:  # noqa: BLE001 - the thread must say why it gave up, not die silently
                log.exception("fleet baseline failed", extra=fields(target=name, model=model))
                continue
            if self._closed:
                return  # the target went while Prometheus answered: nothing to keep for it
            if ratio is None:
                log.info("fleet baseline: Prometheus has no ratio before %.0f", at, extra=fields(target=name, model=model))
                continue
            log.info("fleet baseline: %.1f%% before the pod started", ratio * 100, extra=fields(target=name, model=model))
            deliver(model, ratio, at)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._pending = None
        self.api.close()

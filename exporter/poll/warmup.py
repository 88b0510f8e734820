"""Warm-up after a (re)start: send configured chat requests (max_tokens 1) to the local
vLLM so the common prompt prefixes are cached before traffic arrives, and hold
`/-/ready` at not-ready until that is done, so Kubernetes routes nothing to a cold pod.

Done means every request was answered since the last start: a request that failed is
sent again (after 1 s, doubling to 30 s) and the gate stays closed meanwhile, since a
warm-up whose requests all failed warmed nothing; a restart of vLLM while a warm-up
runs discards what it cached so far, so the warm-up begins again from its first request.
The requests go through the one peer HTTP client (exporter/peers/http.py): a total
deadline each, a size cap on the answer.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ..config.sections import WarmupConfig
from ..peers.http import Endpoint, PeerConnectionError, PeerError, PeerTimeout, exchange
from ..serve.state import WarmupStatus

log = logging.getLogger(__name__)

SUCCESS, HTTP_ERROR, TIMEOUT, CONNECTION_ERROR, CANCELLED = "success", "http_error", "timeout", "connection_error", "cancelled"
MAX_ANSWER_BYTES = 1024 * 1024  # one token's completion
FIRST_RETRY_SECONDS, LAST_RETRY_SECONDS = 1.0, 30.0


def request_body(body: dict) -> dict:
    """One token is enough to prefill and cache the prompt."""
    out = dict(body)
    out["max_tokens"] = 1
    out.pop("max_completion_tokens", None)
    out["stream"] = False
    return out


class Warmer:
    def __init__(self, cfg: WarmupConfig, clock: Callable[[], float] = time.time,
                 retry: tuple[float, float] = (FIRST_RETRY_SECONDS, LAST_RETRY_SECONDS)):
        self.cfg = cfg
        self.clock = clock
        self.first_retry, self.last_retry = retry  # seconds before the first resend, and the most between two
        self.status = WarmupStatus()
        self.lock = threading.Lock()
        self.endpoint = Endpoint(cfg.url)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._restarted = False  # vLLM (re)started while a warm-up ran: what it warmed is gone

    def trigger(self, reason: str) -> bool:
        """Start a warm-up in the background, or, while one runs, have it begin again.
        Returns whether a new warm-up started."""
        if not self.cfg.enabled:
            return False
        with self.lock:
            if self.status.running:
                self._restarted = True
                self._wake.set()
                log.info("warm-up: %s while warming up; warming up again from the first request", reason)
                return False
            self.status.running, self.status.done, self._restarted = True, False, False
        log.info("warm-up: starting %d request(s) after %s", len(self.cfg.requests), reason)
        self._thread = threading.Thread(target=self._run, name="warmup", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        start = time.monotonic()
        remaining, retry_in = list(self.cfg.requests), self.first_retry
        try:
            while not self._stop.is_set():
                with self.lock:
                    if self._restarted:
                        remaining, retry_in, self._restarted = list(self.cfg.requests), self.first_retry, False
                with ThreadPoolExecutor(max_workers=max(1, self.cfg.concurrency)) as pool:
                    results = list(pool.map(self._send, remaining))
                with self.lock:
                    for result in results:
                        self.status.results[result] = self.status.results.get(result, 0) + 1
                    self.status.last_failed = sum(r != SUCCESS for r in results)
                    if self._restarted:
                        continue
                    remaining = [body for body, result in zip(remaining, results) if result != SUCCESS]
                    if not remaining:
                        self.status.done = True
                        self.status.runs += 1
                        self.status.last_duration = time.monotonic() - start
                        self.status.last_finished = self.clock()
                        break
                failures = ", ".join(sorted({r for r in results if r != SUCCESS}))
                log.warning("warm-up: %d of %d request(s) failed (%s); /-/ready waits, sending them again in %gs",
                            len(remaining), len(results), failures, retry_in)
                self._wake.wait(retry_in)  # a restart or a stop ends the wait
                self._wake.clear()
                retry_in = min(self.last_retry, retry_in * 2)
        finally:
            with self.lock:
                self.status.running = False
        if self.status.done:
            log.info("warm-up: finished %d request(s) in %.1fs", len(self.cfg.requests), time.monotonic() - start)

    def _send(self, body: dict) -> str:
        if self._stop.is_set():
            return CANCELLED
        try:
            answer = exchange(self.endpoint, "POST", timeout=self.cfg.timeout, size_limit=MAX_ANSWER_BYTES,
                              connect_timeout=min(5.0, self.cfg.timeout), headers={"Content-Type": "application/json"},
                              body=json.dumps(request_body(body)).encode())
        except PeerTimeout:
            return TIMEOUT
        except PeerConnectionError:
            return CONNECTION_ERROR
        except PeerError:  # an answer too large or not decodable: vLLM answered, but not as asked
            return HTTP_ERROR
        return SUCCESS if answer.status == 200 else HTTP_ERROR

    def ready(self) -> tuple[bool, str]:
        if not (self.cfg.enabled and self.cfg.gate_readiness):
            return True, ""
        with self.lock:
            if self.status.done:
                return True, ""
            if not self.status.running:
                return False, "waiting for vLLM to start before warming up"
            failing = f"; {self.status.last_failed} request(s) failed, sending them again" if self.status.last_failed else ""
            return False, "warm-up running" + failing

    def snapshot(self) -> WarmupStatus:
        with self.lock:
            return WarmupStatus(self.status.runs, self.status.running, self.status.done, dict(self.status.results),
                                self.status.last_duration, self.status.last_finished, self.status.last_failed)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

"""A small client of Prometheus's HTTP API, for the two places that ask a Prometheus:
discovery (`/api/v1/targets`) and a new pod's fleet baseline (`/api/v1/query`). One place
for the session, auth, timeout, size cap and the errors they all end in."""
from __future__ import annotations

import json

import requests

from .scrape import redact_url

MAX_ANSWER = 64 * 1024 * 1024


class PrometheusAPIError(Exception):
    """Says what went wrong, with the (credential-free) URL asked."""


class PrometheusAPI:
    def __init__(self, base_url: str, timeout: float, bearer_token: str = "", username: str = "", password: str = ""):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        if bearer_token:
            self.session.headers["Authorization"] = f"Bearer {bearer_token}"
        elif username:
            self.session.auth = (username, password)

    def get(self, path: str, params: dict) -> object:
        """The decoded JSON of a 200 answer; PrometheusAPIError for anything else."""
        url = self.base_url + path
        where = redact_url(url)
        try:
            with self.session.get(url, params=params, timeout=self.timeout, stream=True) as resp:
                body = resp.raw.read(MAX_ANSWER + 1, decode_content=True)
                status = resp.status_code
        except requests.RequestException as exc:
            raise PrometheusAPIError(f"{where}: unreachable: {type(exc).__name__}: {_short(exc)}") from None
        if len(body) > MAX_ANSWER:
            raise PrometheusAPIError(f"{where}: answer over {MAX_ANSWER} bytes")
        try:
            payload = json.loads(body)
        except ValueError as exc:
            if status != 200:
                raise PrometheusAPIError(f"{where}: HTTP {status}, answer is not JSON") from None
            raise PrometheusAPIError(f"{where}: answer is not JSON: {exc}") from None
        if status != 200:
            error = payload.get("error") if isinstance(payload, dict) else None
            raise PrometheusAPIError(f"{where}: HTTP {status}" + (f": {error}" if error else ""))
        return payload

    def close(self) -> None:
        self.session.close()


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) < 200 else text[:200] + "..."

"""A small client of Prometheus's HTTP API, for the two places that ask a Prometheus:
discovery (`/api/v1/targets`) and a new pod's fleet baseline (`/api/v1/query`). One place
for the auth, the deadline (one clock over connect, headers and the whole body), the size
cap and the one error everything ends in, so callers count every failure."""
from __future__ import annotations

import json
from urllib.parse import urlencode, urlsplit

from .http import Endpoint, KeptConnection, PeerError, basic_auth, exchange
from .urls import redact_url

MAX_ANSWER = 64 * 1024 * 1024
# a JSON answer decoded whole costs up to 25 bytes of Python objects a byte (one of `[]` or
# `{}`; tracemalloc, exporter/discovery/answercost.py), and may cost what an answer at
# max_answer may cost read from Prometheus's layout there, 20 times max_answer: get() decodes
# an answer of up to 4/5 of max_answer
WHOLE_COST, DECODED_PER_BYTE = 25, 20


class PrometheusAPIError(Exception):
    """Says what went wrong, with the (credential-free) URL asked."""


class PrometheusAPI:
    def __init__(self, base_url: str, timeout: float, bearer_token: str = "", username: str = "", password: str = "",
                 max_answer: int = MAX_ANSWER, compressed: bool = True):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_answer = max_answer
        self.endpoint = Endpoint(self.base_url)
        self.connection = KeptConnection(self.endpoint)  # asked every refresh or read: kept open between them
        self.base_path = urlsplit(self.base_url).path
        self.headers = {"Accept": "application/json"}
        if not compressed:  # exchange() asks for gzip unless told otherwise
            self.headers["Accept-Encoding"] = "identity"
        if bearer_token:
            self.headers["Authorization"] = f"Bearer {bearer_token}"
        elif username:
            self.headers["Authorization"] = basic_auth(username, password)

    def get(self, path: str, params: dict) -> object:
        """The decoded JSON of a 200 answer within `timeout` seconds in all; PrometheusAPIError
        for anything else (a redirect included: a sign-in page is not Prometheus), an answer
        whose decoding could cost over DECODED_PER_BYTE times max_answer included."""
        body, budget = self.get_bytes(path, params), DECODED_PER_BYTE * self.max_answer
        if WHOLE_COST * len(body) > budget:
            raise PrometheusAPIError(f"{self.where(path)}: answer of {len(body)} bytes could cost up to "
                                     f"{WHOLE_COST * len(body) >> 20} MiB decoded, over the {budget >> 20} MiB allowed "
                                     f"({DECODED_PER_BYTE} times its size limit); refused before it is decoded")
        return self.decode(body, self.where(path))

    def get_bytes(self, path: str, params: dict) -> bytes:
        """The body of a 200 answer, not decoded (a caller that reads Prometheus's layout
        itself); PrometheusAPIError for anything else, with the answer's error if it has one."""
        where = self.where(path)
        try:
            answer = exchange(self.endpoint, path=self.base_path + path + "?" + urlencode(params), headers=self.headers,
                              timeout=self.timeout, size_limit=self.max_answer, keep=self.connection)
        except PeerError as exc:
            raise PrometheusAPIError(f"{where}: unreachable: {type(exc).__name__}: {exc}") from None
        if answer.status != 200:
            try:
                payload = json.loads(answer.body)
            except (ValueError, RecursionError):
                raise PrometheusAPIError(f"{where}: HTTP {answer.status}, answer is not JSON") from None
            error = payload.get("error") if isinstance(payload, dict) else None
            raise PrometheusAPIError(f"{where}: HTTP {answer.status}" + (f": {_short(error)}" if error else ""))
        return answer.body

    def where(self, path: str) -> str:
        return redact_url(self.base_url + path)

    @staticmethod
    def decode(body: bytes, where: str) -> object:
        """A 200 answer's JSON; PrometheusAPIError when it is not JSON."""
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise PrometheusAPIError(f"{where}: answer is not JSON: {_short(exc)}") from None

    def close(self) -> None:
        self.connection.close()


def _short(exc: object) -> str:
    text = str(exc)
    return text if len(text) < 200 else text[:200] + "..."

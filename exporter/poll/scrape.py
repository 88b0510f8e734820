"""GET one target's /metrics under one total deadline and size cap; never raises.

peerhttp holds the clock (connect, request, headers and body as one deadline, as a
probe deadline does); here the outcome becomes one of the poll results (exporter/monitor/targetview.py).
"""
from __future__ import annotations

from dataclasses import dataclass
import time

from ..monitor.targetview import CONNECTION_ERROR, DECODE_ERROR, HTTP_ERROR, SUCCESS, TIMEOUT, TOO_LARGE
from ..peers.http import Endpoint, KeptConnection, PeerDecodeError, PeerError, PeerTimeout, PeerTooLarge, exchange

_HEADERS = {"Accept": "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"}


@dataclass(frozen=True)
class ScrapeResult:
    result: str
    duration: float
    body: str | None = None
    error: str | None = None
    status: int | None = None


class Scraper:
    """Scrapes one URL on one kept-alive connection (reopened after a failure). `timeout`
    is the whole scrape's deadline, name resolution included; `idle` caps any single
    wait for bytes within it."""

    def __init__(self, url: str, connect_timeout: float, timeout: float, body_size_limit: int, idle: float | None = None):
        self.url = url
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.idle = idle
        self.body_size_limit = body_size_limit
        self._endpoint = Endpoint(url)
        self.connection = KeptConnection(self._endpoint)

    def close(self) -> None:
        self.connection.close()

    def retire(self) -> None:
        """Replaced (a reload changed the URL or timeouts): closed once a poll in flight ends."""
        self.connection.retire()

    def scrape(self) -> ScrapeResult:
        start = time.monotonic()
        try:
            answer = exchange(self._endpoint, timeout=self.timeout, size_limit=self.body_size_limit, headers=_HEADERS,
                              connect_timeout=self.connect_timeout, idle=self.idle, error_body_limit=0,
                              keep=self.connection)
        except PeerTimeout:
            return ScrapeResult(TIMEOUT, time.monotonic() - start,
                                error=f"timeout: no complete answer within the {self.timeout:g}s scrape deadline")
        except PeerTooLarge as exc:
            return ScrapeResult(TOO_LARGE, time.monotonic() - start, error=f"body {exc}".replace("answer ", ""), status=200)
        except PeerDecodeError as exc:
            return ScrapeResult(DECODE_ERROR, time.monotonic() - start, error=str(exc), status=200)
        except PeerError as exc:
            return ScrapeResult(CONNECTION_ERROR, time.monotonic() - start, error=f"connection_error: {exc}")
        if answer.status != 200:
            return ScrapeResult(HTTP_ERROR, time.monotonic() - start, error=f"HTTP {answer.status}", status=answer.status)
        try:
            body = answer.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return ScrapeResult(DECODE_ERROR, time.monotonic() - start, error=f"body is not UTF-8 at byte {exc.start}", status=200)
        return ScrapeResult(SUCCESS, time.monotonic() - start, body=body, status=200)

"""GET one target's /metrics with timeouts and a body-size cap; never raises."""
from __future__ import annotations

import time
from dataclasses import dataclass

import requests

# The `result` label values of prefixcache_scrapes_total, in one place.
SUCCESS = "success"
TIMEOUT = "timeout"
CONNECTION_ERROR = "connection_error"
HTTP_ERROR = "http_error"
TOO_LARGE = "too_large"
DECODE_ERROR = "decode_error"
RESULTS = (SUCCESS, TIMEOUT, CONNECTION_ERROR, HTTP_ERROR, TOO_LARGE, DECODE_ERROR)

_CHUNK = 64 * 1024


@dataclass(frozen=True)
class ScrapeResult:
    result: str
    duration: float
    body: str | None = None
    error: str | None = None
    status: int | None = None


class Scraper:
    """One requests.Session per target: keep-alive without sharing a pool across targets."""

    def __init__(self, url: str, connect_timeout: float, read_timeout: float, body_size_limit: int):
        self.url = url
        self.timeout = (connect_timeout, read_timeout)
        self.body_size_limit = body_size_limit
        self.session = requests.Session()
        self.session.headers.update({
            "Accept": "text/plain;version=0.0.4;q=0.9,*/*;q=0.1",
            "Accept-Encoding": "gzip",
            "User-Agent": "vllm-prefix-cache-exporter",
        })

    def close(self) -> None:
        self.session.close()

    def scrape(self) -> ScrapeResult:
        start = time.monotonic()
        try:
            with self.session.get(self.url, timeout=self.timeout, stream=True) as resp:
                if resp.status_code != 200:
                    return ScrapeResult(HTTP_ERROR, time.monotonic() - start, error=f"HTTP {resp.status_code}", status=resp.status_code)
                declared = resp.headers.get("Content-Length")
                if declared and declared.isdigit() and int(declared) > self.body_size_limit and "gzip" not in resp.headers.get("Content-Encoding", ""):
                    return ScrapeResult(TOO_LARGE, time.monotonic() - start, error=f"body of {declared} bytes exceeds the {self.body_size_limit} byte limit", status=200)
                chunks, size = [], 0
                # iter_content decompresses gzip, so the cap also stops a gzip bomb
                for chunk in resp.iter_content(_CHUNK):
                    size += len(chunk)
                    if size > self.body_size_limit:
                        return ScrapeResult(TOO_LARGE, time.monotonic() - start, error=f"body exceeds the {self.body_size_limit} byte limit", status=200)
                    chunks.append(chunk)
                raw = b"".join(chunks)
        except requests.exceptions.Timeout as exc:
            return ScrapeResult(TIMEOUT, time.monotonic() - start, error=f"timeout: {type(exc).__name__}")
        except requests.exceptions.ConnectionError as exc:
            # a read timeout inside iter_content surfaces as ConnectionError
            kind = TIMEOUT if "timed out" in str(exc).lower() else CONNECTION_ERROR
            return ScrapeResult(kind, time.monotonic() - start, error=f"{kind}: {_short(exc)}")
        except requests.exceptions.RequestException as exc:
            return ScrapeResult(CONNECTION_ERROR, time.monotonic() - start, error=f"request failed: {_short(exc)}")
        try:
            body = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return ScrapeResult(DECODE_ERROR, time.monotonic() - start, error=f"body is not UTF-8 at byte {exc.start}", status=200)
        return ScrapeResult(SUCCESS, time.monotonic() - start, body=body, status=200)


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."

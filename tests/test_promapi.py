"""The Prometheus API client against a misbehaving Prometheus on 127.0.0.1: every way an
answer can go wrong ends as PrometheusAPIError within the deadline, never as a urllib3 or
requests exception that escapes the caller's failure count."""
import base64
import json
import time

import pytest

from exporter.peers.promapi import PrometheusAPI, PrometheusAPIError

from fakeserver import JSON_OK, FakeServer, MisbehavingServer, reply


@pytest.fixture(scope="module")
def prom():
    with MisbehavingServer() as s:
        yield s


def test_a_good_answer(prom):
    api = PrometheusAPI(prom.url("ok"), 2.0)
    assert api.get("/api/v1/query", {"query": "up"}) == json.loads(JSON_OK)


@pytest.mark.parametrize("behaviour, says", [
    ("drip", "1s deadline"),  # headers at once, then a byte a second: each read is quick, the whole is not
    ("drip-head", "1s deadline"),
    ("silent", "1s deadline"),
    ("endless", "byte limit"),
    ("redirect", "HTTP 302"),
    ("short", "short"),
    ("badgzip", "gzip"),
])
def test_every_misbehaviour_is_the_clients_error_within_its_deadline(prom, behaviour, says):
    api = PrometheusAPI(prom.url(behaviour), 1.0, max_answer=1024 * 1024)
    start = time.monotonic()
    with pytest.raises(PrometheusAPIError) as err:
        api.get("/api/v1/targets", {"state": "active"})
    assert time.monotonic() - start < 1.6
    assert says in str(err.value) and prom.url(behaviour) in str(err.value)


def test_credentials_are_sent_and_never_shown():
    seen = []

    def route(h):
        seen.append(h.headers.get("Authorization"))
        reply(h, 500, b'{"status":"error","error":"boom"}')

    with FakeServer({"/api/v1/query": route}) as server:
        with pytest.raises(PrometheusAPIError) as err:
            PrometheusAPI(server.base, 2.0, username="u", password="p4ss").get("/api/v1/query", {"query": "up"})
        assert "HTTP 500: boom" in str(err.value)
        userinfo = server.base.replace("http://", "http://u:p4ss@")
        with pytest.raises(PrometheusAPIError) as err:
            PrometheusAPI(userinfo, 2.0).get("/api/v1/query", {"query": "up"})
        assert "p4ss" not in str(err.value) and "u:xxxxx@" in str(err.value)
    basic = "Basic " + base64.b64encode(b"u:p4ss").decode()
    assert seen == [basic, basic]


def test_discovery_counts_a_broken_answer_as_a_failed_refresh(prom):
    """prefixcache_discovery_last_refresh_successful reads the source's `ok`: a short body
    or bad gzip must make it 0, not escape as a traceback while it stays 1."""
    from exporter.config.discovery import DiscoveryConfig, PrometheusSDConfig
    from exporter.discovery.sources import Discovery

    for behaviour in ("short", "badgzip"):
        d = Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=prom.url(behaviour), job="vllm", timeout=1.0)), time.time)
        assert d.refresh() == []
        (state,) = d.snapshot()
        assert not state.ok and state.failures == 1, behaviour


def test_an_answer_whose_decoding_could_cost_over_20_times_the_size_limit_is_refused_before_it_is_decoded():
    """Decoded whole, `[[],[],...]` costs 22-25 bytes a byte: an answer over 4/5 of max_answer
    could cost more than 20 times it, and is refused; one under it is decoded."""
    import tracemalloc
    body = b'{"status":"success","data":{"resultType":"vector","result":[' + b",".join([b"[]"] * 40_000) + b"]}}"
    with FakeServer({"/api/v1/query": lambda h: reply(h, 200, body)}) as server:
        api = PrometheusAPI(server.base, 5.0, max_answer=len(body) + 1000)  # the bytes pass the size limit
        tracemalloc.start()
        try:
            with pytest.raises(PrometheusAPIError) as err:
                api.get("/api/v1/query", {"query": "up"})
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert f"answer of {len(body)} bytes could cost up to" in str(err.value) and server.base in str(err.value)
        assert peak < 3 * len(body)  # its bytes, read; no list of them made (22 times)
        roomy = PrometheusAPI(server.base, 5.0, max_answer=2 * len(body))
        assert len(roomy.get("/api/v1/query", {"query": "up"})["data"]["result"]) == 40_000

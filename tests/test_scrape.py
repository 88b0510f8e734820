import time

import pytest

from exporter.poll import scrape
from exporter.peers.urls import redact_url
from exporter.poll.scrape import Scraper

from conftest import FIXTURES, free_port
from fakeserver import FakeServer, drip, endless_chunks, gzipped, reply, slow, text

GOOD = (FIXTURES / "vllm-metrics" / "v1-0.10.0_production-stack-issue-617.txt").read_text()
GARBAGE = (FIXTURES / "edge" / "garbage.txt").read_text()


@pytest.fixture(scope="module")
def server():
    routes = {
        "/ok": text(GOOD),
        "/gzip": gzipped(GOOD),
        "/500": text("boom", status=500),
        "/slow": slow(1.5),
        "/huge": endless_chunks(b"x" * 65536, 8 * 1024 * 1024),
        "/garbage": text(GARBAGE),
        "/latin1": lambda h: reply(h, 200, b"caf\xe9 1\n"),
        "/drip-body": drip(0.1, 200),
        "/drip-headers": drip(0.1, 200, headers_first=False),
        "/auth": lambda h: reply(h, 200, (h.headers.get("Authorization") or "none").encode()),
    }
    with FakeServer(routes) as s:
        yield s


def scraper(url, read_timeout=2.0, limit=1024 * 1024):
    return Scraper(url, 1.0, read_timeout, limit)


def test_ok(server):
    res = scraper(server.base + "/ok").scrape()
    assert res.result == scrape.SUCCESS and res.body == GOOD and res.duration >= 0


def test_gzip_is_requested_and_decoded(server):
    res = scraper(server.base + "/gzip").scrape()
    assert res.result == scrape.SUCCESS and res.body == GOOD
    assert "gzip" in server.requests[-1][2]["Accept-Encoding"]


def test_http_error(server):
    res = scraper(server.base + "/500").scrape()
    assert (res.result, res.status, res.error) == (scrape.HTTP_ERROR, 500, "HTTP 500")


def test_timeout(server):
    res = scraper(server.base + "/slow", read_timeout=0.3).scrape()
    assert res.result == scrape.TIMEOUT
    assert res.duration < 1.4


def test_oversized_body_is_refused_while_streaming(server):
    res = scraper(server.base + "/huge", limit=256 * 1024).scrape()
    assert res.result == scrape.TOO_LARGE
    assert res.body is None
    assert "262144 byte limit" in res.error


def test_garbage_is_a_successful_scrape_left_to_the_parser(server):
    res = scraper(server.base + "/garbage").scrape()
    assert res.result == scrape.SUCCESS and res.body == GARBAGE


def test_not_utf8(server):
    res = scraper(server.base + "/latin1").scrape()
    assert res.result == scrape.DECODE_ERROR


def test_dead_target():
    res = scraper(f"http://127.0.0.1:{free_port()}/metrics").scrape()
    assert res.result == scrape.CONNECTION_ERROR
    assert res.error


@pytest.mark.parametrize("path", [
    pytest.param("/drip-body", id="body-drips-a-byte-at-a-time"),
    pytest.param("/drip-headers", id="headers-drip-a-byte-at-a-time"),
])
def test_one_deadline_covers_the_whole_scrape(server, path):
    """Each byte arrives well within the idle timeout; the total deadline still cuts it."""
    s = Scraper(server.base + path, 1.0, 1.0, 1024 * 1024, idle=0.5)
    res = s.scrape()
    assert res.result == scrape.TIMEOUT and "1s scrape deadline" in res.error
    assert 0.9 <= res.duration < 1.5


def test_userinfo_is_sent_as_basic_auth_and_never_shown(server):
    url = server.base.replace("http://", "http://scraper:s3cret@") + "/auth"
    res = scraper(url).scrape()
    assert res.result == scrape.SUCCESS and res.body == "Basic c2NyYXBlcjpzM2NyZXQ="
    assert redact_url(url) == server.base.replace("http://", "http://scraper:xxxxx@") + "/auth"


def test_a_gzip_bomb_is_cut_at_the_size_limit():
    import gzip as gz
    bomb = gz.compress(b"0" * (64 * 1024 * 1024))
    with FakeServer({"/bomb": lambda h: reply(h, 200, bomb, [("Content-Encoding", "gzip")])}) as s:
        res = scraper(s.base + "/bomb", limit=1024 * 1024).scrape()
    assert res.result == scrape.TOO_LARGE


@pytest.fixture(scope="module")
def misbehaving():
    from fakeserver import MisbehavingServer
    with MisbehavingServer(ok_body=GOOD.encode()) as s:
        yield s


@pytest.mark.parametrize("behaviour, result", [
    ("ok", scrape.SUCCESS),
    ("drip", scrape.TIMEOUT),
    ("drip-head", scrape.TIMEOUT),
    ("silent", scrape.TIMEOUT),
    ("endless", scrape.TOO_LARGE),
    ("redirect", scrape.HTTP_ERROR),
    ("short", scrape.CONNECTION_ERROR),
    ("badgzip", scrape.DECODE_ERROR),
])
def test_every_misbehaviour_ends_within_the_deadline_as_what_it_is(misbehaving, behaviour, result):
    """A body that ends before its Content-Length is a broken scrape, never a shorter
    success (that would read as series gone); nothing outlives the 1 s deadline."""
    res = Scraper(misbehaving.url(behaviour) + "/metrics", 1.0, 1.0, 1024 * 1024).scrape()
    assert res.result == result, res.error
    assert res.duration < 1.5
    assert (res.body == GOOD) == (result == scrape.SUCCESS)


def test_a_gzip_stream_cut_before_its_end_is_a_decode_error():
    import gzip as gz
    cut = gz.compress(GOOD.encode())[:-100]
    with FakeServer({"/cut": lambda h: reply(h, 200, cut, [("Content-Encoding", "gzip")])}) as s:
        res = scraper(s.base + "/cut").scrape()
    assert res.result == scrape.DECODE_ERROR and "ends before" in res.error


def test_an_error_status_is_told_at_once_even_when_its_body_stalls():
    def stalled_500(h):
        h.wfile.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100\r\n\r\n")
        h.wfile.flush()
        time.sleep(3)
        h.close_connection = True

    with FakeServer({"/metrics": stalled_500}) as s:
        res = scraper(s.base + "/metrics").scrape()
    assert res.result == scrape.HTTP_ERROR and res.status == 500 and res.duration < 1.0

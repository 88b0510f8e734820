"""The one HTTP client (exporter/peers/http.py): name resolution inside the deadline,
kept-alive connections that reconnect when the peer closed them."""
import socket
import threading
import time

import pytest

from exporter.peers import http as peerhttp
from exporter.peers.http import Endpoint, KeptConnection, PeerConnectionError, PeerTimeout, exchange

from fakeserver import FakeServer, reply


@pytest.fixture
def resolver(monkeypatch):
    """A fresh resolver whose getaddrinfo stalls `stall` seconds for names under .stalled."""
    stall = {"seconds": 3.0}
    real = socket.getaddrinfo
    calls = []

    def getaddrinfo(host, port, *args, **kwargs):
        calls.append(host)
        if host.endswith(".stalled"):
            time.sleep(stall["seconds"])
            return real("127.0.0.1", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(peerhttp.socket, "getaddrinfo", getaddrinfo)
    fresh = peerhttp._Resolver()
    monkeypatch.setattr(peerhttp, "RESOLVER", fresh)
    fresh.calls, fresh.stall = calls, stall
    return fresh


def test_a_stalled_resolver_costs_the_exchange_its_deadline_not_more(resolver):
    """getaddrinfo blocking 3 s on a 1 s deadline: the exchange ends at 1 s."""
    endpoint = Endpoint("http://vllm-0.stalled:8000/metrics")
    began = time.monotonic()
    with pytest.raises(PeerTimeout):
        exchange(endpoint, timeout=1.0, size_limit=1024)
    took = time.monotonic() - began
    assert 0.9 < took < 1.6, took
    # a second exchange while the lookup still stalls waits for the same lookup, within its own deadline
    began = time.monotonic()
    with pytest.raises(PeerTimeout):
        exchange(endpoint, timeout=0.5, size_limit=1024)
    assert time.monotonic() - began < 1.0
    assert resolver.calls == ["vllm-0.stalled"]


def test_a_resolved_name_is_cached_for_its_ttl(resolver):
    with FakeServer({"/metrics": lambda h: reply(h, 200, b"ok")}) as server:
        endpoint = Endpoint(server.base.replace("127.0.0.1", "localhost") + "/metrics")
        for _ in range(3):
            assert exchange(endpoint, timeout=5.0, size_limit=1024).body == b"ok"
    assert resolver.calls == ["localhost"]


def test_an_address_is_never_resolved(resolver):
    with FakeServer({"/metrics": lambda h: reply(h, 200, b"ok")}) as server:
        assert exchange(Endpoint(server.base + "/metrics"), timeout=5.0, size_limit=1024).body == b"ok"
    assert resolver.calls == []


def _peer_port(h):
    reply(h, 200, str(h.client_address[1]).encode())


def _closes_after(h):
    h.close_connection = True  # answers, then closes without saying so: the kept connection is stale
    reply(h, 200, str(h.client_address[1]).encode())


def test_a_kept_connection_carries_every_exchange():
    with FakeServer({"/port": _peer_port}) as server:
        keep = KeptConnection(Endpoint(server.base + "/port"))
        ports = {exchange(keep.endpoint, timeout=5.0, size_limit=1024, keep=keep).body for _ in range(5)}
        keep.close()
    assert len(ports) == 1 and keep.opened == 1


def test_a_connection_the_peer_closed_is_replaced_within_the_same_exchange():
    with FakeServer({"/port": _closes_after}) as server:
        keep = KeptConnection(Endpoint(server.base + "/port"))
        answers = [exchange(keep.endpoint, timeout=5.0, size_limit=1024, keep=keep) for _ in range(3)]
        keep.close()
    assert [a.status for a in answers] == [200, 200, 200] and len({a.body for a in answers}) == 3


def test_a_failed_exchange_closes_the_kept_connection_and_the_next_reopens_it():
    state = {"fail": False}

    def route(h):
        if state["fail"]:
            time.sleep(1.0)
        reply(h, 200, b"ok")

    with FakeServer({"/m": route}) as server:
        keep = KeptConnection(Endpoint(server.base + "/m"))
        exchange(keep.endpoint, timeout=5.0, size_limit=1024, keep=keep)
        state["fail"] = True
        with pytest.raises(PeerTimeout):
            exchange(keep.endpoint, timeout=0.3, size_limit=1024, keep=keep)
        assert keep.conn is None
        state["fail"] = False
        assert exchange(keep.endpoint, timeout=5.0, size_limit=1024, keep=keep).body == b"ok"
        keep.close()
    assert keep.opened == 2


def test_two_exchanges_at_once_never_share_one_connection():
    gate = threading.Event()

    def route(h):
        gate.wait(5.0)
        reply(h, 200, b"ok")

    with FakeServer({"/m": route}) as server:
        keep = KeptConnection(Endpoint(server.base + "/m"))
        results = []
        first = threading.Thread(target=lambda: results.append(exchange(keep.endpoint, timeout=5.0, size_limit=1024, keep=keep)))
        first.start()
        time.sleep(0.2)
        second = threading.Thread(target=lambda: results.append(exchange(keep.endpoint, timeout=5.0, size_limit=1024, keep=keep)))
        second.start()
        time.sleep(0.2)
        gate.set()
        first.join(5)
        second.join(5)
        keep.close()
    assert [r.body for r in results] == [b"ok", b"ok"] and keep.opened == 1


def test_an_unresolvable_name_is_a_connection_error(resolver):
    with pytest.raises(PeerConnectionError):
        exchange(Endpoint("http://no-such-host.invalid:1/metrics"), timeout=5.0, size_limit=1024)

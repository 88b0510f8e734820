"""exporter/notify/resolve.py: the addresses behind an Alertmanager's name, as Prometheus's
dns_sd (type A, AAAA where there is no A) finds them, within a deadline."""
import threading
import time

import pytest

from exporter.notify.resolve import MAX_ADDRESSES, BoundedLookup, ResolveError, is_address, lookup, ordered, url_for


def test_the_system_resolver_gives_the_names_ipv4_addresses():
    assert lookup("localhost", 9093) == ["127.0.0.1"]  # /etc/hosts: no DNS needed
    assert lookup("127.0.0.2", 9093) == ["127.0.0.2"]


def test_addresses_are_distinct_in_numeric_order_and_capped():
    assert ordered(["10.0.0.10", "10.0.0.9", "10.0.0.10"]) == ["10.0.0.9", "10.0.0.10"]
    assert ordered(["fd00::2", "fd00::1"]) == ["fd00::1", "fd00::2"]
    assert len(ordered([f"10.1.{i // 256}.{i % 256}" for i in range(100)])) == MAX_ADDRESSES


@pytest.mark.parametrize("url, address, expected", [
    ("http://alertmanager-operated.monitoring.svc:9093/api/v2/alerts", "10.0.0.7", "http://10.0.0.7:9093/api/v2/alerts"),
    ("https://u:p%40ss@am.example/prefix/api/v2/alerts", "fd00::7", "https://u:p%40ss@[fd00::7]/prefix/api/v2/alerts"),
])
def test_an_address_takes_the_names_place_in_the_url(url, address, expected):
    assert url_for(url, address) == expected


def test_is_address():
    assert is_address("10.0.0.1") and is_address("fd00::1") and not is_address("alertmanager-operated")


def test_a_lookup_that_hangs_is_given_up_at_the_deadline_and_not_started_twice():
    release = threading.Event()
    calls = []

    def hanging(host, port):
        calls.append(host)
        release.wait(10)
        return ["10.0.0.1"]

    bounded = BoundedLookup(hanging, 0.2)
    started = time.monotonic()
    with pytest.raises(ResolveError, match="no answer within 0.2s"):
        bounded("am", 9093)
    with pytest.raises(ResolveError, match="previous lookup has not answered"):
        bounded("am", 9093)
    assert time.monotonic() - started < 1.0 and calls == ["am"]
    release.set()
    deadline = time.monotonic() + 5
    while bounded._running and time.monotonic() < deadline:  # the hung lookup ends: the name may be asked again
        time.sleep(0.01)
    assert bounded("am", 9093) == ["10.0.0.1"]


def test_a_resolvers_bug_is_that_names_failure():
    def broken(host, port):
        raise RuntimeError("boom")

    with pytest.raises(ResolveError, match="RuntimeError: boom"):
        BoundedLookup(broken, 1.0)("am", 9093)

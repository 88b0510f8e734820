import base64
import json

import pytest

from exporter.notify.alertmanager import Notifier, payload, rfc3339
from exporter.config.sections import AlertmanagerConfig
from exporter.alerting.rules_state import FIRING, RESOLVED, Alert, Transition

from conftest import free_port, wait_for
from fakeserver import FakeServer, reply


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def alert(state=FIRING, resolved_at=None):
    return Alert("PrefixCacheHitRateLow", "vllm-0", "m", state=state, active_at=990.0, fired_at=1000.0, last_true=1000.0,
                 resolved_at=resolved_at,
                 labels=(("alertname", "PrefixCacheHitRateLow"), ("cause", "eviction_pressure"), ("model_name", "m"),
                         ("severity", "warning"), ("target", "vllm-0")),
                 annotations=(("dashboard_url", ""), ("description", "d"), ("runbook_url", "http://r#x"), ("summary", "s")))


class Receiver:
    def __init__(self, status=200):
        self.status = status
        self.bodies = []
        self.headers = []

    def __call__(self, h):
        self.headers.append(dict(h.headers))
        if self.status == 200:
            self.bodies.append(json.loads(h.body))
        reply(h, self.status, b"{}")


@pytest.fixture
def am():
    receiver = Receiver()
    with FakeServer({"/api/v2/alerts": receiver}) as server:
        receiver.base = server.base
        yield receiver


def notifier(url, clock, **cfg):
    return Notifier(AlertmanagerConfig(urls=(url,), **{"resend_interval": 60.0, "timeout": 2.0, **cfg}), "http://sidecar:9464/", clock)


def test_payload_follows_the_v2_postable_alert():
    body = payload(alert(), 1000.0, 60.0, "http://g/")
    assert body == {"labels": dict(alert().labels), "annotations": {"description": "d", "runbook_url": "http://r#x", "summary": "s"},
                    "startsAt": rfc3339(1000.0), "endsAt": rfc3339(1240.0), "generatorURL": "http://g/"}
    assert rfc3339(0.5) == "1970-01-01T00:00:00.500Z"


def test_firing_then_resend_then_resolved(am):
    clock = Clock()
    n = notifier(am.base, clock)
    n.transitions([Transition(1000.0, alert(), FIRING)])
    n.deliver_once()
    assert [a["labels"]["cause"] for a in am.bodies[0]] == ["eviction_pressure"]
    n.resend([alert()])  # queued less than a resend interval ago: nothing new
    n.deliver_once()
    assert len(am.bodies) == 1
    clock.t = 1061.0
    n.resend([alert()])
    n.deliver_once()
    assert len(am.bodies) == 2 and am.bodies[1][0]["endsAt"] == rfc3339(1061.0 + 240.0)
    clock.t = 1070.0
    n.transitions([Transition(1070.0, alert(state="inactive", resolved_at=1070.0), RESOLVED)])
    n.deliver_once()
    assert am.bodies[2][0]["endsAt"] == rfc3339(1070.0)
    assert n.stats()[0].alerts_sent == 3 and n.stats()[0].pending == 0
    n.stop(1.0)


def test_a_wall_clock_stepped_back_keeps_the_resends_going_so_alertmanager_never_resolves_by_itself(am):
    """NTP steps the wall clock back 10 minutes: the resends follow the ticker (monotonic),
    so the alert's endsAt keeps moving ahead of Alertmanager's clock; before, no resend came
    for 10 minutes and Alertmanager resolved the alert at its endsAt (4 resend intervals)."""
    wall, ticker = Clock(), Clock()
    n = Notifier(AlertmanagerConfig(urls=(am.base,), resend_interval=60.0, timeout=2.0), "http://sidecar:9464/", wall, ticker=ticker)
    n.transitions([Transition(1000.0, alert(), FIRING)])
    n.deliver_once()
    wall.t -= 600.0  # stepped back
    for _ in range(5):
        wall.t += 61.0
        ticker.t += 61.0
        n.resend([alert()])
        n.deliver_once()
    assert len(am.bodies) == 6
    assert am.bodies[-1][0]["endsAt"] == rfc3339(wall.t + 240.0)  # Alertmanager's time: the wall clock's
    n.stop(1.0)


def test_an_outage_loses_no_transition_and_backs_off():
    clock = Clock()
    receiver = Receiver(status=503)
    with FakeServer({"/api/v2/alerts": receiver}) as server:
        n = notifier(server.base, clock)
        n.transitions([Transition(1000.0, alert(), FIRING)])
        n.deliver_once()
        n.deliver_once()  # inside the backoff: not even tried
        assert len(receiver.headers) == 1 and n.stats()[0].notifications_failed == 1
        clock.t += 0.6
        n.deliver_once()
        assert len(receiver.headers) == 2
        n.transitions([Transition(1001.0, alert(state="inactive", resolved_at=1001.0), RESOLVED)])
        receiver.status = 200
        clock.t += 5
        n.deliver_once()
        (delivered,) = receiver.bodies
        assert delivered[0]["endsAt"] == rfc3339(1001.0)  # the latest state, the resolution
        assert n.stats()[0].pending == 0 and n.stats()[0].last_error is None
        n.stop(1.0)


def test_dead_alertmanager_is_counted_not_raised():
    n = notifier(f"http://127.0.0.1:{free_port()}", Clock())
    n.transitions([Transition(1000.0, alert(), FIRING)])
    n.deliver_once()
    s = n.stats()[0]
    assert s.notifications_failed == 1 and s.pending == 1 and "ConnectionError" in s.last_error
    n.stop(0.5)


def test_queue_is_bounded_and_counts_drops(am):
    n = notifier(am.base, Clock(), queue_capacity=2)
    alerts = [Alert("A", f"t{i}", "m", state=FIRING, fired_at=1.0, labels=(("alertname", "A"), ("target", f"t{i}"))) for i in range(5)]
    n.transitions([Transition(1.0, a, FIRING) for a in alerts])
    assert n.stats()[0].pending == 2 and n.stats()[0].dropped == 3
    n.stop(1.0)


@pytest.mark.parametrize("cfg, header", [
    pytest.param({"username": "u", "password": "p"}, "Basic " + base64.b64encode(b"u:p").decode(), id="basic-auth"),
    pytest.param({"bearer_token": "tok"}, "Bearer tok", id="bearer"),
])
def test_auth(am, cfg, header):
    n = notifier(am.base, Clock(), **cfg)
    n.transitions([Transition(1000.0, alert(), FIRING)])
    n.deliver_once()
    assert am.headers[-1]["Authorization"] == header
    n.stop(1.0)


def test_stop_delivers_what_is_pending_within_its_bound(am):
    n = notifier(am.base, Clock()).start()
    n.transitions([Transition(1000.0, alert(), FIRING)])
    n.stop(3.0)
    assert am.bodies


def test_a_4xx_answer_drops_the_batch_instead_of_retrying_it_forever(am, caplog):
    clock = Clock()
    am.status = 400
    n = notifier(am.base, clock)
    n.transitions([Transition(1000.0, alert(), FIRING)])
    n.deliver_once()
    stats = n.stats()[0]
    assert stats.pending == 0 and stats.rejected == 1 and stats.notifications_failed == 0
    assert "rejected 1 alert(s), dropped them: HTTP 400" in caplog.text
    clock.t += 100
    n.deliver_once()
    assert len(am.headers) == 1  # not sent again


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_transient_answers_are_retried(am, status):
    am.status = status
    n = notifier(am.base, Clock())
    n.transitions([Transition(1000.0, alert(), FIRING)])
    n.deliver_once()
    assert n.stats()[0].pending == 1 and n.stats()[0].notifications_failed == 1


def test_resolved_alerts_are_resent_for_15_minutes(am):
    """As Prometheus does: an Alertmanager that missed the resolution (restart, network)
    still learns of it."""
    clock = Clock(2000.0)
    n = notifier(am.base, clock)
    gone = alert(state="inactive", resolved_at=2000.0)
    n.transitions([Transition(2000.0, gone, RESOLVED)])
    n.deliver_once()
    for t in range(2060, 3100, 60):
        clock.t = float(t)
        n.resend([])
        n.deliver_once()
    sent_at = [b[0]["endsAt"] for b in am.bodies]
    assert all(e == rfc3339(2000.0) for e in sent_at)  # every copy says when it ended
    assert 15 <= len(am.bodies) <= 17  # the first and one per resend interval for 15 minutes, then none


def test_the_queue_is_keyed_by_the_label_set(am):
    """Two alerts whose label sets are equal are one alert to Alertmanager: the later
    state replaces the earlier in the queue."""
    n = notifier(am.base, Clock())
    a = alert()
    b = Alert("PrefixCacheHitRateLow", "vllm-0", "other-model-key", state=FIRING, fired_at=1000.0, labels=a.labels)
    n.transitions([Transition(1000.0, a, FIRING), Transition(1000.0, b, FIRING)])
    assert n.stats()[0].pending == 1


def test_stop_and_the_delivery_thread_never_post_one_batch_twice():
    """stop()'s flush starts while the delivery thread's POST of the same batch is in flight
    (the fake Alertmanager holds the answer until then): the batch is posted once."""
    import threading
    seen = []
    in_flight, release = threading.Event(), threading.Event()

    def held(h):
        seen.append(json.loads(h.body)[0]["labels"]["alertname"])
        in_flight.set()
        release.wait(10)
        reply(h, 200, b"{}")

    flushing = lambda: any(t.name == "alertmanager flush" and t.is_alive() for t in threading.enumerate())  # noqa: E731
    with FakeServer({"/api/v2/alerts": held}) as server:
        n = notifier(server.base, Clock()).start()
        n.transitions([Transition(1000.0, alert(), FIRING)])
        try:
            assert in_flight.wait(5), "the delivery thread never posted"
            stopper = threading.Thread(target=n.stop, kwargs={"timeout": 3.0})
            stopper.start()
            assert wait_for(flushing, timeout=5, step=0.01), "stop() never began its flush"
        finally:
            release.set()
        stopper.join(5.0)
        assert not stopper.is_alive()
    assert seen == ["PrefixCacheHitRateLow"]


# --- misbehaving Alertmanagers -----------------------------------------------------------------------
def test_a_dripping_alertmanager_delays_only_its_own_alerts_and_never_the_stop():
    from fakeserver import MisbehavingServer
    with MisbehavingServer() as server:
        cfg = AlertmanagerConfig(urls=(server.url("drip"), server.url("ok")), resend_interval=60.0, timeout=30.0)
        n = Notifier(cfg, "http://sidecar:9464/", Clock()).start()
        n.transitions([Transition(1000.0, alert(), FIRING)])
        # the healthy one gets its alert at once, while the dripping one holds its POST
        assert wait_for(lambda: n.stats()[1].notifications_ok == 1, timeout=3.0), n.stats()
        assert n.stats()[0].pending == 1 and server.hits.get("drip") == 1
        n.stop(1.0)
        # stopped with the drip's POST still in flight: neither its 30 s deadline (a failure)
        # nor the end of its 1,000 s answer (a success) was waited for
        s = n.stats()[0]
        assert s.notifications_ok == s.notifications_failed == 0 and not server.stopping.is_set(), s


@pytest.mark.slow
def test_a_post_has_one_deadline_for_its_whole_answer():
    from fakeserver import MisbehavingServer
    with MisbehavingServer() as server:
        for behaviour in ("drip", "drip-head", "silent"):
            n = notifier(server.url(behaviour), Clock(), timeout=1.0)
            n.transitions([Transition(1000.0, alert(), FIRING)])
            n.deliver_once()  # the drips last 1,000 s: only the one 1 s deadline over the whole answer ends them
            s = n.stats()[0]
            assert s.notifications_failed == 1 and s.pending == 1 and "1s deadline" in s.last_error, behaviour


def test_an_endless_answer_is_cut_at_the_size_cap_not_read_whole():
    """A 200 whose body never ends (a misrouted stream): the old client read it all,
    RSS grew by GBs; it is a failure once over the cap, and the alert stays queued."""
    from fakeserver import endless_chunks
    with FakeServer({"/api/v2/alerts": endless_chunks(b" " * 65536, 64 * 1024 * 1024)}) as server:
        n = notifier(server.base, Clock())
        n.transitions([Transition(1000.0, alert(), FIRING)])
        n.deliver_once()  # "byte limit" below: cut once over the cap, not read to the 64 MiB end
    s = n.stats()[0]
    assert s.notifications_ok == 0 and s.pending == 1 and "byte limit" in s.last_error


def test_a_redirect_is_a_failure_not_a_delivery():
    """A 302 to a sign-in page was followed as a GET, answered 200 and counted delivered:
    the alert was lost and success recorded."""
    from fakeserver import MisbehavingServer
    with MisbehavingServer() as server:
        n = notifier(server.url("redirect"), Clock())
        n.transitions([Transition(1000.0, alert(), FIRING)])
        n.deliver_once()
        assert "signin" not in server.hits
    s = n.stats()[0]
    assert s.notifications_ok == 0 and s.notifications_failed == 1 and s.pending == 1
    assert s.last_error.startswith("HTTP 302: redirect to /signin")


# --- every Alertmanager behind a name ---------------------------------------------------------------
class Resolver:
    """The answers of a DNS server for headless Services, as the test sets them; a name
    not set is NXDOMAIN. `fail` makes every lookup a SERVFAIL."""

    def __init__(self, names=None):
        self.names = dict(names or {})
        self.calls = []
        self.fail = False

    def __call__(self, host, port):
        from exporter.notify.resolve import ResolveError
        self.calls.append((host, port))
        if self.fail:
            raise ResolveError(f"cannot resolve {host}: SERVFAIL")
        return list(self.names.get(host, []))


def named(url, resolver, **cfg):
    return Notifier(AlertmanagerConfig(urls=(url,), **{"resend_interval": 60.0, "timeout": 2.0, **cfg}),
                    "http://sidecar:9464/", Clock(), resolve=resolver)


def test_a_url_whose_host_is_an_address_stays_one_queue_and_is_never_resolved():
    resolver = Resolver()
    n = Notifier(AlertmanagerConfig(urls=("http://10.0.0.7:9093", "http://[fd00::7]:9093/am/")), "g", Clock(), resolve=resolver)
    assert [s.url for s in n.stats()] == ["http://10.0.0.7:9093/api/v2/alerts", "http://[fd00::7]:9093/am/api/v2/alerts"]
    assert n.refresh_names() is False and resolver.calls == [] and n.discovered() == 2


def test_a_name_is_every_address_behind_it_each_a_queue_of_its_own_following_the_pods():
    """kube-prometheus-stack's HA Alertmanager behind the headless alertmanager-operated:
    posted to the name, one replica got each alert; Prometheus sends to all of them."""
    resolver = Resolver({"alertmanager-operated.monitoring.svc": ["10.0.0.12", "10.0.0.11"]})
    n = named("http://u:pw@alertmanager-operated.monitoring.svc:9093", resolver)
    assert n.discovered() == 0  # nothing resolved yet: nothing to send to, and it says so
    assert n.refresh_names() is True and resolver.calls == [("alertmanager-operated.monitoring.svc", 9093)]
    assert [s.url for s in n.stats()] == ["http://u:pw@10.0.0.11:9093/api/v2/alerts", "http://u:pw@10.0.0.12:9093/api/v2/alerts"]
    endpoint = n.queues[0].endpoint
    assert (endpoint.connect_to, endpoint.host, endpoint.headers["Host"]) == ("10.0.0.11", "alertmanager-operated.monitoring.svc",
                                                                           "alertmanager-operated.monitoring.svc:9093")
    a, gone = alert(), Alert("PrefixCacheTargetDown", "vllm-1", "", state=FIRING, labels=(("alertname", "PrefixCacheTargetDown"),))
    n.transitions([Transition(1000.0, a, FIRING), Transition(1000.0, gone, FIRING)])
    n.transitions([Transition(1001.0, gone, RESOLVED)])
    assert [s.pending for s in n.stats()] == [2, 2]
    # a pod replaced: its queue goes, the new one gets what is firing (at the next resend) and the resolution
    resolver.names["alertmanager-operated.monitoring.svc"] = ["10.0.0.12", "10.0.0.13"]
    assert n.refresh_names() is True and n.refresh_names() is False
    assert [s.url.split("@")[1] for s in n.stats()] == ["10.0.0.12:9093/api/v2/alerts", "10.0.0.13:9093/api/v2/alerts"]
    assert [s.pending for s in n.stats()] == [2, 0]
    n.resend([a])
    assert [s.pending for s in n.stats()] == [2, 2]
    assert n.discovered() == 2


def test_a_failed_lookup_keeps_the_addresses_and_an_authoritative_none_drops_them(caplog):
    resolver = Resolver({"am.example": ["10.0.0.1"]})
    n = named("http://am.example:9093", resolver)
    n.refresh_names()
    resolver.fail = True
    assert n.refresh_names() is False and n.discovered() == 1
    assert "SERVFAIL" in caplog.text and "keeping its 1 address(es)" in caplog.text
    resolver.fail = False
    resolver.names.clear()  # NXDOMAIN, as Prometheus's dns_sd believes it
    assert n.refresh_names() is True and n.discovered() == 0


def test_addresses_are_capped_per_name_the_same_ones_every_refresh():
    from exporter.notify.resolve import MAX_ADDRESSES
    many = [f"10.0.{i // 256}.{i % 256}" for i in range(300, 0, -1)]
    n = named("http://am:9093", Resolver({"am": many}))
    n.refresh_names()
    assert n.discovered() == MAX_ADDRESSES and n.stats()[0].url == "http://10.0.0.1:9093/api/v2/alerts"


def test_a_resolver_that_hangs_costs_its_refresh_never_the_stop():
    import threading
    release = threading.Event()
    returned = threading.Event()

    def hanging(host, port):
        release.wait(30)
        returned.set()
        return ["127.0.0.1"]

    n = named("http://am:9093", hanging, timeout=0.3).start()
    try:
        assert n.refresh_names() is False  # the resolver thread's lookup, or this one, waits at most 0.3 s
        assert not returned.is_set() and n.discovered() == 0  # given up while the lookup still hangs
        n.stop(2.0)
        assert not returned.is_set()  # nothing to flush, and a lookup in flight is not waited for
    finally:
        release.set()


def test_both_alertmanagers_behind_one_name_receive_every_alert():
    """Two Alertmanagers on one port of two loopback addresses, one name for both."""
    one, two = Receiver(), Receiver()
    with FakeServer({"/api/v2/alerts": one}) as first:
        port = first.server.server_address[1]
        with FakeServer({"/api/v2/alerts": two}, host="127.0.0.2", port=port):
            n = named(f"http://alertmanager-operated.test:{port}", Resolver({"alertmanager-operated.test": ["127.0.0.1", "127.0.0.2"]}),
                      refresh_interval=0.05).start()
            try:
                n.transitions([Transition(1000.0, alert(), FIRING)])  # before the first answer: kept for the resend
                assert wait_for(lambda: n.discovered() == 2)
                n.resend([alert()])
                assert wait_for(lambda: one.bodies and two.bodies), (one.bodies, two.bodies)
                n.transitions([Transition(1001.0, alert(RESOLVED, resolved_at=1001.0), RESOLVED)])
                assert wait_for(lambda: len(one.bodies) >= 2 and len(two.bodies) >= 2), (one.bodies, two.bodies)
            finally:
                n.stop(2.0)
    for receiver in (one, two):
        sent = [a for body in receiver.bodies for a in body]
        assert [a["labels"]["alertname"] for a in sent][-1] == "PrefixCacheHitRateLow"
        assert sent[0]["endsAt"] > sent[0]["startsAt"] and sent[-1]["endsAt"] == rfc3339(1001.0)
        assert {h["Host"] for h in receiver.headers} == {f"alertmanager-operated.test:{port}"}

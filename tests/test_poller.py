import logging
import os
import sys
import threading
import time

import pytest

from exporter.sim import simulator
from exporter.sim.server import Fleet
from exporter.config.sections import Config, GlobalConfig, Target, load
from exporter.alerting.deploys import DeployEvent
from exporter.monitor.engine import Engine
from exporter.poll.dispatch import ON_TIME_AGAIN
from exporter.poll.poller import Poller, TargetPoller
from exporter.serve.state import Counters, State
from exporter.monitor.targetview import TargetView

from conftest import FIXTURES, free_port, wait_for
from fakeserver import FakeServer, reply, slow, text

GARBAGE = (FIXTURES / "edge" / "garbage.txt").read_text()


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def config(*targets, **g):
    # timeouts far above what a loaded machine takes to answer: only the test about slow
    # and dead targets sets short ones (a 1 s read timed out under a parallel suite)
    defaults = dict(poll_interval=5.0, connect_timeout=5.0, read_timeout=10.0, windows=(("1m", 60.0),), min_query_tokens=1.0, jitter=0.0)
    defaults.update(g)
    return Config(targets=tuple(targets), global_=GlobalConfig(**defaults))


class Switch:
    """A route whose answer the test changes between polls."""

    def __init__(self):
        self.status, self.body = 200, ""

    def __call__(self, h):
        reply(h, self.status, self.body.encode())


@pytest.fixture
def switch():
    route = Switch()
    with FakeServer({"/metrics": route}) as server:
        route.url = server.base + "/metrics"
        yield route


def test_poll_cycle_publishes_windows_and_survives_bad_answers(switch):
    replica = simulator.Replica("r", simulator.Scenario(), start=-600.0, seed=1)  # warm cache
    clock, state = Clock(0.0), State()
    target = Target("r", switch.url)
    cfg = config(target)
    state.set_targets([TargetView(target=target)])
    poller = TargetPoller(target, cfg, state, Engine(cfg), threading.Lock(), clock)

    def poll_at(t, status=200, body=None):
        clock.t = t
        replica.advance(t)
        switch.status, switch.body = status, body if body is not None else replica.render()
        poller.poll()
        return state.target("r")

    for t in (0, 5, 10, 15):
        view = poll_at(t)
    assert view.up and view.last_result == "success"
    assert 0.5 < view.stats["demo/llama-3-8b"]["1m"].hit_ratio < 1.0
    view = poll_at(20, status=500, body="oops")
    assert not view.up and view.last_result == "http_error" and view.last_error == "HTTP 500"
    assert view.stats["demo/llama-3-8b"]["1m"].hit_ratio is not None  # history is kept
    view = poll_at(25, body="<html>not metrics</html>")
    assert not view.up and view.last_result == "no_vllm_metrics"
    view = poll_at(30, body=GARBAGE)
    assert view.last_result == "success" and len(view.snapshot.warnings) >= 3
    assert dict(view.scrapes) == {"success": 5, "http_error": 1, "no_vllm_metrics": 1}


def test_counter_reset_on_restart_is_an_increase_not_a_negative(switch):
    scenario = simulator.Scenario(events=(simulator.Event(32.0, "restart"),))
    replica = simulator.Replica("r", scenario, start=0.0, seed=2)
    clock, state = Clock(), State()
    target = Target("r", switch.url)
    state.set_targets([TargetView(target=target)])
    cfg = config(target)
    poller = TargetPoller(target, cfg, state, Engine(cfg), threading.Lock(), clock)
    for t in range(0, 60, 5):
        clock.t = float(t)
        replica.advance(t)
        switch.body = replica.render()
        poller.poll()
    ws = state.target("r").stats["demo/llama-3-8b"]["1m"]
    assert ws.query_increase > 0 and ws.hit_increase >= 0
    assert 0 <= ws.hit_ratio < 1


def test_poll_never_raises_on_internal_errors(switch, monkeypatch):
    state, target = State(), Target("r", switch.url)
    state.set_targets([TargetView(target=target)])
    cfg = config(target)
    poller = TargetPoller(target, cfg, state, Engine(cfg), threading.Lock(), Clock())
    monkeypatch.setattr("exporter.poll.poller.parse", lambda body: 1 / 0)
    switch.body = "vllm:prefix_cache_hits_total{model_name=\"m\"} 1\n"
    poller.poll()
    assert state.target("r").last_result == "internal_error"


def test_a_slow_and_a_dead_target_do_not_delay_a_fast_one():
    fast_replica = simulator.Replica("fast", simulator.Scenario(), start=time.time(), seed=1)
    routes = {"/fast": lambda h: (fast_replica.advance(time.time()), text(fast_replica.render())(h)), "/slow": slow(3.0)}
    with FakeServer(routes) as server:
        cfg = config(Target("fast", server.base + "/fast"), Target("slow", server.base + "/slow"),
                     Target("dead", f"http://127.0.0.1:{free_port()}/metrics"),
                     poll_interval=0.2, connect_timeout=0.2, read_timeout=0.6)
        state = State()
        poller = Poller(cfg, state)
        poller.start()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                fast = dict(state.target("fast").scrapes).get("success", 0)
                if fast >= 5 and state.ready():
                    break
                time.sleep(0.05)
        finally:
            poller.stop()
        assert fast >= 5, "the fast target was held up by the slow or dead one"
        assert state.target("slow").last_result == "timeout"
        assert state.target("dead").last_result == "connection_error"


def many_models(n: int, t: float) -> str:
    rows = []
    for i in range(n):
        rows.append(f'vllm:prefix_cache_queries_total{{model_name="m{i}",engine="0"}} {1000 * t}')
        rows.append(f'vllm:prefix_cache_hits_total{{model_name="m{i}",engine="0"}} {800 * t}')
    return "\n".join(rows) + "\n"


def test_a_target_over_its_series_limit_is_refused_without_reading_the_rest_of_its_body():
    """236,000 series in 16 MiB: before, the whole body was parsed first and refused after."""
    clock = Clock(0.0)
    with FakeServer({"/huge": lambda h: text(many_models(20_000, clock.t))(h)}) as server:
        huge = Target("huge", server.base + "/huge")
        cfg = config(huge, series_limit=100)
        state, engine = State(), Engine(cfg)
        state.set_targets([TargetView(target=huge)])
        TargetPoller(huge, cfg, state, engine, threading.Lock(), clock).poll()
    view = state.target("huge")
    assert not view.up and view.last_result == "limit_exceeded"
    assert view.last_error == "more than 100 series exceed global.series_limit=100"
    assert engine.tracks["huge"].view.stats == {}


def test_a_target_over_its_model_limit_fails_clearly_and_the_others_go_on():
    small = simulator.Replica("small", simulator.Scenario(), start=-600.0, seed=1)
    clock = Clock(0.0)
    routes = {"/big": lambda h: text(many_models(50, clock.t))(h),
              "/small": lambda h: (small.advance(clock.t), text(small.render())(h))}
    with FakeServer(routes) as server:
        big, other = Target("big", server.base + "/big"), Target("small", server.base + "/small")
        cfg = config(big, other, model_limit=10)
        state, engine = State(), Engine(cfg)
        state.set_targets([TargetView(target=big), TargetView(target=other)])
        pollers = [TargetPoller(t, cfg, state, engine, threading.Lock(), clock) for t in (big, other)]
        for t in (0.0, 5.0):
            clock.t = t
            for p in pollers:
                p.poll()
    view = state.target("big")
    assert not view.up and view.last_result == "limit_exceeded"
    assert view.last_error == "50 models exceed global.model_limit=10"
    assert dict(view.scrapes) == {"limit_exceeded": 2}
    assert engine.tracks["big"].view.stats == {}  # nothing of it entered the history
    assert state.target("small").up and dict(state.target("small").scrapes) == {"success": 2}


def test_one_targets_work_never_holds_up_another_target_or_the_rules():
    """The work that grows with a target's size runs under that target's own lock: with
    one target's lock held (a huge ingest in progress), another target polls and rules
    are evaluated."""
    a = simulator.Replica("a", simulator.Scenario(), start=-600.0, seed=1)
    b = simulator.Replica("b", simulator.Scenario(), start=-600.0, seed=2)
    clock = Clock(0.0)
    routes = {"/a": lambda h: (a.advance(clock.t), text(a.render())(h)), "/b": lambda h: (b.advance(clock.t), text(b.render())(h))}
    with FakeServer(routes) as server:
        cfg = config(Target("a", server.base + "/a"), Target("b", server.base + "/b"))
        poller = Poller(cfg, State(), clock=clock)
        busy = poller.target_locks["a"]
        busy.acquire()
        try:
            done = threading.Event()

            def work():
                poller.pollers["b"].poll()
                poller.evaluate()
                done.set()
            threading.Thread(target=work, daemon=True).start()
            assert done.wait(5.0), "target b or the evaluation waited for target a's lock"
        finally:
            busy.release()
    assert poller.state.target("b").up


def test_a_wall_clock_stepping_back_is_logged_and_counted(switch, caplog):
    replica = simulator.Replica("r", simulator.Scenario(), start=-600.0, seed=1)
    clock, state = Clock(100.0), State()
    target = Target("r", switch.url)
    cfg = config(target)
    state.set_targets([TargetView(target=target)])
    poller = TargetPoller(target, cfg, state, Engine(cfg), threading.Lock(), clock)
    for t in (100.0, 105.0, 90.0):
        clock.t = t
        replica.advance(max(t, 105.0))
        switch.body = replica.render()
        poller.poll()
    assert state.published.counters == Counters(clock_steps_back=1)
    assert "wall clock stepped back 15.000s" in caplog.text


def test_a_poll_in_flight_during_a_reload_publishes_the_new_labels(switch):
    replica = simulator.Replica("r", simulator.Scenario(), start=-600.0, seed=1)
    replica.advance(0.0)
    switch.body = replica.render()
    old = Target("r", switch.url, labels=(("team", "old"),))
    cfg = config(old)
    poller = Poller(cfg, State(), clock=Clock(0.0))
    in_flight = poller.pollers["r"]
    new = Target("r", switch.url, labels=(("team", "new"),))
    poller.reload(config(new))
    in_flight.poll()  # started before the reload, finishes after it
    assert poller.state.target("r").target.labels == (("team", "new"),)


def test_warm_up_runs_on_a_real_start_or_restart_only(switch):
    """A transient scrape failure is not a restart: vLLM's cache is still warm."""
    replica = simulator.Replica("r", simulator.Scenario(events=(simulator.Event(630.0, "restart"),)), start=-600.0, seed=1)
    clock, state, starts = Clock(0.0), State(), []
    target = Target("r", switch.url)
    cfg = config(target)
    state.set_targets([TargetView(target=target)])
    poller = TargetPoller(target, cfg, state, Engine(cfg), threading.Lock(), clock, on_start=lambda t, why: starts.append((clock.t, why)))
    for t, status in ((0, 200), (5, 200), (10, 503), (15, 503), (20, 200), (25, 200), (30, 200), (35, 200)):
        clock.t = float(t)
        replica.advance(float(t))
        switch.status, switch.body = status, replica.render()
        poller.poll()
    assert starts == [(0.0, "start"), (30.0, "restart")]


def test_discovered_targets_are_polled_and_a_removed_one_is_forgotten_once_its_alert_resolves(tmp_path):
    """file_sd brings two pods, one of them dead: its TargetDown fires; the file drops
    it: the alert resolves and the pod is forgotten; a new pod gets a history of its
    own. Every GET endpoint answers after each step."""
    import json

    from exporter.sidecar import build_sidecar
    from exporter.config.sections import load
    from test_app import call

    clock = Clock(time.time())
    replicas = [simulator.Replica(n, simulator.Scenario(), start=clock.t - 900, seed=i) for i, n in enumerate(("a", "c"))]
    for replica in replicas:  # its 900 s of traffic, simulated now rather than inside the first scrape's 1 s deadline
        replica.advance(clock.t)
    fleet = Fleet(replicas, clock=lambda: clock.t).start()
    sd = tmp_path / "sd.json"

    def listing(*pods):
        urls = {"a": f"127.0.0.1:{fleet.port}", "b": f"127.0.0.1:{free_port()}", "c": f"127.0.0.1:{fleet.port}"}
        sd.write_text(json.dumps([{"targets": [urls[p]], "labels": {"pod": p, "__metrics_path__": f"/{p}/metrics", "version": "v1"}}
                                  for p in pods]))
        st = sd.stat()
        os.utime(sd, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000 * len(pods)))

    seen = []
    cfg = load({"global": {"poll_interval": "5s", "connect_timeout": "500ms", "read_timeout": "1s", "jitter": "0s"},
                "rules": {"target_down": {"for": "0s", "startup_grace": "0s"}},
                "discovery": {"file_sd": {"files": [str(sd)]}}})
    sidecar = build_sidecar(cfg, "127.0.0.1:0", clock=clock, on_transitions=seen.extend)
    sidecar.app.exposition.min_interval = 0.0  # every change rendered: the test reads right after each

    def cycle():
        for p in list(sidecar.poller.pollers.values()):
            p.poll()
        sidecar.poller.evaluate()
        for method, path in sorted(sidecar.app.routes):
            if method == "GET":
                query = {"QUERY_STRING": "model=demo/llama-3-8b&version=v1"} if "analysis" in path else {}
                status, headers, body = call(sidecar.app, "GET", path, query)
                assert status in (200, 503) if path == "/-/ready" else status == 200, (path, body[:200])
        clock.t += 5

    try:
        listing("a", "b")
        sidecar.poller.discover()
        assert sorted(sidecar.poller.pollers) == ["a", "b"]
        cycle()
        assert [(t.alert.target, t.state) for t in seen if t.alert.alertname == "PrefixCacheTargetDown"] == [("b", "firing")]
        listing("a", "c")
        sidecar.poller.discover()
        cycle()
        assert [(t.alert.target, t.state) for t in seen if t.alert.alertname == "PrefixCacheTargetDown"] == [("b", "firing"), ("b", "resolved")]
        assert sorted(sidecar.poller.engine.tracks) == ["a", "c"] and not sidecar.poller.engine.alerts
        assert sorted(v.target.name for v in sidecar.state.targets()) == ["a", "c"]
        assert sidecar.state.target("c").up and sidecar.state.target("c").samples_kept == 1
        metrics = call(sidecar.app, "GET", "/metrics")[2].decode()
        assert 'prefixcache_discovery_targets{source="file_sd"} 2.0' in metrics and "prefixcache_polled_targets 2.0" in metrics
        assert 'target="b"' not in metrics
    finally:
        sidecar.poller.stop()
        sidecar.server.stop()  # built, never started: its workers run since it bound the port
        fleet.stop()


def test_a_reload_between_reading_the_track_and_using_it_is_not_an_internal_error(switch, caplog):
    """The poll checked its target was there, a reload removed it, the poll then indexed
    the engine's tracks: a KeyError, logged and published as internal_error. Now the poll
    reads its Track once under the target's lock, which the reload waits for."""
    replica = simulator.Replica("a", simulator.Scenario(), start=-600.0, seed=1)
    replica.advance(0.0)
    switch.body = replica.render()
    a, b = Target("a", switch.url), Target("b", switch.url)
    state = State()
    poller = Poller(config(a, b), state, clock=Clock(0.0))  # not started: the test runs each poll
    reloaded, reloads = threading.Event(), []

    class ReloadAtFirstLookUp(dict):
        """The engine's tracks, starting a reload that removes `a` as the poll first looks `a` up."""

        def _reload(self):
            if not reloads:
                reloads.append(threading.Thread(target=lambda: (poller.reload(config(b)), reloaded.set())))
                reloads[0].start()
                reloaded.wait(1.0)  # bounded: done at once where nothing holds the reload off

        def __contains__(self, name):
            found = super().__contains__(name)
            self._reload()
            return found

        def get(self, name, default=None):
            found = super().get(name, default)
            self._reload()
            return found

        def __getitem__(self, name):
            found = super().__getitem__(name)
            self._reload()
            return found

    poller.engine.tracks = ReloadAtFirstLookUp(poller.engine.tracks)
    with caplog.at_level(logging.WARNING):
        poller.pollers["a"].poll()
    reloads[0].join(10)
    assert reloaded.is_set()
    assert "poll failed" not in caplog.text and "internal" not in caplog.text
    assert sorted(poller.engine.tracks) == ["b"] and [v.target.name for v in state.targets()] == ["b"]


def test_a_poll_of_a_removed_target_publishes_nothing_even_once_it_is_back(switch):
    """A pod gone and back (a discovery flap) while its old poll was in flight: that poll
    has a lock and a Track that are no longer the target's and must leave the new ones alone."""
    replica = simulator.Replica("a", simulator.Scenario(), start=-600.0, seed=1)
    replica.advance(0.0)
    switch.body = replica.render()
    a = Target("a", switch.url)
    state = State()
    poller = Poller(config(a), state, clock=Clock(0.0))
    in_flight = poller.pollers["a"]
    poller.reload(config())
    poller.reload(config(a))
    in_flight.poll()
    assert not state.target("a").polled and poller.engine.tracks["a"].view.samples_kept == 0
    poller.pollers["a"].poll()
    assert state.target("a").up and state.target("a").samples_kept == 1


def test_a_reload_waits_for_the_poll_that_holds_its_targets_track():
    """Reconfiguring a kept target's history (its windows) while a poll appends to it
    would race: the reload takes every target's lock, in the documented order."""
    a = Target("a", "http://127.0.0.1:1/metrics")
    poller = Poller(config(a), State(), clock=Clock(0.0))
    done = threading.Event()
    with poller.target_locks["a"]:  # a poll of `a` between reading its Track and publishing its view
        reload = threading.Thread(target=lambda: (poller.reload(config(a, windows=(("5m", 300.0),))), done.set()))
        reload.start()
        assert not done.wait(0.3)
    reload.join(10)
    assert done.is_set() and poller.engine.tracks["a"].history.keep_seconds == 305.0


def test_observe_reads_event_times_that_add_event_never_changes_in_place():
    """A poll's change-point check reads the newest event times without the engine lock:
    add_event publishes new dicts instead of changing the ones a poll may be reading."""
    engine = Engine(config(Target("a", "http://127.0.0.1:1/metrics")))
    event_times, restart_times = engine.last_event_t, engine.last_restart_t
    engine.add_event(DeployEvent(10.0, "a", "v2", "api"))
    engine.add_event(DeployEvent(11.0, "a", "", "restart"))
    assert event_times == {} and restart_times == {}
    assert engine.last_event_t == {"a": 11.0} and engine.last_restart_t == {"a": 11.0}


def test_events_polls_evaluations_and_readers_run_side_by_side_without_errors(switch, caplog):
    """Deploy events arrive (the HTTP API) while targets poll, rules evaluate and scrapers
    render: nobody sees a dict change size under them, nothing is counted as an error."""
    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.serve.collector import PrefixCacheCollector
    from exporter.serve.app import status_json

    replica = simulator.Replica("a", simulator.Scenario(), start=-600.0, seed=1)
    replica.advance(0.0)
    switch.body = replica.render()
    clock, state = Clock(0.0), State()
    targets = [Target(n, switch.url) for n in ("a", "b")]
    poller = Poller(config(*targets, windows=(("1m", 60.0), ("5m", 300.0))), state, clock=clock)  # 5m: the rollout gate's
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["1m"]))
    errors, rounds = [], 60
    switch_interval = sys.getswitchinterval()

    def run(work):
        def loop():
            try:
                for i in range(rounds):
                    work(i)
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                errors.append(exc)
        return threading.Thread(target=loop)

    workers = [
        run(lambda i: [poller.add_event(DeployEvent(float(i), f"pod-{i}-{k}", f"v{i}", "api")) for k in range(5)]),
        run(lambda i: [p.poll() for p in list(poller.pollers.values())]),
        run(lambda i: poller.evaluate()),
        run(lambda i: (generate_latest(registry), status_json(state))),
    ]
    sys.setswitchinterval(1e-5)
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
    finally:
        sys.setswitchinterval(switch_interval)
    assert not any(w.is_alive() for w in workers)
    assert errors == [] and "failed" not in caplog.text
    assert state.published.counters.evaluation_errors == 0
    assert all(dict(v.scrapes).get("internal_error", 0) == 0 for v in state.targets())


def test_the_view_the_rules_read_is_the_very_view_served(switch):
    """One store: the poll publishes the view it computed; the state holds that object,
    not a copy into a second type, across polls, failures and reloads."""
    replica = simulator.Replica("a", simulator.Scenario(), start=-600.0, seed=1)
    clock, state = Clock(0.0), State()
    a = Target("a", switch.url)
    poller = Poller(config(a), state, clock=clock)
    for t, status in ((0.0, 200), (5.0, 200), (10.0, 503)):
        clock.t = t
        replica.advance(t)
        switch.status, switch.body = status, replica.render()
        poller.pollers["a"].poll()
        assert state.target("a") is poller.engine.tracks["a"].view
    poller.reload(config(Target("a", switch.url, (("team", "x"),))))
    view = state.target("a")
    assert view is poller.engine.tracks["a"].view and view.target.labels == (("team", "x"),)
    assert dict(view.scrapes) == {"success": 2, "http_error": 1} and view.samples_kept == 2 and not view.up


# --- the dispatcher: cadence, slow targets, skipped polls, reloads (issue 30) ----------------
def _hung_listener(backlog: int = 1024):
    """A port that completes every TCP handshake (the kernel's backlog) and never answers."""
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    return sock


@pytest.mark.slow
def test_a_healthy_target_keeps_its_cadence_beside_hundreds_of_hung_ones():
    """300 targets that accept and never answer, one that answers: the hung ones hold only
    the few workers for slow targets, the healthy one is polled every interval. (A job per
    target on one pool starved it: a poll every ~2 s here, every ~40 s with 600 at 5 s.)"""
    replica = simulator.Replica("ok", simulator.Scenario(), start=time.time() - 600, seed=1)
    replica.advance(time.time())  # its 600 s of traffic now, not inside the first scrape's deadline
    hung = _hung_listener()
    routes = {"/ok": lambda h: (replica.advance(time.time()), text(replica.render())(h))}
    try:
        with FakeServer(routes) as server:
            targets = [Target("ok", server.base + "/ok")] + [
                Target(f"hung-{i}", f"http://127.0.0.1:{hung.getsockname()[1]}/{i}/metrics") for i in range(300)]
            cfg = config(*targets, poll_interval=0.2, connect_timeout=0.5, read_timeout=0.5, scrape_timeout=0.5,
                         windows=(("1m", 60.0), ("5m", 300.0)))
            state = State()
            poller = Poller(cfg, state)
            poller.start()
            try:
                assert wait_for(lambda: state.target("ok").up, 5.0)
                before = dict(state.target("ok").scrapes).get("success", 0)
                time.sleep(2.0)
                polled = dict(state.target("ok").scrapes).get("success", 0) - before
            finally:
                poller.stop(0.5)
    finally:
        hung.close()
    assert polled >= 7, f"the healthy target was polled {polled} times in 2 s at a 0.2 s interval"
    assert sum(state.published.skipped_polls.values()) > 0  # the hung ones are skipped, and counted


class Ticks:
    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


def test_a_poll_still_running_when_due_is_skipped_counted_and_logged_once(caplog):
    from exporter.poll.dispatch import Dispatcher

    clock, published = Ticks(), []
    dispatcher = Dispatcher(on_skips=published.append, clock=clock)
    release, started = threading.Event(), threading.Event()

    def hanging():
        started.set()
        release.wait(5.0)
        return 0.1, False

    dispatcher.set("a", hanging, 1.0)
    dispatcher.resize()
    try:
        with caplog.at_level(logging.INFO, logger="exporter.poll.dispatch"):
            dispatcher.dispatch()
            assert started.wait(2.0)
            for t in range(1, 6):
                clock.t = float(t)
                dispatcher.dispatch()
            release.set()
            assert wait_for(lambda: not dispatcher.entries["a"].in_flight, 2.0)
            for t in range(6, 9):  # on time three times in a row: back
                clock.t = float(t)
                dispatcher.dispatch()
                assert wait_for(lambda: not dispatcher.entries["a"].in_flight, 2.0)
    finally:
        release.set()
        dispatcher.close()
    assert dispatcher.skips() == {"a": 5} and published[-1] == {"a": 5}
    assert caplog.text.count("polls are skipped") == 1 and caplog.text.count("polls on time again") == 1


def test_a_dispatcher_that_fell_behind_keeps_the_phase_and_never_bursts():
    from exporter.poll.dispatch import Dispatcher

    clock, runs = Ticks(), []
    dispatcher = Dispatcher(clock=clock)
    dispatcher.set("a", lambda: (runs.append(clock.t), (0.0, False))[1], 5.0)
    dispatcher.resize()
    try:
        dispatcher.dispatch()
        assert wait_for(lambda: len(runs) == 1 and not dispatcher.entries["a"].in_flight, 2.0)
        clock.t = 23.0  # the process stalled for four intervals
        assert dispatcher.dispatch() == 25.0
        assert wait_for(lambda: len(runs) == 2, 2.0)
    finally:
        dispatcher.close()
    assert runs == [0.0, 23.0]


def test_a_reload_sizes_the_pools_for_the_targets_it_has():
    small = config(*[Target(f"t{i}", f"http://127.0.0.1:1/{i}") for i in range(2)])
    poller = Poller(small, State(), clock=Clock(0.0))
    try:
        steady = poller.dispatcher.lanes["steady"]
        assert steady.wanted == 4
        poller.reload(config(*[Target(f"t{i}", f"http://127.0.0.1:1/{i}") for i in range(200)]))
        assert steady.wanted > 4 and steady.threads == steady.wanted
        poller.reload(small)
        assert steady.wanted == 4
    finally:
        poller.stop(0.5)


def test_what_fails_after_a_start_is_published_is_said_and_never_published_over_its_success(switch, caplog):
    """A start's warm-up hook that raised (or a reload setting the fleet-baseline reader to
    None between its check and its use) came back to poll()'s handler, which published
    internal_error under the very poll number that had just published success, and the
    fleet's baseline was never asked. Now the success stands, the log says what failed,
    and the question is asked all the same."""
    import json
    from exporter.config.sections import FleetBaselineConfig
    from exporter.monitor.targetview import SUCCESS

    answer = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [0, "0.8"]}]}})
    replica = simulator.Replica("r", simulator.Scenario(), start=-600.0, seed=1)
    with FakeServer({"/api/v1/query": text(answer)}) as prom:
        target = Target("r", switch.url)
        cfg = replace_cfg(config(target), fleet_baseline=FleetBaselineConfig(prometheus_url=prom.base, timeout=30.0))
        state = State()
        state.set_targets([TargetView(target=target)])

        def hook(name, why):
            raise RuntimeError(f"the warm-up's bug at the {why} of {name}")

        poller = TargetPoller(target, cfg, state, Engine(cfg), threading.Lock(), Clock(0.0), on_start=hook)
        try:
            replica.advance(0.0)
            switch.body = replica.render()
            with caplog.at_level(logging.ERROR):
                poller.poll()
            view = state.target("r")
            assert view.up and view.last_result == SUCCESS and dict(view.scrapes) == {SUCCESS: 1}, (view.last_result, view.scrapes)
            assert "the warm-up's bug at the start of r" in caplog.text and "acting on the start of the target failed" in caplog.text
            assert wait_for(lambda: any(path.startswith("/api/v1/query") for _, path, *_ in prom.requests))
        finally:
            poller.close()


def test_a_reload_keeps_what_did_not_change(switch):
    """A kept target keeps its poller, connection, phase and pending fleet-baseline
    question; one whose labels changed keeps them too and takes the new labels; one whose
    URL changed gets a new connection. Every SIGHUP used to replace every poller."""
    from exporter.config.sections import FleetBaselineConfig

    baseline = FleetBaselineConfig(prometheus_url="http://127.0.0.1:1", timeout=1.0)
    a, b, c = Target("a", switch.url), Target("b", switch.url), Target("c", switch.url + "?c")
    cfg = replace_cfg(config(a, b, c), fleet_baseline=baseline)
    poller = Poller(cfg, State(), clock=Clock(0.0))
    try:
        before = dict(poller.pollers)
        scrapers = {n: p.scraper for n, p in before.items()}
        readers = {n: p.baseline_reader for n, p in before.items()}
        due = {n: e.due for n, e in poller.dispatcher.entries.items()}
        b2, c2 = Target("b", switch.url, labels=(("team", "x"),)), Target("c", switch.url + "?other")
        poller.reload(replace_cfg(config(a, b2, c2, Target("d", switch.url)), fleet_baseline=baseline))
        assert all(poller.pollers[n] is before[n] for n in "abc")
        assert poller.pollers["a"].scraper is scrapers["a"] and poller.pollers["b"].scraper is scrapers["b"]
        assert poller.pollers["c"].scraper is not scrapers["c"] and poller.pollers["c"].scraper.url.endswith("?other")
        assert all(poller.pollers[n].baseline_reader is readers[n] and not readers[n]._closed for n in "abc")
        assert all(poller.dispatcher.entries[n].due == due[n] for n in "abc")
        assert poller.pollers["b"].target.labels == (("team", "x"),)
        assert sorted(poller.pollers) == ["a", "b", "c", "d"]
    finally:
        poller.stop(0.5)


def replace_cfg(cfg, **changes):
    from dataclasses import replace
    return replace(cfg, **changes)


def test_a_poll_never_publishes_over_a_newer_one():
    """The first poll hangs, the second succeeds, then the first ends in an error: the
    target stays up with the second's result (the old failure used to set up back to 0)."""
    replica = simulator.Replica("a", simulator.Scenario(), start=-600.0, seed=1)
    replica.advance(0.0)
    gate, calls = threading.Event(), []

    def route(h):
        calls.append(1)
        if len(calls) == 1:
            gate.wait(5.0)
            return reply(h, 500, b"late")
        return text(replica.render())(h)

    with FakeServer({"/m": route}) as server:
        a = Target("a", server.base + "/m")
        state = State()
        poller = Poller(config(a), state, clock=Clock(0.0))
        first = threading.Thread(target=poller.pollers["a"].poll)
        first.start()
        assert wait_for(lambda: len(calls) == 1, 2.0)
        poller.pollers["a"].poll()
        assert state.target("a").up
        gate.set()
        first.join(5.0)
        poller.stop(0.5)
    view = state.target("a")
    assert view.up and view.last_result == "success" and dict(view.scrapes) == {"success": 1}


def test_a_poll_pauses_for_scrapes_after_its_answer_came_and_before_its_parse(switch):
    """The sidecar's pollers wait for a burst of /metrics scrapers to pass
    (Poller.pause_for_scrapes, set to Exposition.wait_for_pause) between the answer and the
    parse: a failed scrape has nothing to parse and does not wait."""
    replica = simulator.Replica("r", simulator.Scenario(), start=-600.0, seed=1)
    clock, state = Clock(0.0), State()
    target = Target("r", switch.url)
    cfg = config(target)
    poller = Poller(cfg, state, clock=clock)
    order = []
    real_scrape = poller.pollers["r"].scraper.scrape
    poller.pollers["r"].scraper.scrape = lambda: (order.append("scrape"), real_scrape())[1]
    poller.pause_for_scrapes = lambda: order.append("pause")  # set after the pollers were made, as the sidecar does
    replica.advance(0.0)
    switch.body = replica.render()
    poller.pollers["r"].poll()
    assert order == ["scrape", "pause"] and state.target("r").last_result == "success"
    switch.status = 500
    poller.pollers["r"].poll()
    assert order == ["scrape", "pause", "scrape"] and state.target("r").last_result == "http_error"
    # the wait is not the target's slowness: the poll's time, which sends a slow target to the
    # dispatcher's slow lane, leaves it out
    switch.status = 200
    poller.pause_for_scrapes = lambda: time.sleep(0.3)
    began = time.monotonic()
    took, slow = poller.pollers["r"].poll()
    assert time.monotonic() - began >= 0.3 and took <= time.monotonic() - began - 0.29 and not slow


def test_a_views_evolve_is_dataclasses_replace():
    """The view a poll makes is the old one with the poll's fields changed, as replace()
    makes it: equal, the old one untouched, a field it has not refused."""
    from dataclasses import fields, replace
    old = TargetView(Target(name="vllm-0", url="http://127.0.0.1:1/metrics"), up=True, scrapes=(("success", 3),))
    changes = {"up": False, "down_since": 12.5, "last_error": "timeout", "scrapes": (("success", 3), ("timeout", 1))}
    new = old.evolve(**changes)
    assert new == replace(old, **changes) and type(new) is TargetView
    assert old.up and old.down_since is None  # never changed in place
    assert {f.name: getattr(new, f.name) for f in fields(new)} == {f.name: getattr(replace(old, **changes), f.name) for f in fields(new)}
    with pytest.raises(TypeError, match="no field 'upp'"):
        old.evolve(upp=True)
    with pytest.raises(AttributeError):
        new.up = True  # still frozen


def test_reads_that_outlast_the_interval_are_missed_counted_and_said_once_not_at_every_miss(caplog):
    """A Prometheus that takes longer than poll_interval to answer: the read job's runs due
    meanwhile are not started (APScheduler's max_instances 1). The state counts them,
    the log says once that reading fell behind and once that it keeps up again, and the
    scheduler's own warning at each miss stays out of the log."""
    slow = threading.Event()
    empty = b'{"status":"success","data":{"resultType":"matrix","result":[]}}'

    def query(h):
        if slow.is_set():
            slow.clear()
            time.sleep(2.3)  # a read after the first: two runs missed at a 1 s interval
        reply(h, 200, empty, [("Content-Type", "application/json")])

    with FakeServer({"/api/v1/query": query}) as prom:
        cfg = load({"global": {"poll_interval": "1s", "connect_timeout": "500ms", "read_timeout": "1s"},
                    "discovery": {"read_prometheus": {"url": prom.base, "timeout": "5s", "match_labels": {"job": "vllm"}}}})
        state = State()
        poller = Poller(cfg, state)
        poller.reader.read_back = 300.0  # a short first read: the reads after it are this test's
        with caplog.at_level(logging.INFO):
            poller.start()
            try:
                assert wait_for(lambda: state.read().published.tasks["read"].runs >= 1, 10.0)
                slow.set()
                assert wait_for(lambda: state.read().published.tasks["read"].missed >= 2, 10.0)
                assert state.read().published.tasks["read"].behind
                assert wait_for(lambda: not state.read().published.tasks["read"].behind, 15.0)
            finally:
                poller.stop(1.0)
    read = state.read().published.tasks["read"]
    assert read.interval == 1.0 and read.runs >= 1 + ON_TIME_AGAIN and read.missed >= 2 and read.last_seconds < 1.0
    assert set(state.read().published.tasks) == {"read", "evaluate"}  # no discovery source: no discover task
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "maximum number of running instances" in m]
    assert len([m for m in said if m.startswith("Reading the Prometheus source falls behind its 1s interval")]) == 1
    assert len([m for m in said if m.startswith("Reading the Prometheus source keeps its 1s interval again")]) == 1


def test_a_scraping_sidecar_says_in_the_log_and_the_status_that_it_knows_nothing_from_before_its_start(caplog):
    """A restart of a sidecar that scrapes (no Prometheus to read back from) loses the
    baseline of an incident under way: the status page and the start's log line say so."""
    from exporter.poll.promread import SCRAPED_SINCE_START
    state = State()
    poller = Poller(load({"targets": [{"name": "vllm-0", "url": "http://127.0.0.1:9/metrics"}]}), state)
    with caplog.at_level(logging.INFO):
        poller.start()
        poller.stop(1.0)
    assert state.read().published.samples_source == SCRAPED_SINCE_START
    assert SCRAPED_SINCE_START in caplog.text and "nothing before it is known" in SCRAPED_SINCE_START

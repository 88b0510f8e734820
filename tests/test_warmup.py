import threading
import time

import pytest
import requests

from exporter.sim import simulator
from exporter.sim.server import Fleet
from exporter.sidecar import build_sidecar
from exporter.config.sections import load
from exporter.config.sections import WarmupConfig
from exporter.poll.warmup import Warmer, request_body

from conftest import free_port, wait_for
from fakeserver import FakeServer, reply

CHAT = {"model": "m", "messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "hi"}], "max_tokens": 500}




def test_request_body_asks_for_one_token():
    body = request_body({**CHAT, "max_completion_tokens": 99, "stream": True})
    assert body["max_tokens"] == 1 and "max_completion_tokens" not in body and body["stream"] is False
    assert body["messages"] == CHAT["messages"]


class Slow:
    """A fake vLLM that records what it received and how many requests overlapped."""

    def __init__(self, delay):
        self.delay, self.in_flight, self.peak, self.bodies = delay, 0, 0, []
        self.lock = threading.Lock()

    def __call__(self, h):
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.bodies.append(h.body)
        time.sleep(self.delay)
        with self.lock:
            self.in_flight -= 1
        try:
            reply(h, 200, b"{}")
        except OSError:
            pass


def test_concurrency_limit_readiness_gate_and_outcome():
    fake = Slow(0.2)
    with FakeServer({"/v1/chat/completions": fake}) as server:
        w = Warmer(WarmupConfig(enabled=True, url=server.base + "/v1/chat/completions", requests=(CHAT,) * 6, concurrency=2, timeout=5.0))
        assert w.ready() == (False, "waiting for vLLM to start before warming up")
        assert w.trigger("start")
        assert not w.trigger("again")  # one at a time: a second start while it runs makes it begin again
        assert w.ready()[0] is False
        assert wait_for(lambda: w.ready()[0])
        status = w.snapshot()
        assert status.results == {"success": 12} and status.runs == 1 and status.last_failed == 0
        assert fake.peak == 2 and len(fake.bodies) == 12
        w.stop()


def test_a_warm_up_whose_requests_all_failed_keeps_the_gate_closed_and_sends_them_again():
    """It warmed nothing: before, the gate opened anyway and the pod went Ready cold."""
    answers = iter([500, 500, 200])
    seen = []

    def flaky(h):
        seen.append(time.monotonic())
        reply(h, next(answers, 200), b"{}")

    with FakeServer({"/v1/chat/completions": flaky}) as server:
        w = Warmer(WarmupConfig(enabled=True, url=server.base + "/v1/chat/completions", requests=(CHAT,), timeout=2.0), retry=(0.3, 30.0))
        assert w.trigger("start")
        assert wait_for(lambda: w.snapshot().results.get("http_error") == 1, timeout=5)
        assert w.ready() == (False, "warm-up running; 1 request(s) failed, sending them again")
        assert wait_for(lambda: w.ready()[0], timeout=10)
        status = w.snapshot()
        assert status.results == {"http_error": 2, "success": 1} and status.runs == 1 and status.last_failed == 0
        assert seen[1] - seen[0] >= 0.3 and seen[2] - seen[1] >= 0.6  # the wait doubles: 0.3 s, then 0.6 s
        w.stop()


def test_timeouts_are_counted_and_retried_until_stopped():
    fake = Slow(2.0)
    with FakeServer({"/v1/chat/completions": fake}) as server:
        w = Warmer(WarmupConfig(enabled=True, url=server.base + "/v1/chat/completions", requests=(CHAT,) * 2, concurrency=2, timeout=0.3))
        w.trigger("start")
        assert wait_for(lambda: w.snapshot().results.get("timeout") == 2, timeout=5)
        assert w.ready()[0] is False
        started = time.monotonic()
        w.stop()
        assert time.monotonic() - started < 1.0 and not w.snapshot().running


def test_a_vllm_restart_during_a_warm_up_begins_it_again():
    """What the first requests cached died with the process: the gate waits for a whole warm-up after the restart."""
    fake = Slow(0.25)
    with FakeServer({"/v1/chat/completions": fake}) as server:
        w = Warmer(WarmupConfig(enabled=True, url=server.base + "/v1/chat/completions", requests=(CHAT,) * 2, concurrency=1, timeout=5.0))
        assert w.trigger("start")
        assert wait_for(lambda: len(fake.bodies) == 1, timeout=5)
        assert not w.trigger("restart")  # the one running begins again
        assert wait_for(lambda: w.ready()[0], timeout=10)
        assert len(fake.bodies) == 4  # two before the restart noticed, then both again
        assert w.snapshot().runs == 1
        w.stop()


def test_disabled_warmup_never_gates():
    assert Warmer(WarmupConfig()).ready() == (True, "")
    assert not Warmer(WarmupConfig()).trigger("start")


@pytest.mark.parametrize("section, fragment", [
    pytest.param({"enabled": True}, "at least one request", id="enabled-without-requests"),
    pytest.param({"requests": [{"model": "m"}]}, "messages", id="no-messages"),
    pytest.param({"requests": [{"messages": [{"role": "user", "content": "x"}]}]}, "model", id="no-model"),
    pytest.param({"target": "nope"}, "not a configured target", id="unknown-target"),
])
def test_bad_warmup_config(section, fragment):
    from exporter.config.sections import ConfigError
    with pytest.raises(ConfigError) as exc:
        load({"targets": [{"name": "vllm", "url": "http://127.0.0.1:1/metrics"}], "warmup": section})
    assert any(fragment in e for e in exc.value.errors), exc.value.errors


@pytest.mark.slow
def test_sidecar_warms_its_vllm_at_start_and_after_a_restart_and_the_cache_is_warm():
    now = time.time()
    warm = 600.0
    replica = simulator.Replica("vllm", simulator.Scenario(request_rate=2.0, events=(simulator.Event(warm + 4.0, "restart"),)),
                                start=now - warm, seed=5)
    replica.advance(now)
    fleet = Fleet([replica], clock=time.time).start()
    prompts = [{"model": "demo/llama-3-8b", "messages": [{"role": "system", "content": replica.system_prompt_text(k)},
                                                         {"role": "user", "content": "warm-up"}]} for k in range(10)]
    cfg = load({
        "global": {"poll_interval": "500ms", "connect_timeout": "500ms", "read_timeout": "1s", "jitter": "0s"},
        "targets": [{"name": "vllm", "url": fleet.metrics_url("vllm")}],
        "warmup": {"enabled": True, "url": fleet.url("vllm") + "/v1/chat/completions", "requests": prompts, "concurrency": 3},
    })
    sidecar = build_sidecar(cfg, f"127.0.0.1:{free_port()}").start()
    base = f"http://127.0.0.1:{sidecar.server.port}"
    try:
        assert wait_for(lambda: len(fleet.received) == 10), "no warm-up at start"
        assert wait_for(lambda: requests.get(base + "/-/ready", timeout=2).status_code == 200)
        assert wait_for(lambda: len(fleet.received) == 20, timeout=30), "no warm-up after the restart"
        assert all(body["max_tokens"] == 1 for _, _, body in fleet.received)
        # the warm-up refilled the emptied cache: a warmed tenant's prompt now hits
        answer = replica.serve_chat(prompts[3], time.time())
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= 1184
        assert wait_for(lambda: "prefixcache_warmup_runs_total 2.0" in requests.get(base + "/metrics", timeout=2).text)
        metrics = requests.get(base + "/metrics", timeout=2).text
        assert 'prefixcache_warmup_requests_total{result="success"} 20.0' in metrics
    finally:
        sidecar.stop()
        fleet.stop()


@pytest.mark.slow
def test_a_paused_vllm_keeps_a_ready_sidecar_ready_and_runs_no_warm_up():
    """vLLM frozen for 4 s (SIGSTOP: a GC pause, a stuck GPU call) makes scrapes time out,
    but its cache is still there: /-/ready stays 200 and no warm-up re-runs. Only a real
    restart re-opens the gate."""
    import json
    import signal
    import subprocess
    import sys
    sim = subprocess.Popen([sys.executable, "-m", "exporter", "simulate", "--replicas=1", "--rate=2"],
                           stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(sim.stdout.readline())
        metrics_url = info["targets"][0]
        base_url = metrics_url.rsplit("/metrics", 1)[0]
        prompts = [{"model": "demo/llama-3-8b", "messages": [{"role": "user", "content": f"warm-up {k}"}]} for k in range(3)]
        cfg = load({
            "global": {"poll_interval": "500ms", "connect_timeout": "500ms", "read_timeout": "1s", "scrape_timeout": "1s", "jitter": "0s"},
            "targets": [{"name": "vllm", "url": metrics_url}],
            "warmup": {"enabled": True, "url": base_url + "/v1/chat/completions", "requests": prompts, "timeout": "2s"},
        })
        sidecar = build_sidecar(cfg, f"127.0.0.1:{free_port()}").start()
        base = f"http://127.0.0.1:{sidecar.server.port}"
        try:
            assert wait_for(lambda: requests.get(base + "/-/ready", timeout=2).status_code == 200, timeout=30)
            runs = sidecar.warmer.snapshot().runs
            sim.send_signal(signal.SIGSTOP)
            answers, deadline = [], time.monotonic() + 4.0  # 8 polls, each scrape timing out after 1 s
            try:
                while time.monotonic() < deadline:
                    answers.append(requests.get(base + "/-/ready", timeout=2).status_code)
                    time.sleep(0.5)
                assert sidecar.state.target("vllm").last_result == "timeout"  # the pause was seen
            finally:
                sim.send_signal(signal.SIGCONT)
            assert wait_for(lambda: sidecar.state.target("vllm").up, timeout=20)
            time.sleep(2.0)
            assert set(answers) == {200} and len(answers) >= 6
            assert requests.get(base + "/-/ready", timeout=2).status_code == 200
            assert sidecar.warmer.snapshot().runs == runs
        finally:
            sidecar.stop()
    finally:
        sim.send_signal(signal.SIGCONT)
        sim.terminate()
        sim.wait(timeout=30)

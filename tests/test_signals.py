"""The `run` process: SIGHUP reloads (a bad file keeps the old config and says so),
SIGTERM stops gracefully and lets in-flight Alertmanager deliveries finish."""
import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import requests
import yaml

from exporter.sim import simulator
from exporter.sim.server import Fleet

from conftest import free_port, wait_for
from fakeserver import FakeServer, reply




def run_python(code: str) -> subprocess.CompletedProcess:
    """`code` in a Python process of its own (its limits and signal handlers are its own)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)


def start(config_path, port):
    return subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={config_path}",
                             f"--web.listen-address=127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_sighup_reloads_and_a_bad_reload_keeps_the_old_config(tmp_path):
    replicas = [simulator.Replica(n, simulator.Scenario(), start=time.time() - 60, seed=i) for i, n in enumerate(("a", "b"))]
    fleet = Fleet(replicas, clock=time.time).start()
    cfg = tmp_path / "config.yml"
    one = {"global": {"poll_interval": "500ms", "read_timeout": "1s", "connect_timeout": "500ms"},
           "targets": [{"name": "a", "url": fleet.metrics_url("a")}]}
    cfg.write_text(yaml.safe_dump(one))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start(cfg, port)
    try:
        names = lambda: {t["name"] for t in requests.get(base + "/api/v1/status", timeout=2).json()["targets"]}
        assert wait_for(lambda: names() == {"a"})
        cfg.write_text(yaml.safe_dump({**one, "targets": one["targets"] + [{"name": "b", "url": fleet.metrics_url("b")}]}))
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: names() == {"a", "b"})
        assert wait_for(lambda: 'prefixcache_target_up{target="b"} 1.0' in requests.get(base + "/metrics", timeout=2).text)
        cfg.write_text("targets: [\n")  # broken YAML
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "prefixcache_config_last_reload_successful 0.0" in requests.get(base + "/metrics", timeout=2).text)
        assert names() == {"a", "b"}
        samples_before = requests.get(base + "/api/v1/status", timeout=2).json()["targets"][0]["last_scrape_time"]
        assert wait_for(lambda: requests.get(base + "/api/v1/status", timeout=2).json()["targets"][0]["last_scrape_time"] > samples_before)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        fleet.stop()
    assert proc.returncode == 0
    assert "reload failed, keeping the old config" in err


@pytest.mark.slow
def test_sigterm_lets_an_in_flight_delivery_finish(tmp_path):
    received = []

    def slow_alertmanager(h):
        time.sleep(1.0)
        received.append(json.loads(h.body))
        reply(h, 200, b"{}")

    with FakeServer({"/api/v2/alerts": slow_alertmanager}) as am:
        cfg = tmp_path / "config.yml"
        cfg.write_text(yaml.safe_dump({
            "global": {"poll_interval": "500ms", "read_timeout": "1s", "connect_timeout": "500ms"},
            "targets": [{"name": "dead", "url": f"http://127.0.0.1:{free_port()}/metrics"}],
            "alertmanager": {"urls": [am.base]},
            "rules": {"target_down": {"for": "0s", "startup_grace": "0s"}},
        }))
        port = free_port()
        proc = start(cfg, port)
        try:
            # the target-down alert fires at the first evaluation after the first poll
            assert wait_for(lambda: len(am.requests) >= 1, timeout=20)
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
            took = time.monotonic() - began
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0 and took < 10
        assert received and received[0][0]["labels"]["alertname"] == "PrefixCacheTargetDown"


@pytest.mark.slow
def test_sigterm_exits_in_seconds_while_a_target_drips_bytes(tmp_path):
    """A target that answers a byte at a time is cut at the scrape deadline, is down,
    and never keeps the process from stopping (Kubernetes allows 30 s)."""
    from fakeserver import drip
    with FakeServer({"/metrics": drip(0.2, 10000)}) as slowpoke:
        cfg = tmp_path / "config.yml"
        cfg.write_text(yaml.safe_dump({
            "global": {"poll_interval": "1s", "connect_timeout": "500ms", "read_timeout": "1s", "scrape_timeout": "2s"},
            "targets": [{"name": "drip", "url": slowpoke.base + "/metrics"}],
        }))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start(cfg, port)
        try:
            status = lambda: requests.get(base + "/api/v1/status", timeout=2).json()["targets"][0]
            assert wait_for(lambda: status()["last_result"] == "timeout", timeout=20)
            assert status()["up"] is False
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
            took = time.monotonic() - began
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0 and took < 5, (took, err)


def test_sighup_rereads_the_deploy_token(tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")
    cfg = tmp_path / "config.yml"
    cfg.write_text(yaml.safe_dump({"targets": [{"name": "a", "url": f"http://127.0.0.1:{free_port()}/metrics"}],
                                   "deploys": {"api_token_file": str(token)}}))
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/v1/deploys"
    proc = start(cfg, port)
    try:
        post = lambda tok: requests.post(url, json={"version": "v1"}, headers={"Authorization": f"Bearer {tok}"}, timeout=10).status_code
        assert wait_for(lambda: post("first") == 202)
        token.write_text("second\n")
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: post("second") == 202)
        assert post("first") == 401
        token.write_text("")  # an empty token file must not switch auth off
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "prefixcache_config_last_reload_successful 0.0" in requests.get(url.replace("/api/v1/deploys", "/metrics"), timeout=10).text)
        assert post("second") == 202 and post("") == 401
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "is empty" in err


@pytest.mark.slow
def test_sighup_rereads_the_web_config(tmp_path):
    """The running process, signalled: a basic-auth user removed from --web.config.file
    loses access at the SIGHUP (it kept it until a restart); a broken web config keeps
    the old one, with one log line and prefixcache_config_last_reload_successful 0."""
    import bcrypt
    cfg = tmp_path / "config.yml"
    cfg.write_text(yaml.safe_dump({"global": {"poll_interval": "1s", "connect_timeout": "200ms", "read_timeout": "200ms"},
                                   "targets": [{"name": "a", "url": f"http://127.0.0.1:{free_port()}/metrics"}]}))
    users = {u: bcrypt.hashpw(f"pw-{u}".encode(), bcrypt.gensalt(rounds=4)).decode() for u in ("alice", "bob")}
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": users}))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={cfg}", f"--web.config.file={web}",
                             f"--web.listen-address=127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True)
    metrics = lambda user: requests.get(f"http://127.0.0.1:{port}/metrics", auth=(user, f"pw-{user}"), timeout=2)  # noqa: E731
    try:
        assert wait_for(lambda: metrics("bob").status_code == 200)
        web.write_text(yaml.safe_dump({"basic_auth_users": {"alice": users["alice"]}}))
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: metrics("bob").status_code == 401)
        assert metrics("alice").status_code == 200
        web.write_text("basic_auth_users: {alice: plaintext}\n")
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "prefixcache_config_last_reload_successful 0.0" in metrics("alice").text)
        assert metrics("bob").status_code == 401
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert len([line for line in err.splitlines() if "keeping the old web config" in line]) == 1, err


@pytest.mark.slow
def test_concurrent_reloads_apply_one_after_the_other(tmp_path):
    """Each SIGHUP reloads on its own thread: ten at once must not race (duplicate job
    ids, KeyErrors, wrong job counts) and every target keeps polling."""
    import threading
    from exporter.sidecar import build_sidecar
    from exporter.config.load import load_file
    replicas = [simulator.Replica(n, simulator.Scenario(), start=time.time() - 900, seed=i) for i, n in enumerate("abc")]
    fleet = Fleet(replicas, clock=time.time).start()
    cfg = tmp_path / "config.yml"
    cfg.write_text(yaml.safe_dump({"global": {"poll_interval": "500ms", "connect_timeout": "500ms", "read_timeout": "1s"},
                                   "targets": [{"name": n, "url": fleet.metrics_url(n)} for n in "abc"]}))
    sidecar = build_sidecar(load_file(str(cfg)), "127.0.0.1:0").start()
    try:
        assert wait_for(lambda: all(v.up for v in sidecar.state.targets()))
        results = []
        threads = [threading.Thread(target=lambda: results.append(sidecar.reload(str(cfg)))) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == [True] * 10
        jobs = sorted(j.id for j in sidecar.poller.scheduler.get_jobs())
        assert jobs == ["dispatch", "evaluate"] and sorted(sidecar.poller.dispatcher.entries) == ["a", "b", "c"]
        before = {v.target.name: v.last_scrape_time for v in sidecar.state.targets()}
        assert wait_for(lambda: all(v.last_scrape_time > before[v.target.name] and v.up for v in sidecar.state.targets()))
    finally:
        sidecar.stop()
        fleet.stop()


@pytest.mark.slow
def test_sigterm_exits_within_8s_whatever_every_peer_is_doing(tmp_path):
    """All at once: a discovery Prometheus that sends its headers and then a byte a second,
    a FIFO matching the file_sd glob (no writer ever opens it), an Alertmanager, a
    fleet-baseline Prometheus and a target that all drip, and one healthy target. Every
    peer's own deadline is 20 s or more, so only the shutdown's bound can end them:
    SIGTERM exits in 8 s, with 0."""
    import os
    import threading

    from fakeserver import MisbehavingServer
    replica = simulator.Replica("vllm-0", simulator.Scenario(), start=time.time() - 60, seed=1)
    fleet = Fleet([replica], clock=time.time).start()
    sd = tmp_path / "sd"
    sd.mkdir()
    os.mkfifo(sd / "targets.json")
    with MisbehavingServer() as peers:
        cfg = tmp_path / "config.yml"
        cfg.write_text(yaml.safe_dump({
            "global": {"poll_interval": "5s", "read_timeout": "4s", "connect_timeout": "500ms", "scrape_timeout": "20s"},
            "targets": [{"name": "vllm-0", "url": fleet.metrics_url("vllm-0")},
                        {"name": "dead", "url": f"http://127.0.0.1:{free_port()}/metrics"},
                        {"name": "dripping", "url": peers.url("drip") + "/metrics"}],
            "discovery": {"prometheus": {"url": peers.url("drip"), "job": "vllm", "timeout": "30s"},
                          "file_sd": {"files": [str(sd / "*.json")]}},
            "alertmanager": {"urls": [peers.url("drip")], "timeout": "30s"},
            "fleet_baseline": {"prometheus_url": peers.url("drip"), "timeout": "30s"},
            "rules": {"target_down": {"for": "0s", "startup_grace": "0s"}},  # so that the Alertmanager is asked
        }))
        proc = start(cfg, free_port())
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
        reader.start()
        try:
            assert wait_for(lambda: any("listening on" in line for line in lines), timeout=20), "".join(lines)
            asked = lambda: {path.split("/", 2)[2] for _, path, *_ in peers.requests if path.startswith("/drip/")}
            wanted = {"api/v1/targets?state=active", "api/v2/alerts", "metrics"}
            assert wait_for(lambda: any(p.startswith("api/v1/query") for p in asked())
                            and {p.split("&")[0] for p in asked()} >= wanted, timeout=20), (asked(), "".join(lines))
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            finally:
                took = time.monotonic() - began
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            fleet.stop()
        reader.join(5)
    assert proc.returncode == 0 and took < 8.0, (took, "".join(lines))


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("Threads:"))


@pytest.mark.slow
def test_a_storm_of_sighups_is_one_pending_reload_and_the_last_config_wins(tmp_path):
    """3,000 SIGHUPs as fast as they can be sent: one reload thread, not one per signal (300
    threads, and a process limit), the config written last is the one in force, the
    reload metric says the last reload succeeded, and SIGTERM still stops it (a handler
    that took a lock, interrupted by the next signal, left the process deaf to it)."""
    replicas = [simulator.Replica(n, simulator.Scenario(), start=time.time() - 60, seed=i) for i, n in enumerate(("a", "b"))]
    fleet = Fleet(replicas, clock=time.time).start()
    cfg = tmp_path / "config.yml"
    settings = {"global": {"poll_interval": "1s", "read_timeout": "1s", "connect_timeout": "500ms"}}
    cfg.write_text(yaml.safe_dump({**settings, "targets": [{"name": "a", "url": fleet.metrics_url("a")}]}))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start(cfg, port)
    try:
        names = lambda: {t["name"] for t in requests.get(base + "/api/v1/status", timeout=2).json()["targets"]}
        assert wait_for(lambda: names() == {"a"})
        threads_before = _threads(proc.pid)
        most = threads_before
        for i in range(3000):
            if i == 2999:  # the last signal comes after the last write
                cfg.write_text(yaml.safe_dump({**settings, "targets": [{"name": "b", "url": fleet.metrics_url("b")}]}))
            proc.send_signal(signal.SIGHUP)
            if i % 200 == 0:
                most = max(most, _threads(proc.pid))
        if not wait_for(lambda: names() == {"b"}):  # seen once in five loaded full runs: say what was in force
            seen = names()
            proc.terminate()
            pytest.fail(f"targets {seen} 20 s after the last SIGHUP; the sidecar's log:\n{proc.communicate(timeout=30)[1][-4000:]}")
        most = max(most, _threads(proc.pid))
        metrics = requests.get(base + "/metrics", timeout=5).text
        assert "prefixcache_config_last_reload_successful 1.0" in metrics
        assert proc.poll() is None
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=8)  # what a rollout allows a pod
        fleet.stop()
    # a few threads may start as the pools and the resolver grow lazily for target b; one a
    # signal was 300 (and a process limit)
    assert most <= threads_before + 10, (threads_before, most)
    assert proc.returncode == 0, err[-2000:]


def _caught(pid: int) -> set[int]:
    """The signals `pid` has a handler for (SigCgt of /proc/PID/status, bit n-1 for signal n)."""
    with open(f"/proc/{pid}/status") as fh:
        mask = int(next(line.split()[1] for line in fh if line.startswith("SigCgt:")), 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


@pytest.mark.slow
def test_sighup_sigusr1_and_sigusr2_right_after_start_neither_kill_nor_go_unsaid(tmp_path):
    """The signals come as soon as the process has a handler for them, before the imports,
    the config and the bind are done (about 0.35 s): SIGHUP's default action used to end it
    with 129 and no log line, SIGUSR1 and SIGUSR2 ended it at any time. Now the SIGHUP makes
    a reload once the sidecar runs (the config written before it is in force), SIGUSR1 and
    SIGUSR2 are ignored with a line each, and SIGTERM still stops it cleanly."""
    cfg = tmp_path / "config.yml"
    settings = {"global": {"poll_interval": "500ms", "read_timeout": "500ms", "connect_timeout": "200ms"}}
    cfg.write_text(yaml.safe_dump({**settings, "targets": [{"name": "a", "url": f"http://127.0.0.1:{free_port()}/metrics"}]}))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start(cfg, port)
    try:
        wanted = {signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}
        deadline = time.monotonic() + 10
        while not wanted <= _caught(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert wanted <= _caught(proc.pid), "the process never took SIGHUP, SIGUSR1 and SIGUSR2 over"
        cfg.write_text(yaml.safe_dump({**settings, "targets": [{"name": "b", "url": f"http://127.0.0.1:{free_port()}/metrics"}]}))
        for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            proc.send_signal(signum)
        names = lambda: {t["name"] for t in requests.get(base + "/api/v1/status", timeout=2).json()["targets"]}
        assert wait_for(lambda: names() == {"b"}), proc.poll()
        proc.send_signal(signal.SIGUSR1)  # and once it runs
        assert wait_for(lambda: requests.get(base + "/-/healthy", timeout=2).status_code == 200)
        assert proc.poll() is None
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert "ignoring SIGUSR1" in err and "ignoring SIGUSR2" in err and "Traceback" not in err, err[-2000:]


def test_a_command_other_than_run_ends_on_a_sighup_that_came_while_it_started():
    """Only the sidecar reloads: the other commands get the signals' defaults back, and a
    SIGHUP held while they started ends them then, as it would have."""
    code = ("import os, signal, time\n"
            "from exporter.stopping import hold_startup_signals, release_startup_signals\n"
            "hold_startup_signals()\n"
            "os.kill(os.getpid(), signal.SIGHUP)\n"
            "time.sleep(0.1)\n"
            "print('held', flush=True)\n"
            "release_startup_signals()\n"
            "time.sleep(5)\n"
            "print('never', flush=True)\n")
    out = run_python(code)
    assert out.returncode == -signal.SIGHUP and out.stdout.split() == ["held"], out


def test_the_sidecar_raises_its_open_files_limit_to_the_hard_one_as_go_programs_do():
    """In a process of its own: the limit is the process's."""
    code = ("import resource\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 256))\n"
            "from exporter.sidecar import raise_file_limit\n"
            "raise_file_limit()\n"
            "print(*resource.getrlimit(resource.RLIMIT_NOFILE))\n")
    out = run_python(code)
    assert out.returncode == 0 and out.stdout.split() == ["256", "256"], out


def test_a_signal_storm_never_deafens_the_process_to_sigterm():
    """The handlers only write to a pipe: 3,000 SIGHUPs, each run of the action coalescing
    those that came before it, then SIGTERM ends the process (with handlers that set a
    threading.Event, 20 processes of 20 never stopped)."""
    code = ("import signal, sys, time\n"
            "from exporter.stopping import on_signals, stop_event\n"
            "runs = []\n"
            "stop = stop_event()\n"
            "on_signals((signal.SIGHUP,), lambda: (runs.append(1), time.sleep(0.01)), 'reload')\n"
            "print('ready', flush=True)\n"
            "stop.wait()\n"
            "print(len(runs), flush=True)\n")
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            for _ in range(3000):
                proc.send_signal(signal.SIGHUP)
            time.sleep(0.2)
            proc.terminate()
            out, _ = proc.communicate(timeout=8)
        finally:
            proc.kill()
        assert proc.returncode == 0 and 1 <= int(out) < 3000, out


def test_a_signal_the_kernel_hands_another_thread_still_reloads_and_stops():
    """A signal sent to the process may be taken by any thread; the main thread, waiting
    on the stop event, runs no Python handler until it wakes (the SIGHUP used to reload at
    the next SIGTERM). Here each signal goes to a thread that is not the main one."""
    code = textwrap.dedent("""
        import signal, threading, time
        from exporter.stopping import on_signals, stop_event
        stop = stop_event()
        on_signals((signal.SIGHUP,), lambda: print('reloaded', flush=True), 'reload')
        sleeper = threading.Thread(target=threading.Event().wait, daemon=True)
        sleeper.start()

        def send():
            for signum in (signal.SIGHUP, signal.SIGTERM):
                time.sleep(0.3)
                signal.pthread_kill(sleeper.ident, signum)

        threading.Thread(target=send, daemon=True).start()
        print('stopped' if stop.wait(20) else 'never stopped', flush=True)
        """)
    out = run_python(code)
    assert out.returncode == 0 and out.stdout.split() == ["reloaded", "stopped"], out


class StallingPrometheus:
    """A discovery Prometheus that answers its first ask at once and every later one only
    when the test releases it (`asked` is set as each stalled ask arrives)."""

    def __init__(self):
        import threading
        self.asked, self.release, self.count = threading.Event(), threading.Event(), 0

    def __call__(self, h):
        self.count += 1
        if self.count > 1:
            self.asked.set()
            self.release.wait(120)
        reply(h, 200, RECORDED_EMPTY, [("Content-Type", "application/json")])

    def rearm(self):
        import threading
        self.release.set()
        self.asked, self.release = threading.Event(), threading.Event()


RECORDED_EMPTY = b'{"status":"success","data":{"activeTargets":[],"droppedTargets":[]}}'


def test_a_reload_asks_discovery_under_no_lock_within_its_budget_and_a_stop_never_waits_for_the_peer(tmp_path):
    """SIGHUP held reload_lock across discovery's ask: a Prometheus that accepts and never
    answers held every read waiting on that lock for the source's deadline (120 s here).
    Now the ask happens with the lock free, the reload returns at its budget while the
    peer still stalls, the discovery thread takes the same ask over (the peer is asked
    once) and settles it when it comes; a stop during a reload's ask ends it at once."""
    import threading
    from exporter.config.load import load_file
    from exporter.sidecar import build_sidecar
    from test_poller import Clock

    prom = StallingPrometheus()
    with FakeServer({"/api/v1/targets": prom}) as server:
        cfg = tmp_path / "config.yml"
        cfg.write_text(yaml.safe_dump({"discovery": {"refresh_interval": "1h",
                                                     "prometheus": {"url": server.base, "job": "vllm", "timeout": "120s"}}}))
        clock = Clock(time.time())
        sidecar = build_sidecar(load_file(str(cfg)), "127.0.0.1:0", clock=clock)
        sidecar.poller.reload_discovery_budget = 0.3
        sidecar.poller.start()
        try:
            source = lambda: sidecar.state.published.discovery[0]
            assert wait_for(lambda: source().last_success == clock.t)
            clock.t += 60
            results = []
            reload = threading.Thread(target=lambda: results.append(sidecar.reload(str(cfg))), daemon=True)
            reload.start()
            assert prom.asked.wait(30)
            # the peer has the ask and stalls: the lock every read takes is free meanwhile
            assert sidecar.poller.reload_lock.acquire(timeout=30)
            sidecar.poller.reload_lock.release()
            reload.join(30)
            assert not reload.is_alive() and results == [True] and not prom.release.is_set()
            assert source().failures == 0
            prom.rearm()  # the answer comes: the discovery thread, which took the ask over, settles it
            assert wait_for(lambda: source().last_success == clock.t) and prom.count == 2

            sidecar.poller.reload_discovery_budget = 600.0  # only the stop can end this one
            reload = threading.Thread(target=lambda: results.append(sidecar.reload(str(cfg))), daemon=True)
            reload.start()
            assert prom.asked.wait(30)
            sidecar.stop()
            reload.join(30)
            assert not reload.is_alive() and not prom.release.is_set()
        finally:
            prom.release.set()
            sidecar.stop()

"""The `demo` command: a deploy that breaks prefix caching and its rollback, played on two simulated vLLM
replicas against a real sidecar, with the alerts, a diagnose and a what-if of the incident's traffic."""
from __future__ import annotations

import json
import secrets
import sys
import time
from collections import deque
from typing import Sequence

from ..config import sections as config_mod
from ..config.sections import Config, ConfigError
from ..exitcodes import EXIT_ERROR, EXIT_OK
from ..peers.http import Endpoint, PeerError, exchange
from ..sidecar import Sidecar, build_sidecar
from ..stopping import stop_event
from ..tools import divergence, whatif
from ..tools.diagnose import diagnose_requests
from ..tools.vllm_client import VLLMError
from . import console, simulator
from .server import Fleet


DEMO_RULES = {
    # the demo tells in a minute what takes minutes in production: shorter rule windows
    "hit_rate_drop_after_deploy": {"for": "5s", "keep_firing_for": "3s", "baseline": "30s", "after": "15s", "min_query_tokens": 5000},
    "hit_rate_low": {"window": "1m", "for": "20s", "keep_firing_for": "3s"},
    "ttft_regression": {"window": "10s", "reference": "4m", "for": "5s", "keep_firing_for": "3s"},
}


def demo_config(fleet: Fleet, names: Sequence[str], listen: str, alertmanager_urls: Sequence[str] = ()) -> Config:
    return config_mod.load({
        "global": {"poll_interval": "1s", "connect_timeout": "500ms", "read_timeout": "1s", "jitter": "0s",
                   "windows": ["10s", "1m", "5m"]},
        "web": {"listen_address": listen},
        # each replica's KV events too, as vLLM publishes them: the alert then names the changed tokens
        "targets": [{"name": n, "url": fleet.metrics_url(n), **({"kv_events": {"endpoint": fleet.kv_endpoint(n), "topic": "kv"}}
                                                                if n in fleet.kv_ports else {})} for n in names],
        "alertmanager": {"urls": list(alertmanager_urls), "resend_interval": "10s"},
        "rules": DEMO_RULES,
        # the demo announces its deploys itself, with a token of its own: the API is closed without one
        "deploys": {"api_token": secrets.token_hex(16)},
    })


def _post_deploy(sidecar: Sidecar, version: str, description: str) -> None:
    body = json.dumps({"version": version, "description": description}).encode()
    answer = exchange(Endpoint(f"http://127.0.0.1:{sidecar.server.port}/api/v1/deploys"), "POST", timeout=5.0, size_limit=64 * 1024,
                      body=body, headers={"Content-Type": "application/json", "Authorization": f"Bearer {sidecar.config.deploys.api_token}"})
    if not 200 <= answer.status < 300:
        raise PeerError(f"the deploy API answered HTTP {answer.status}")


def command(args) -> int:
    """`demo`: the incident and its rollback on two simulated replicas, told on the console."""
    duration = args.duration
    now = time.time()
    deploy_at, rollback_at = duration * 0.25, duration * 0.5  # the second half shows the recovery
    names = ("vllm-0", "vllm-1")
    warm = 660.0  # simulated healthy traffic before the demo starts: past vLLM's cold-start grace
    story = simulator.Scenario(events=(simulator.Event(warm + deploy_at, "prompt", "timestamp"),
                                       simulator.Event(warm + rollback_at, "prompt", "static")))
    replicas = [simulator.Replica(n, story, start=now - warm, seed=i) for i, n in enumerate(names)]
    for r in replicas:
        r.advance(now - 120.0)
        r.sample, r.sample_bodies = [], True  # the traffic from here on, for the what-if analysis at the end
        r.advance(now)
    fleet = Fleet(replicas, clock=time.time, kv_events=True).start()
    transitions: deque = deque()
    try:
        cfg = demo_config(fleet, names, args.listen_address, args.alertmanager_urls)
        sidecar = build_sidecar(cfg, cfg.web.listen_address, on_transitions=transitions.extend).start()
    except (OSError, ConfigError) as exc:
        fleet.stop()
        print(f"error: cannot start the demo sidecar on {args.listen_address}: {exc} (try --web.listen-address=127.0.0.1:0)", file=sys.stderr)
        return EXIT_ERROR
    out = sys.stdout
    screen = console.Screen(out, tty=out.isatty())
    screen.say(f"demo: 2 simulated vLLM replicas at http://127.0.0.1:{fleet.port}/<name>/metrics; "
               f"exporter at http://127.0.0.1:{sidecar.server.port}/metrics", header=True)
    screen.say(f"demo: at t={deploy_at:.0f}s deploy v42 puts 'Current date and time: ...' atop the system prompt; "
               f"at t={rollback_at:.0f}s v43 rolls it back", header=True)
    stop = stop_event()
    windows = [w for w, _ in cfg.global_.windows]
    phases: dict[str, list[float]] = {"before": [], "after": [], "rollback": []}
    announced: set[str] = set()
    try:
        while not stop.is_set():
            elapsed = time.time() - now
            if elapsed >= duration:
                break
            for version, at, what in (("v42", deploy_at, "timestamp atop the system prompt"), ("v43", rollback_at, "rollback of v42")):
                if elapsed >= at and version not in announced:
                    _post_deploy(sidecar, version, what)
                    screen.say(f"demo: t={elapsed:.1f}s deploy {version} ({what}) announced to POST /api/v1/deploys")
                    announced.add(version)
            if "v43" in announced and "explained" not in announced:
                announced.add("explained")
                screen.say(f"demo: the {windows[0]} window starts to recover within seconds of the rollback, as the replicas' caches fill again; the {windows[1]} window still "
                           f"holds the incident's traffic for {windows[1]}, so PrefixCacheHitRateLow (on the {windows[1]} window) "
                           "can fire or stay firing until it slides past")
            while transitions:
                tr = transitions.popleft()
                a = tr.alert
                what = {"inactive": "PENDING ENDED WITHOUT FIRING"}.get(tr.state, tr.state.upper())
                screen.say(f"demo: t={tr.t - now:.1f}s ALERT {what} {a.alertname} on {a.target}: {dict(a.annotations).get('summary')} "
                           f"[cause={dict(a.labels).get('cause')} severity={dict(a.labels).get('severity')}]")
                if tr.state == "firing" and "diagnosed" not in announced:
                    announced.add("diagnosed")
                    for line in _demo_diagnose(replicas[0], fleet):
                        screen.say(line)
            views = sidecar.state.targets()
            screen.show(console.table(views, elapsed, windows), elapsed)
            ratios = [s[windows[0]].hit_ratio for v in views for s in v.stats.values() if s[windows[0]].hit_ratio is not None]
            if ratios:
                phase = "before" if elapsed < deploy_at else "after" if elapsed < rollback_at else "rollback"
                phases[phase].append(sum(ratios) / len(ratios))
            stop.wait(min(1.0, max(0.0, duration - elapsed)))
    finally:
        sidecar.stop()
        fleet.stop()
    if phases["before"] and phases["after"]:
        summary = (f"demo: hit rate {windows[0]}: before the deploy {phases['before'][-1] * 100:.1f}%, "
                   f"lowest after it {min(phases['after']) * 100:.1f}%")
        if phases["rollback"]:
            summary += f", at the end (after the rollback) {phases['rollback'][-1] * 100:.1f}%"
        print(summary, file=out)
    for line in _demo_whatif(replicas, now + deploy_at, now + rollback_at):
        print(line, file=out)
    return EXIT_OK


def _demo_whatif(replicas: Sequence[simulator.Replica], start: float, end: float) -> list[str]:
    """Where the incident's points went: its traffic through the what-if analysis."""
    lines = [json.dumps(line) for r in replicas for line in (r.sample or []) if line["t"] < end]
    lines.sort(key=lambda l: json.loads(l)["t"])
    requests_ = [x for x in whatif.read_requests(lines) if isinstance(x, whatif.Request)]
    if not requests_:
        return []
    tok = replicas[0]
    tokenizer = whatif.Tokenizer(tok.tokenizer.encode, tok.render_chat, True, "the simulator's own tokenizer and chat template")
    analysis = whatif.analyze(requests_, len(replicas), ("round_robin", "session", "prefix_hash"), None, 16, tokenizer,
                                  measure_from=start)
    return ["demo: the incident's traffic through `whatif`, the traffic before it warming the caches "
            "(vllm-prefix-cache-exporter whatif SAMPLE --replicas 2 --measure-from T):"] + \
        [f"demo:   {line}" for line in whatif.report(analysis).splitlines()]


def _demo_diagnose(replica: simulator.Replica, fleet: Fleet) -> list[str]:
    """What the operator does next: compare two real requests a second apart."""
    t = time.time()
    a, b = replica.request_at(0, t - 1.0), replica.request_at(0, t)
    try:
        finding = diagnose_requests(a, b, fleet.url(replica.name), None, offline=False)
    except VLLMError as exc:
        return [f"demo: diagnose failed: {exc}"]
    return ["demo: diagnose of two requests of one tenant, a second apart "
            f"(vllm-prefix-cache-exporter diagnose A.json B.json --target {fleet.url(replica.name)}):"] + \
        [f"demo:   {line}" for line in divergence.report(finding).splitlines()]

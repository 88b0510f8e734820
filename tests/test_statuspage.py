"""The status page at `/`: hostile values stay text, the last hour is drawn with its
deploys, a big fleet is summarised, renders are coalesced, the web config holds, and a
real headless chromium shows a played incident's alert, cause and drop, then its end."""
import functools
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporter.alerting import analysis
from exporter.serve import statuspage
from exporter.sim import simulator
from exporter.sim.server import Fleet
from exporter.config.sections import Target, load
from exporter.serve.app import App
from exporter.alerting.rules_state import FIRING, PENDING, Alert
from exporter.serve.state import State
from exporter.monitor.targetview import TargetView
from exporter.serve.statuspage import PageInput, StatusPage, gather, render
from exporter.parse.vllm_metrics import parse
from exporter.series.history import History
from exporter.series.window import summarize

from conftest import free_port

ROOT = Path(__file__).parent.parent
WINDOWS = (("1m", 60.0), ("5m", 300.0), ("15m", 900.0), ("1h", 3600.0))
HOSTILE = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "'><svg onload=alert(2)>", "</title><script>x()</script>"]
MODEL = "demo/llama-3-8b"


class Page(HTMLParser):
    """Every element and attribute of a page, and its text, as a browser's parser sees them."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    @property
    def all_text(self) -> str:
        return "".join(self.text)


@functools.lru_cache(maxsize=None)  # immutable views: played once per argument set
def played_view(target="vllm-0", seconds=1800.0, incident_at=1200.0, step=15.0, labels=(("namespace", "llm"),),
                models=(MODEL,)):
    """A TargetView as the poller publishes it (with its samples) after a replica's
    prompt gained a timestamp at `incident_at`: the hit ratio falls from ~85%."""
    replica = simulator.Replica(target, simulator.incident(900.0 + incident_at), start=-900.0, seed=3, model_names=models)
    history = History(3600.0 + step, 300.0, windows=[s for _, s in WINDOWS], mid_seconds=900.0, mid_step=30.0)
    snap, now = simulator.play_into(replica, history, seconds, step)
    samples = history.samples()
    view = TargetView(target=Target(target, f"http://127.0.0.1:1/{target}/metrics", labels), up=True, polled=True,
                      last_result="success", last_scrape_time=now, last_success_time=now, snapshot=snap,
                      stats=summarize(samples, now, WINDOWS, 1000.0, snap.block_size), samples=samples, samples_kept=len(history))
    return view, now


def alert(target, model, state=FIRING, cause="prompt_prefix_change", summary="Hit rate fell", labels=(), version="",
          active_at=0.0, name="PrefixCacheHitRateDropAfterDeploy"):
    return Alert(name, target, model, state=state, active_at=active_at, version=version,
                 labels=tuple(sorted({"severity": "critical", "cause": cause, **dict(labels)}.items())),
                 annotations=(("description", "Probable cause: " + cause), ("runbook_url", "javascript:alert(3)"), ("summary", summary)))


# --- escaping ---------------------------------------------------------------------------
@pytest.mark.slow
def test_hostile_names_labels_and_texts_render_as_text():
    evil = "".join(HOSTILE)
    view, now = played_view(models=(evil,), target=evil, labels=tuple((f"k{i}", h) for i, h in enumerate(HOSTILE)) + ((evil, "v"),))
    view = replace(view, last_error=evil, last_result="http_" + evil)
    down = TargetView(target=Target("down" + evil, "http://127.0.0.1:1/x"), polled=True, last_result="connection_error", last_error=evil)
    page = PageInput(
        targets=(view, down),
        alerts=(alert(evil, evil, cause=evil, summary=evil, labels={"severity": evil}),
                alert("", evil, state=PENDING, cause=evil, summary=evil, version=evil)),
        deploys=({"t": now - 600, "target": evil, "version": evil, "source": "api", "description": evil},
                 {"t": now - 300, "target": None, "version": evil, "source": evil, "description": evil}),
        verdicts={evil: analysis.Verdict(analysis.FAIL, evil, evil, evil, 0.1, 0.9, 1e5, 1e5, evil, 1, 1)},
        links=("/", "/metrics"), version="0.1.0", warning=evil)
    text = render(page, now).decode()
    parsed = Page(text)
    tags = {tag for tag, _ in parsed.tags}
    assert not tags & {"script", "img", "iframe", "object", "embed"}, tags
    assert [t for t, _ in parsed.tags].count("svg") == 1  # our one trend line (the down target has none), no injected one
    assert not [(t, a) for t, a in parsed.tags for a in a if a.lower().startswith("on")]
    assert not [a for _, attrs in parsed.tags for k, a in attrs.items() if k == "href" and not a.startswith(("/", "http"))]
    for h in HOSTILE:  # the text survived as text: in the model's heading, the labels, the alert, the deploys...
        assert parsed.all_text.count(h) >= 8, h
    titles = re.findall(r"<title>(.*?)</title>", text, re.S)
    assert titles[0] == "vLLM prefix-cache exporter" and len(titles) == 3  # the page's and the two deploy marks'


def test_a_lone_surrogate_in_a_label_is_replaced_not_a_500():
    view, now = played_view(labels=(("pod", "bad\ud800"),))
    assert b"bad?" in render(PageInput((view,)), now)


# --- content ----------------------------------------------------------------------------
def test_the_last_hour_is_drawn_with_the_deploy_marked_and_the_drop_told():
    view, now = played_view()
    deploy_t = now - 600  # incident_at is 600 s before the end
    page = PageInput((view,), deploys=({"t": deploy_t, "target": None, "version": "v42", "source": "api", "description": ""},
                                       {"t": now - 7200, "target": None, "version": "v41", "source": "api", "description": ""}))
    parsed = Page(render(page, now).decode())
    polylines = [a["points"] for t, a in parsed.tags if t == "polyline"]
    assert polylines
    points = [tuple(map(float, p.split(","))) for line in polylines for p in line.split()]
    early = [y for x, y in points if x < 280 * 0.8]
    late = [y for x, y in points if x > 280 * 0.85]
    assert min(late) - max(early) > 64 * 0.25  # SVG y grows downwards: later points sit lower, a fall of 25+ points
    caption = re.search(r"last hour: ([\d.]+)% → ([\d.]+)% \(fell\)", parsed.all_text)
    assert caption and float(caption[1]) - float(caption[2]) >= 30
    marks = [a for t, a in parsed.tags if t == "line" and float(a["x1"]) == float(a["x2"]) and a.get("y2") == "64"]
    assert len(marks) == 1 and abs(float(marks[0]["x1"]) - 280 * (1 - 600 / 3600)) < 1  # v41 is older than the hour
    assert "deploy v42 (api)" in parsed.all_text and "1 deploy(s) marked" in parsed.all_text
    for label in ("hit ratio", "TTFT p50", "TTFT p99", "query tokens/s", "KV-cache usage (max)", "1m", "5m", "15m", "1h"):
        assert label in parsed.all_text


def test_admitted_and_lookup_ratios_both_show_where_they_differ():
    view, now = played_view()
    ws = view.stats[MODEL]["5m"]
    skewed = {MODEL: {**view.stats[MODEL], "5m": ws._replace(hit_ratio=0.9, admitted_hit_ratio=0.5)}}
    text = Page(render(PageInput((replace(view, stats=skewed),)), now).decode()).all_text
    assert "hit ratio (admitted)" in text and "hit ratio (lookup)" in text and "90%" in text and "50%" in text
    assert "hit ratio (lookup)" not in Page(render(PageInput((view,)), now).decode()).all_text


def test_alerts_show_severity_cause_and_summary_and_the_deploys_their_source_and_version():
    view, now = played_view()
    page = PageInput((view,), alerts=(alert("vllm-0", MODEL, summary="Prefix-cache hit rate of demo fell from 85% to 9%"),
                                      alert("vllm-0", MODEL, state=PENDING, cause="kv_pressure", name="PrefixCacheHitRateLow")),
                     deploys=({"t": now - 600, "target": "vllm-0", "version": "v42", "source": "annotations", "description": "bump"},))
    parsed = Page(render(page, now).decode())
    text = parsed.all_text
    assert "1 firing, 1 pending" in text and "fell from 85% to 9%" in text
    assert "prompt_prefix_change" in text and "kv_pressure" in text and "critical" in text
    assert "annotations" in text and "v42" in text and "10 min ago" in text
    assert not [a for t, a in parsed.tags if t == "a" and "javascript" in a.get("href", "")]  # a runbook URL is a link only if http(s)


def test_the_fleet_view_shows_versions_side_by_side_and_the_gates_verdict():
    """The verdict the engine reached at its last evaluation, while a v2 replica whose
    prompt carries a timestamp serves beside a v1 one: both versions and the failing gate."""
    from exporter.monitor.engine import Engine

    cfg = load({"targets": [{"name": n, "url": f"http://127.0.0.1:1/{n}", "labels": {"version": v}} for n, v in (("old", "v1"), ("new", "v2"))],
                "analysis": {"warmup": "0s"}})
    engine = Engine(cfg)
    replicas = {"old": simulator.Replica("old", simulator.Scenario(), start=-900.0, seed=1),
                "new": simulator.Replica("new", simulator.incident(0.0), start=0.0, seed=2)}
    for t in range(5, 305, 5):
        for name, r in replicas.items():
            r.advance(float(t))
            engine.ingest(name, float(t), parse(r.render()))
        engine.evaluate(float(t))
    assert set(engine.verdicts) == {(MODEL, ())}  # replicas without scope labels: one scope, the empty one
    v = engine.verdicts[(MODEL, ())]
    assert v.verdict == analysis.FAIL and (v.version, v.baseline_version) == ("v2", "v1")
    text = Page(render(PageInput((), verdicts=engine.verdicts), 0.0).decode()).all_text
    assert f"gate: {v.verdict}" in text and "v2 (new)" in text and "v1 (baseline)" in text
    assert "versions side by side" in text
    assert "versions side by side" not in Page(render(PageInput(()), 0.0).decode()).all_text  # one version: no fleet view


def test_a_thousand_targets_are_summarised_with_the_worst_fifty_and_every_firing_one():
    view, now = played_view()
    ws = view.stats[MODEL]["5m"]
    targets = []
    for i in range(1000):
        ratio = 0.2 + 0.7 * i / 1000  # vllm-0000 is the worst
        stats = {MODEL: {**view.stats[MODEL], "5m": ws._replace(hit_ratio=ratio, admitted_hit_ratio=ratio)}}
        targets.append(replace(view, target=Target(f"vllm-{i:04d}", "http://127.0.0.1:1/x"), stats=stats))
    for i in range(900, 1000, 10):
        targets[i] = replace(targets[i], up=False, last_result="timeout", last_error="scrape timed out")
    alerts = (alert("vllm-0700", MODEL), alert("vllm-0003", MODEL))
    text = render(PageInput(tuple(targets), alerts=alerts), now).decode()
    parsed = Page(text)
    headings = [h for h in re.findall(r'<article class="card [a-z]+"><h3>(vllm-\d+)', text)]
    assert headings[:50] == [f"vllm-{i:04d}" for i in range(50)]  # the worst fifty, worst first
    assert headings[50:] == ["vllm-0700"]  # and the firing one beyond them
    assert "1000 targets" in parsed.all_text and "Down targets (10)" in parsed.all_text
    assert re.search(r"990\s*up", parsed.all_text) and re.search(r"2\s*alerts firing", parsed.all_text)
    assert len(text) < 400_000


# --- coalescing, the app, the web config -------------------------------------------------------
class Clock:
    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


def test_the_page_is_rendered_once_per_state_change_and_interval(monkeypatch):
    view, now = played_view()
    state = State()
    state.set_targets([view])
    renders = []
    real = statuspage.render
    monkeypatch.setattr(statuspage, "render", lambda page, t: renders.append(t) or real(page, t))
    clock = Clock()
    page = StatusPage(state, min_interval=1.0, clock=clock, wall=lambda: now)
    first = page.get(["/"], "v")
    assert page.get(["/"], "v") is first and len(renders) == 1  # no change: the same bytes
    state.publish(replace(view, last_scrape_time=now + 1))
    assert page.get(["/"], "v") is first  # changed, but within the interval
    clock.t = 1.0
    assert page.get(["/"], "v") is not first and len(renders) == 2
    assert page.get(["/", "/metrics"], "v") and len(renders) == 3  # a new route shows at once


def test_the_app_serves_it_as_html_with_the_endpoints_and_the_open_deploy_api_warning():
    from test_app import call

    view, _ = played_view()
    state = State()
    state.set_targets([view])
    app = App(state, CollectorRegistry(), deploy_api_open=lambda: True)
    status, headers, body = call(app, "GET", "/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Content-Security-Policy"].startswith("default-src 'none'; style-src 'unsafe-inline'")  # if escaping ever slipped
    parsed = Page(body.decode())
    hrefs = {a["href"] for t, a in parsed.tags if t == "a"}
    assert {"/metrics", "/-/healthy", "/-/ready", "/api/v1/status"} <= hrefs
    assert ("meta", {"name": "viewport", "content": "width=device-width,initial-scale=1"}) in parsed.tags
    assert not [t for t, a in parsed.tags if t in ("script", "link", "img") or "src" in a]  # nothing fetched from elsewhere
    assert "POST /api/v1/deploys is open" in parsed.all_text


def test_the_web_configs_tls_and_basic_auth_guard_the_page(tmp_path):
    import bcrypt
    import requests

    from exporter.serve.server import Server
    from exporter.serve.webconfig import load_web_config

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True, timeout=60)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {tmp_path / 'cert.pem'}\n  key_file: {tmp_path / 'key.pem'}\n"
                   f"basic_auth_users:\n  oncall: '{bcrypt.hashpw(b'right', bcrypt.gensalt(rounds=4)).decode()}'\n")
    security = load_web_config(str(web))
    view, _ = played_view()
    state = State()
    state.set_targets([view])
    server = Server(App(state, CollectorRegistry(), security=security), "127.0.0.1", 0, security).start()
    try:
        base, ca = f"https://127.0.0.1:{server.port}/", str(tmp_path / "cert.pem")
        assert requests.get(base, verify=ca, timeout=10).status_code == 401
        assert requests.get(base, auth=("oncall", "wrong"), verify=ca, timeout=10).status_code == 401
        ok = requests.get(base, auth=("oncall", "right"), verify=ca, timeout=10)
        assert ok.status_code == 200 and "vllm-0" in ok.text and "<svg" in ok.text
    finally:
        server.stop()


# --- a real browser during a played incident -----------------------------------------------------
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (scripts/test installs Debian's package; it could not be installed here)")
    return path


def browse(binary: str, url: str, profile: Path, *extra: str) -> str:
    """Chromium headless, as a user's browser renders the page: DOM out (or a screenshot)."""
    out = subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
                          f"--user-data-dir={profile}", *extra, url], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def alert_items(dom: str) -> list[str]:
    return re.findall(r'<li class="alert (\w+) \w+">(.*?)</li>', dom, re.S)


@pytest.mark.slow
def test_chromium_shows_the_firing_alert_its_cause_and_the_drop_then_the_recovery(tmp_path):
    """Two replicas polled by the real sidecar on a simulated clock: a deploy announced
    for vllm-0 puts a timestamp atop its prompt (the hit ratio falls), then a rollback.
    Chromium reads `/` over HTTP while the drop alert fires, and again once it resolved."""
    import requests

    from exporter.sidecar import build_sidecar

    binary = chromium()
    start = time.time() - 3600
    clock = Clock(start)
    incident, rollback = 1500.0, 2400.0
    scenario = replace(simulator.Scenario(), events=(simulator.Event(900 + incident, "prompt", "timestamp"),
                                                     simulator.Event(900 + rollback, "prompt", "static")))
    replicas = [simulator.Replica("vllm-0", scenario, start=start - 900, seed=1),
                simulator.Replica("vllm-1", simulator.Scenario(), start=start - 900, seed=2)]
    sim = Fleet(replicas, clock=lambda: clock.t).start()
    cfg = load({"global": {"poll_interval": "15s", "connect_timeout": "500ms", "read_timeout": "1s", "jitter": "0s"},
                "rules": {"change_point": {"enabled": False}}, "deploys": {"api_token": "s3cret"},
                "targets": [{"name": r.name, "url": sim.metrics_url(r.name), "labels": {"namespace": "llm", "pod": r.name}}
                            for r in replicas]})
    sidecar = build_sidecar(cfg, "127.0.0.1:0", clock=clock)
    sidecar.app.status_page.wall = clock  # the page's `now` is the poller's clock
    sidecar.server.start()
    base = f"http://127.0.0.1:{sidecar.server.port}"

    def play(until: float) -> None:
        while clock.t < start + until:
            clock.t += 15
            for r in replicas:
                r.advance(clock.t)
            for p in list(sidecar.poller.pollers.values()):
                p.poll()
            sidecar.poller.evaluate()

    def announce(version: str) -> None:
        r = requests.post(base + "/api/v1/deploys", json={"version": version, "target": "vllm-0", "description": "new system prompt"},
                          headers={"Authorization": "Bearer s3cret"}, timeout=5)
        assert r.status_code == 202

    try:
        play(incident - 1)
        announce("v42")
        play(incident + 420)
        dom = browse(binary, base + "/", tmp_path / "profile", "--dump-dom")
        firing = [body for state, body in alert_items(dom) if state == "firing" and "PrefixCacheHitRateDropAfterDeploy" in body]
        assert firing, dom[:3000]
        assert "vllm-0" in firing[0] and re.search(r'class="cause">prompt_prefix_change<', firing[0])
        assert "Prefix-cache hit rate" in firing[0]  # its summary
        card = dom[dom.index("<h3>vllm-0 "):dom.index("<h3>vllm-1 ")]
        drop = re.search(r"last hour: ([\d.]+)% → ([\d.]+)% \(fell\)", card)
        assert drop and float(drop[1]) - float(drop[2]) >= 30, card[-1500:]
        assert 'class="deploy"' in card and "deploy v42 (api)" in card and "<polyline" in card
        screenshot = tmp_path / "statuspage.png"
        browse(binary, base + "/", tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1280,1500")
        assert screenshot.stat().st_size > 10000
        if os.environ.get("STATUSPAGE_SCREENSHOT"):  # how docs/statuspage.png is made; the phone's view stays in tmp_path
            shutil.copy(screenshot, os.environ["STATUSPAGE_SCREENSHOT"])
            browse(binary, base + "/", tmp_path / "profile", f"--screenshot={tmp_path / 'phone.png'}", "--window-size=390,1600")

        announce("v43")
        play(rollback + 900)
        dom = browse(binary, base + "/", tmp_path / "profile", "--dump-dom")
        assert not [b for s, b in alert_items(dom) if "PrefixCacheHitRateDropAfterDeploy" in b], dom[:3000]
        assert "No alert is firing or pending." in dom
        assert not [a for a in sidecar.state.published.alerts if a.alertname == "PrefixCacheHitRateDropAfterDeploy"]
        assert json.loads(requests.get(base + "/api/v1/status", timeout=5).text)["targets"][0]["up"]
    finally:
        sidecar.poller.stop()
        sidecar.server.stop()
        sim.stop()


# --- the causes that are not deploys: an engine asleep, the tiers, a grown fleet ------------------
def test_an_engine_asleep_is_shown_asleep_not_down():
    view, now = played_view(seconds=600.0, incident_at=900.0)
    sleeping = replace(view.snapshot, series=tuple(replace(s, sleep_level=1) for s in view.snapshot.series))
    page = Page(render(PageInput((replace(view, snapshot=sleeping),)), now).decode())
    assert "asleep (sleep level 1)" in page.all_text and "not down" in page.all_text
    assert "1 of them asleep" in re.sub(r"\s+", " ", page.all_text)
    assert any(t == "article" and "asleep" in a.get("class", "") for t, a in page.tags)
    awake = Page(render(PageInput((view,)), now).decode())
    assert "asleep (sleep level" not in awake.all_text and "of them asleep" not in awake.all_text


def test_every_tier_is_shown_where_a_connector_serves_and_a_grown_fleet_says_what_gets_it_back():
    from exporter.sim.stories import with_connector
    replica = simulator.Replica("vllm-0", with_connector(5.0), start=-900.0, seed=3)
    history = History(3600.0 + 15.0, 300.0, windows=[s for _, s in WINDOWS], mid_seconds=900.0, mid_step=30.0)
    snap, now = simulator.play_into(replica, history, 600.0, 15.0)
    view = TargetView(target=Target("vllm-0", "http://127.0.0.1:1/m"), up=True, polled=True, snapshot=snap,
                      stats=summarize(history.samples(), now, WINDOWS, 1000.0, snap.block_size), samples=history.samples())
    fleet = {"t": now - 120, "target": None, "version": "replicas:2->6", "source": "replicas", "model": MODEL,
             "replicas": {"before": 2, "after": 6}, "description": "6 replicas of demo/llama-3-8b (was 2): prefix-hash or "
             "session-affinity routing keeps them together (`whatif --routing` quantifies it)"}
    text = re.sub(r"\s+", " ", Page(render(PageInput((view,), deploys=(fleet,)), now).decode()).all_text)
    assert "hit ratio (all tiers)" in text and "· device tier" in text and "· external tier" in text
    assert "fleet: 6 replicas of demo/llama-3-8b (was 2)" in text and "whatif --routing" in text
    assert "last event: replicas:2->6 (replicas)" in text


def test_a_targets_kv_events_show_where_the_prompt_changes_and_who_computes_again_as_text():
    """A hostile publisher's salt or LoRA name, or a tokenizer's text, is rendered as text."""
    from exporter.parse.kvevents import decode
    from exporter.series.blockindex import BlockIndex, KVView

    from kvpub import frames, stored

    evil = "".join(HOSTILE)
    index = BlockIndex()
    index.apply(decode(frames(0, [stored([1], None, range(16), salt=evil, lora=evil)])), 100.0)
    index.apply(decode(frames(1, [stored([2], None, range(16), salt="tenant-b")])), 100.0)
    kv = KVView("tcp://10.0.0.5:5557", connected=True, last_message=99.0, received=2, dropped=1,
                recent=index.window(100.0, 60.0), divergence_text="token 13 changes: " + evil)
    view, now = played_view()
    text = render(PageInput(targets=(replace(view, kv=kv),), alerts=(), deploys=(), verdicts={}, links=(), version="0",
                            warning=""), 100.0).decode()
    parsed = Page(text)
    assert not {tag for tag, _ in parsed.tags} & {"script", "img", "iframe"}
    assert "KV events: connected" in parsed.all_text and "2 received, 1 lost" in parsed.all_text
    assert parsed.all_text.count(HOSTILE[0]) >= 3 and "tenant-b" in parsed.all_text


@pytest.mark.slow
def test_a_restarted_scraping_sidecar_says_on_its_page_in_its_status_and_its_log_that_it_knows_nothing_from_before(tmp_path):
    """Direct (sidecar) mode restarted mid-incident: unlike central mode it has no
    Prometheus to read the baseline back from. The new process says so where an on-call
    looks: the status page, /api/v1/status and the start's log line."""
    import signal
    import sys

    import requests

    from exporter.poll.promread import SCRAPED_SINCE_START

    from conftest import free_port, wait_for
    from fakeserver import FakeServer, reply
    from helpers import CounterPod

    pod = CounterPod(time.time() - 900)
    root = Path(__file__).resolve().parent.parent
    port = free_port()
    with FakeServer({"/metrics": lambda h: reply(h, 200, pod.body(0.8, 5000.0).encode())}) as vllm:
        config = tmp_path / "sidecar.yml"
        config.write_text(json.dumps({"global": {"poll_interval": "1s", "jitter": "0s", "connect_timeout": "500ms", "read_timeout": "1s"},
                                      "targets": [{"name": "vllm-0", "url": vllm.base + "/metrics"}]}))
        base = f"http://127.0.0.1:{port}"
        for run in (1, 2):  # the first process, then the restart
            log = tmp_path / f"sidecar-{run}.log"
            proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={config}",
                                     f"--web.listen-address=127.0.0.1:{port}", "--log.level=info"], cwd=root, stderr=open(log, "w"))
            try:
                assert wait_for(lambda: requests.get(base + "/api/v1/status", timeout=5).json()["targets"][0]["up"], 30, 0.2), \
                    log.read_text()
                status = requests.get(base + "/api/v1/status", timeout=5).json()
                page = requests.get(base + "/", timeout=5).text
            finally:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=30) == 0, log.read_text()
        assert status["samples_source"] == SCRAPED_SINCE_START
        assert SCRAPED_SINCE_START in page.replace("&#x27;", "'")
        assert SCRAPED_SINCE_START in log.read_text()  # the restart's own log, at its start

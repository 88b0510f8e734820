import os
import subprocess
from dataclasses import replace

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.serve.collector import METRICS, PrefixCacheCollector
from exporter.serve.state import Deploys, State

from conftest import FIXTURES, require_binary
from helpers import WINDOWS, simulated_state

GOLDEN = FIXTURES / "golden" / "collector.prom"


def exposition(state) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, [w for w, _ in WINDOWS]))
    return generate_latest(registry)


def test_golden_exposition():
    """Set UPDATE_GOLDEN=1 to rewrite the golden file after an intended change."""
    text = exposition(simulated_state())
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_bytes(text)
    assert text.decode() == GOLDEN.read_text()


def test_every_family_is_in_the_table_and_help_names_the_windows():
    text = exposition(simulated_state()).decode()
    names = set()
    for fam in text_string_to_metric_families(text):
        assert "prefixcache_" + fam.name.removeprefix("prefixcache_") in METRICS or fam.name + "_total" in METRICS or fam.name in METRICS
        names.add(fam.name)
        if "window" in {k for s in fam.samples for k in s.labels}:
            assert "1m, 5m" in fam.documentation
    assert {"prefixcache_hit_ratio", "prefixcache_ttft_seconds", "prefixcache_target_up", "prefixcache_scrapes",
            "prefixcache_vllm_prefix_cache_queries", "prefixcache_vllm_time_to_first_token_seconds"} <= names


def test_derived_values_and_target_labels():
    fams = {f.name: f for f in text_string_to_metric_families(exposition(simulated_state()).decode())}
    hit = {(s.labels["target"], s.labels["window"]): s.value for s in fams["prefixcache_hit_ratio"].samples}
    # the deploy was 150 s before `now`: the 1m window is all after it, the 5m half
    assert hit[("vllm-0", "1m")] < 0.1
    assert 0.3 < hit[("vllm-0", "5m")] < 0.6
    up = {s.labels["target"]: (s.value, s.labels["namespace"]) for s in fams["prefixcache_target_up"].samples}
    assert up == {"vllm-0": (1.0, "llm"), "vllm-down": (0.0, "")}
    # a down target exports no stale raw counters
    assert {s.labels["target"] for s in fams["prefixcache_vllm_prefix_cache_queries"].samples} == {"vllm-0"}


def test_token_rates_are_tokens_for_a_block_counting_target_too():
    """vLLM 0.7.3-0.8.x counts lookups in blocks: its *_tokens_per_second were blocks per
    second (16x too small beside the tokens of a newer pod; /api/v1/status already gave
    tokens). The same traffic now exports about the same rates under either generation."""
    from helpers import simulated_view
    from exporter.serve.state import State

    def rates(generation):
        state = State()
        view = simulated_view(generation=generation)
        state.set_targets([view])
        fams = {f.name: f for f in text_string_to_metric_families(exposition(state).decode())}
        out = {name: {s.labels["window"]: s.value for s in fams[f"prefixcache_{name}_tokens_per_second"].samples}
               for name in ("query", "hit", "recomputed")}
        return out, view

    blocks, view = rates("v0.8")
    tokens, _ = rates("current")
    assert view.stats["demo/llama-3-8b"]["5m"].unit == "blocks"  # no cache_config_info: 16 tokens a block, vLLM's default
    for name in ("query", "hit", "recomputed"):
        for window in ("1m", "5m"):
            assert abs(blocks[name][window] / tokens[name][window] - 1.0) < 0.1, (name, window, blocks[name], tokens[name])
    raw = view.stats["demo/llama-3-8b"]["5m"].query_rate  # the counter's own unit, still what the windows keep
    assert blocks["query"]["5m"] == raw * 16


def test_a_target_whose_engine_series_are_withheld_exports_the_rest():
    """A vLLM pod read from a Prometheus: the engine's own series are there already, so the
    `as_read` families are not exported again (most of them the TTFT histogram's buckets);
    what we derive or convert (the lookup pair with its unit), the sleep level and the
    target's health stay. Another engine's are sums and renames we made: they stay."""
    def families_of(state) -> dict[str, set[str]]:
        return {f.name: {s.labels.get("target") for s in f.samples} for f in text_string_to_metric_families(exposition(state).decode())}

    state = simulated_state()
    everything = families_of(state)
    state.update(engine_series_withheld=frozenset({"vllm-0"}))
    withheld = families_of(state)
    as_read = {d.exposed_name.removesuffix("_total") for d in METRICS.values() if d.as_read}
    present = {name for name, targets in everything.items() if "vllm-0" in targets}
    assert {"prefixcache_vllm_prompt_tokens", "prefixcache_vllm_time_to_first_token_seconds"} <= present & as_read
    assert {name for name, targets in withheld.items() if "vllm-0" in targets} == present - as_read
    assert {"prefixcache_effective_hit_ratio", "prefixcache_target_up", "prefixcache_ttft_seconds",
            "prefixcache_vllm_prefix_cache_queries"} <= present - as_read
    view = state.target("vllm-0")
    assert view.snapshot.engine_kind == "vllm"
    state.set_targets([replace(view, snapshot=replace(view.snapshot, engine_kind="sglang"))])
    assert {name for name, targets in families_of(state).items() if "vllm-0" in targets} == present


def test_the_shipped_rules_and_dashboard_read_no_family_a_read_target_leaves_out():
    """So that a central exporter reading Prometheus loses no panel and no alert."""
    import re

    from helpers import ROOT

    as_read = {d.exposed_name for d in METRICS.values() if d.as_read}
    shipped = [*ROOT.glob("alerts/**/*.y*ml"), *ROOT.glob("dashboards/*.json")]
    assert len(shipped) >= 4
    for path in shipped:
        named = {re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"prefixcache_[a-z0-9_]*[a-z0-9]", path.read_text())}
        assert not named & as_read, (path.name, named & as_read)


def test_empty_state_still_exposes_process_metrics():
    text = exposition(State()).decode()
    assert "prefixcache_build_info" in text and "prefixcache_config_last_reload_successful 1.0" in text


def test_a_failing_collect_is_a_500_a_log_line_and_a_count(caplog):
    """Never a silent empty 200: the scrape fails visibly, the error is counted, and the
    next good render shows the count."""
    import io
    from exporter.serve.app import App

    class Flaky(State):
        broken = True

        def read(self):
            if self.broken:
                raise RuntimeError("bug")
            return super().read()

    state = Flaky()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["1m"]))
    app = App(state, registry, render_interval=0.0)
    out = {}
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "wsgi.input": io.BytesIO(b"")}
    body = b"".join(app(environ, lambda status, headers: out.update(status=status)))
    assert out["status"].startswith("500") and b"collect" in body
    assert "collect failed" in caplog.text
    state.broken = False
    body = b"".join(app(environ, lambda status, headers: out.update(status=status)))
    assert out["status"].startswith("200") and b"prefixcache_collect_errors_total 1.0" in body


def test_promtool_check_metrics_accepts_our_output():
    promtool = require_binary("promtool")
    proc = subprocess.run([promtool, "check", "metrics"], input=exposition(simulated_state()), capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_a_gone_target_leaves_no_last_deploy_series():
    """40 replaced pods left 40 prefixcache_last_deploy_timestamp_seconds{pod=""} series."""
    state = simulated_state()
    state.update(deploys=Deploys((), {"pod-gone": {"api": 1}},
                                 {"": 1764480000.0, "vllm-0": 1764480001.0, "pod-gone": 1764480002.0}))
    fams = {f.name: f for f in text_string_to_metric_families(exposition(state).decode())}
    last = {s.labels["target"] for s in fams["prefixcache_last_deploy_timestamp_seconds"].samples}
    assert last == {"", "vllm-0"}
    assert "pod-gone" not in {s.labels["target"] for s in fams["prefixcache_deploy_events"].samples}


def test_the_sidecar_exposes_its_process_and_gc_metrics_and_no_name_twice():
    """The memory and CPU the benchmarks measure are on /metrics in production too, and
    describe() names every family, so a collector exposing one of our names is refused
    at registration rather than rendering a duplicate family."""
    import pytest
    from prometheus_client.core import GaugeMetricFamily

    from exporter.config.sections import load
    from exporter.sidecar import build_sidecar

    sidecar = build_sidecar(load({"targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/metrics"}]}), "127.0.0.1:0")
    try:
        names = {f.name for f in text_string_to_metric_families(sidecar.app.exposition.get(False).decode())}
    finally:
        sidecar.poller.stop()
        sidecar.server.stop()  # built, never started: its workers run since it bound the port
    assert {"process_resident_memory_bytes", "process_cpu_seconds", "python_gc_objects_collected", "python_info"} <= names
    assert {"prefixcache_target_up", "prefixcache_build_info"} <= names

    class Clash:
        def describe(self):
            return [GaugeMetricFamily("prefixcache_target_up", "a second family of our name")]

        def collect(self):
            return self.describe()

    with pytest.raises(ValueError, match="prefixcache_target_up"):
        sidecar.registry.register(Clash())


def test_every_tier_and_the_ratio_the_rules_judge_are_exported_beside_the_gpus_own():
    """A KV connector (LMCache) serving most cached tokens: the GPU-local ratio alone was
    all a dashboard had; the tiers are exported only where more than one serves."""
    from exporter.sim import simulator
    from exporter.sim.stories import with_connector
    state = State()
    state.set_targets([simulated_view_of(simulator.Replica("vllm-0", with_connector(3.0), start=0.0, seed=2), 500.0)])
    fams = {f.name: f for f in text_string_to_metric_families(exposition(state).decode())}
    effective = {s.labels["window"]: s.value for s in fams["prefixcache_effective_hit_ratio"].samples}
    tiers = {(s.labels["window"], s.labels["tier"]): s.value for s in fams["prefixcache_tier_hit_ratio"].samples}
    admitted = {s.labels["window"]: s.value for s in fams["prefixcache_admitted_hit_ratio"].samples}
    assert 0.85 < effective["5m"] < 0.93 and 0.2 < admitted["5m"] < 0.4
    assert set(tiers) == {("1m", "device"), ("1m", "external"), ("5m", "device"), ("5m", "external")}
    assert tiers[("5m", "device")] + tiers[("5m", "external")] == __import__("pytest").approx(effective["5m"])
    assert [(s.labels["engine"], s.value) for s in fams["prefixcache_engine_sleep_level"].samples] == [("0", 0.0)]
    # (vLLM's connector counters at 0 are one tier, no tier_hit_ratio: the golden file shows none)


def simulated_view_of(replica, seconds, step=5.0):
    from exporter.config.sections import Target
    from exporter.monitor.targetview import TargetView
    from exporter.series.history import History
    from exporter.series.window import summarize
    from exporter.sim import simulator
    history = History(300.0 + step)
    snap, now = simulator.play_into(replica, history, seconds, step, start=seconds - 305.0)
    return TargetView(target=Target(replica.name, "http://127.0.0.1:1/metrics"), up=True, polled=True, snapshot=snap,
                      stats=summarize(history.samples(), now, WINDOWS, 1000.0, snap.block_size), samples=history.samples())


def test_a_targets_kv_events_are_exported_with_bounded_groups_tenants_and_adapters():
    """What vLLM computed again, by prompt group, cache_salt and LoRA, top kv_events.top_groups plus "other"."""
    from exporter.parse.kvevents import decode
    from exporter.series.blockindex import BlockIndex

    from kvpub import frames, stored

    index = BlockIndex()
    for i in range(30):  # 30 tenants, each with its own prompt; tenant-0 sends the most
        for _ in range(3 if i == 0 else 1):
            index.apply(decode(frames(i, [stored([1000 * i + _], None, [i] * 16, salt=f"tenant-{i}", lora="bot" if i % 2 else None)])), 100.0)
    from exporter.series.blockindex import KVView

    kv = KVView("tcp://10.0.0.5:5557", connected=True, last_message=100.0, received=33, dropped=2,
                recent=index.window(100.0, 60.0), group_labels=(("x", "y"),))
    state = simulated_state()
    [view] = [v for v in state.read().targets if v.target.name == "vllm-0"]
    state.publish(replace(view, kv=kv))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, [w for w, _ in WINDOWS], top_groups=5))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    salts = {s.labels["cache_salt"]: s.value for s in fams["prefixcache_kv_new_tokens_per_second_by_cache_salt"].samples}
    assert len(salts) == 6 and salts["tenant-0"] == 48 / 60 and salts["other"] == 25 * 16 / 60
    assert {s.labels["lora_adapter"] for s in fams["prefixcache_kv_new_tokens_per_second_by_lora"].samples} == {"bot"}
    assert len(fams["prefixcache_kv_new_tokens_per_second"].samples) == 6
    batches = {s.labels["result"]: s.value for s in fams["prefixcache_kv_events_batches"].samples}
    assert batches["received"] == 33 and batches["dropped"] == 2
    assert [s.value for s in fams["prefixcache_kv_events_connected"].samples] == [1.0]


def test_version_alerts_of_one_version_in_two_scopes_are_two_alert_state_series():
    """One pod template rolled in staging and prod has one version in both: without the scope
    the two alerts were one series twice, an exposition Prometheus refuses."""
    from exporter.alerting.rules_state import FIRING, Alert
    state = State()
    alerts = tuple(Alert("PrefixCacheHitRateDropAfterDeploy", "", "m", state=FIRING, version="v2",
                         scope=(("namespace", ns), ("owner", "vllm")), labels=(("cause", "unknown"), ("severity", "critical")))
                   for ns in ("prod", "staging"))
    state.update(alerts=alerts)
    text = exposition(state).decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "prefixcache_alert_state"]
    assert sorted(s.labels["scope"] for s in family.samples) == ["namespace=prod,owner=vllm", "namespace=staging,owner=vllm"]
    assert {s.labels["version"] for s in family.samples} == {"v2"} and {s.labels["target"] for s in family.samples} == {""}

"""/metrics from per-target fragments (exporter/serve/exposition.py): the same families
and samples as the collector's whole render, a render that costs what changed, and the
runtime collectors read on every scrape."""
import functools
import gzip
import math
import time
from dataclasses import replace

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from exporter.alerting.rules_state import Alert
from exporter.serve.collector import PrefixCacheCollector
from exporter.config.sections import Target
from exporter.serve.exposition import Exposition, TextFamilies
from exporter.serve.state import Deploys, State

from conftest import wait_for
from helpers import simulated_state, simulated_view


def samples(text: str) -> dict:
    """family -> (type, help, sorted samples): what a scraper reads, whatever the order."""
    return {f.name: (f.type, f.documentation, sorted((s.name, tuple(sorted(s.labels.items())), s.value) for s in f.samples))
            for f in text_string_to_metric_families(text)}


def whole(state) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["1m", "5m"]))
    return generate_latest(registry).decode()


@functools.lru_cache(maxsize=1)
def fleet_views():
    """Five targets' views, simulated once per worker (views are immutable)."""
    base = simulated_state(seconds=120).targets()
    return tuple(base) + tuple(
        simulated_view(name=f"vllm-{i}", seconds=120, seed=i,
                       labels=(("namespace", "llm"), ("team", f"t{i}" if i != 3 else "a\"b\\c\nd"))) for i in range(1, 4))


def fleet_state():
    state = State()
    state.set_targets(list(fleet_views()))
    state.update(config_reload_success=True, config_reload_time=1764480000.0,
                 deploys=Deploys((), {"": {"api": 2}, "vllm-1": {"restart": 1}}, {"": 1764480000.0, "vllm-2": 1764480001.0}),
                 skipped_polls={"vllm-down": 7},
                 alerts=(Alert("PrefixCacheHitRateLow", "vllm-1", "demo/llama-3-8b", state="firing",
                               labels=(("cause", "unknown"), ("severity", "warning"))),))
    return state


def test_the_fragments_render_every_family_and_sample_of_the_whole_render():
    state = fleet_state()
    exposition = Exposition(state, CollectorRegistry(), collector=PrefixCacheCollector(state, ["1m", "5m"]))
    ours = exposition.get(False).decode()
    assert samples(ours) == samples(whole(state))
    assert 'prefixcache_skipped_polls_total{namespace="",target="vllm-down",team=""} 7.0' in ours


def test_two_routers_of_one_model_each_get_their_own_series():
    """The fleet's families name targets of their own (a router's predictions): two routers
    predicting one model over one window are two series, each with its router's labels, as
    in the whole render (a label text kept by family and values alone gave both the first
    router's labels)."""
    from exporter.alerting.router import Delivered, Prediction
    from exporter.monitor.targetview import TargetView

    state = State()
    routers = [Target(name, f"http://{name}:9090/metrics", (("namespace", space),)) for name, space in (("epp-a", "a"), ("epp-b", "b"))]
    state.set_targets([TargetView(target=t) for t in routers])
    state.update(routing={t.name: {"m": {"5m": (Prediction(ratio, "tokens", 10.0, 1000.0), Delivered(ratio / 2, 1000.0, 2))}}
                          for t, ratio in zip(routers, (0.8, 0.6))})
    ours = Exposition(state, CollectorRegistry(), collector=PrefixCacheCollector(state, ["1m", "5m"])).get(False).decode()
    assert samples(ours) == samples(whole(state))
    assert 'prefixcache_predicted_hit_ratio{model_name="m",namespace="a",target="epp-a",weighting="tokens",window="5m"} 0.8' in ours
    assert 'prefixcache_predicted_hit_ratio{model_name="m",namespace="b",target="epp-b",weighting="tokens",window="5m"} 0.6' in ours


def test_a_render_renders_again_only_the_targets_that_changed():
    state = fleet_state()
    collector = PrefixCacheCollector(state, ["1m", "5m"])
    exposition = Exposition(state, CollectorRegistry(), min_interval=0.0, collector=collector)
    exposition.get(False)
    assert exposition.fragments.rendered_targets == 5  # when the exposition began
    state.update(config_reload_time=1764480001.0)
    exposition.get(False)
    # again: a target's text is kept once its view was seen unchanged between two renders
    assert exposition.fragments.rendered_targets == 10
    view = state.target("vllm-2")
    state.publish(replace(view, scrapes=(("success", 500),)))
    text = exposition.get(False).decode()
    assert exposition.fragments.rendered_targets == 11
    assert 'prefixcache_scrapes_total{namespace="llm",result="success",target="vllm-2",team="t2"} 500.0' in text
    assert samples(text) == samples(whole(state))
    state.update(skipped_polls={"vllm-down": 8})  # a target's own count changed: that target only
    exposition.get(False)
    assert exposition.fragments.rendered_targets == 12


def kept_texts(render) -> dict[str, int]:
    """Target -> the bytes of its text kept for the next render."""
    return {name: sum(map(len, f[1].values())) for name, f in render._fragments.items() if f[1] is not None}


def test_a_target_whose_view_changes_at_every_render_keeps_no_text_between_renders():
    """At 10,000 pods read from Prometheus every view changes between two renders: their
    150 MB of text, kept for a next render that never used it, was the render's memory.
    A target seen unchanged at one of its last KEEP_AFTER renders keeps its text."""
    from exporter.serve.exposition import KEEP_AFTER

    state = fleet_state()
    exposition = Exposition(state, CollectorRegistry(), min_interval=0.0, collector=PrefixCacheCollector(state, ["1m", "5m"]))
    kept = lambda: kept_texts(exposition.fragments)  # noqa: E731
    for i in range(KEEP_AFTER + 2):
        state.publish(replace(state.target("vllm-2"), scrapes=(("success", 500 + i),)))
        text = exposition.get(False).decode()
        assert f'result="success",target="vllm-2",team="t2"}} {500.0 + i}' in text
        assert "vllm-2" not in kept() and "vllm-1" in kept()
    assert samples(text) == samples(whole(state))
    before = exposition.fragments.rendered_targets
    for _ in range(KEEP_AFTER):  # unchanged since: kept from its next render until KEEP_AFTER renders change it
        state.update(skipped_polls={"vllm-down": 9 + _})
        exposition.get(False)
        assert "vllm-2" in kept()
    assert exposition.fragments.rendered_targets - before == 1 + KEEP_AFTER  # vllm-2 once, vllm-down each time
    for i in range(KEEP_AFTER):
        state.publish(replace(state.target("vllm-2"), scrapes=(("success", 600 + i),)))
        exposition.get(False)
    assert "vllm-2" not in kept()


def test_the_texts_kept_between_renders_stay_within_keep_bytes_the_first_targets_by_name():
    """At 10,000 pods a scraper coming between two reads finds every view unchanged: their
    150 MB of text stayed for the next renders, and took the process over 1 GiB beside a
    read. Kept: at most `keep_bytes`, the first targets' by name, whose texts the next
    render reuses; the others are rendered anew, and their answer is the same."""
    state = fleet_state()
    exposition = Exposition(state, CollectorRegistry(), min_interval=0.0, collector=PrefixCacheCollector(state, ["1m", "5m"]))
    render = exposition.fragments
    kept = lambda: kept_texts(render)  # noqa: E731
    for i in range(2):  # the second render finds every view unchanged
        state.update(skipped_polls={"vllm-down": 7 + i})
        exposition.get(False)
    sizes = kept()
    names = sorted(sizes)
    assert len(names) >= 3, sizes
    render.keep_bytes = sizes[names[0]] + sizes[names[1]]  # room for the first two, not a third
    state.update(skipped_polls={"vllm-down": 9})
    exposition.get(False)
    assert sorted(kept()) == names[:2] and sum(kept().values()) <= render.keep_bytes
    before = render.rendered_targets
    state.update(skipped_polls={"vllm-down": 10})
    text = exposition.get(False).decode()
    assert render.rendered_targets - before == len(render._fragments) - 2  # all but the two kept, anew
    assert samples(text) == samples(whole(state))
    render.keep_bytes = 0
    state.update(skipped_polls={"vllm-down": 11})
    exposition.get(False)
    assert kept() == {}


def test_the_runtime_collectors_are_read_on_every_scrape_while_ours_are_cached():
    """process_cpu_seconds_total used to stand still between two changes of the state:
    exactly when polling stalls it looked as if the process did nothing."""
    state = fleet_state()
    runtime = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=runtime)
    exposition = Exposition(state, runtime, min_interval=3600.0, collector=PrefixCacheCollector(state, ["1m", "5m"]))

    def cpu(body: bytes) -> float:
        return samples(body.decode())["process_cpu_seconds"][2][0][2]

    first = exposition.get(False)
    began = time.process_time()
    while time.process_time() - began < 0.3:
        sum(range(10000))
    second = exposition.get(False)
    assert cpu(second) >= cpu(first) + 0.2
    assert exposition.fragments.rendered_targets == 5  # ours came from the cache
    zipped = exposition.get(True)
    assert samples(gzip.decompress(zipped).decode()).keys() == samples(second.decode()).keys()


def test_a_scrape_never_waits_long_for_a_render_and_a_failed_one_is_a_500():
    """A render slower than the wait: the scrape gets the last render at once (the next
    one shows the new state); a render that fails makes the scrape that waited for it a
    500, counted, and the next good render recovers."""
    import threading

    import pytest

    state = fleet_state()
    collector = PrefixCacheCollector(state, ["1m", "5m"])
    exposition = Exposition(state, CollectorRegistry(), min_interval=0.0, collector=collector, wait=0.2)
    first = exposition.get(False)
    gate = threading.Event()
    real = exposition.fragments.render
    exposition.fragments.render = lambda *between: (gate.wait(5.0), real(*between))[1]
    state.update(config_reload_success=False)
    began = time.monotonic()
    assert exposition.get(False) == first + b""  # the last render, after the wait
    assert time.monotonic() - began < 1.0
    gate.set()
    assert wait_for(lambda: b"prefixcache_config_last_reload_successful 0.0" in exposition.get(False))
    exposition.fragments.render = real
    state.update(config_reload_success=True)
    # a quick render: a scrape expects the next to end within its wait, as this one did
    assert wait_for(lambda: b"prefixcache_config_last_reload_successful 1.0" in exposition.get(False))
    exposition.fragments.render = lambda *between: 1 / 0
    state.update(config_reload_success=False)
    with pytest.raises(RuntimeError):
        exposition.get(False)
    assert state.published.counters.collect_errors == 1
    exposition.fragments.render = real
    assert b"prefixcache_collect_errors_total 1.0" in exposition.get(False)


def test_a_scrape_waits_for_a_render_only_when_the_last_one_is_older_than_max_age():
    """Fifty scrapers at once, or one every second, get the last render while it is at
    most `max_age` old and start the next one without waiting for it; a scrape after a
    longer quiet (a Prometheus every 15 s) waits for the state as it is now."""
    import threading

    state = fleet_state()
    now = [0.0]
    exposition = Exposition(state, CollectorRegistry(), min_interval=1.0, clock=lambda: now[0], wait=30.0,
                            collector=PrefixCacheCollector(state, ["1m", "5m"]), max_age=2.0)
    state.update(config_reload_success=False)
    assert b"prefixcache_config_last_reload_successful 0.0" in exposition.get(False)  # the first scrape waits
    gate = threading.Event()
    real = exposition.fragments.render
    exposition.fragments.render = lambda *between: (gate.wait(30.0), real(*between))[1]
    state.update(config_reload_success=True)
    now[0] = 1.5  # due, and the last render read the state 1.5 s ago
    answers = [exposition.get(False) for _ in range(50)]
    assert all(b"prefixcache_config_last_reload_successful 0.0" in a for a in answers)  # none waited for the gated render
    gate.set()
    assert wait_for(lambda: b"prefixcache_config_last_reload_successful 1.0" in exposition.get(False))
    exposition.fragments.render = real
    state.update(config_reload_success=False)
    now[0] = 60.0  # quiet for a minute: this scrape waits for the render it starts
    assert b"prefixcache_config_last_reload_successful 0.0" in exposition.get(False)


def test_a_scrape_waits_only_for_a_render_that_may_end_within_the_wait():
    """A render as slow as the last one (10 s on the clock) that just started cannot end
    within the 5 s a scrape may wait: the scrape gets the last render at once. Near the end
    it may have, the next scrape waits for it and gets the state as it is now."""
    import threading

    state = fleet_state()
    now = [0.0]
    exposition = Exposition(state, CollectorRegistry(), min_interval=1.0, clock=lambda: now[0], wait=5.0,
                            collector=PrefixCacheCollector(state, ["1m", "5m"]), max_age=2.0)
    real = exposition.fragments.render

    def slow(*between):  # takes 10 s of the clock
        body = real(*between)
        now[0] += 10.0
        return body

    exposition.fragments.render = slow
    state.update(config_reload_success=False)
    now[0] = 100.0
    assert b"prefixcache_config_last_reload_successful 0.0" in exposition.get(False)  # waited: the last render was quick
    gate, started = threading.Event(), threading.Event()
    exposition.fragments.render = lambda *between: (started.set(), gate.wait(30.0), real(*between))[2]
    state.update(config_reload_success=True)
    now[0] = 200.0  # quiet long enough that the last render is old: this scrape starts a render
    began = time.monotonic()
    assert b"prefixcache_config_last_reload_successful 0.0" in exposition.get(False)
    assert time.monotonic() - began < 2.5  # not the 5 s wait: a render that takes 10 s would not end in it
    assert started.wait(5.0)  # at 200 on the clock, once the scrape's burst passed
    now[0] = 206.0  # 4 s before the render would end, as long as the last one took: worth waiting for
    threading.Timer(0.2, gate.set).start()
    assert b"prefixcache_config_last_reload_successful 1.0" in exposition.get(False)


def test_an_answer_over_plain_up_to_is_kept_gzipped_only_and_gunzipped_for_a_plain_scrape():
    """Above `plain_up_to` bytes only the gzipped answer is kept: a scrape that asks for gzip
    gets it at once, one that asks for it plain gets it gunzipped, never on the selector's
    thread (WouldWait), and the same text as an answer kept plain."""
    import pytest

    from exporter.serve.exposition import WouldWait

    state = fleet_state()
    small = Exposition(state, CollectorRegistry(), min_interval=1.0, collector=PrefixCacheCollector(state, ["1m", "5m"]))
    large = Exposition(state, CollectorRegistry(), min_interval=1.0, collector=PrefixCacheCollector(state, ["1m", "5m"]),
                       plain_up_to=1000)
    plain = small.parts(False)[0]
    assert len(plain) > 1000 and small.parts(False, wait=False)[0] == plain  # kept as it is: answered at once
    zipped = large.parts(True)[0]
    assert gzip.decompress(zipped) == plain
    assert large.parts(True, wait=False)[0] == zipped
    with pytest.raises(WouldWait):
        large.parts(False, wait=False)
    assert large.parts(False)[0] == plain


def test_the_fragments_lines_are_the_whole_renders_byte_for_byte():
    """Buckets, quantiles, _count and _sum too, with label values that need escaping."""
    state = fleet_state()
    ours = Exposition(state, CollectorRegistry(), collector=PrefixCacheCollector(state, ["1m", "5m"])).get(False).decode()
    lines = [sorted(line for line in text.splitlines() if not line.startswith("#")) for text in (ours, whole(state))]
    assert lines[0] == lines[1]
    assert any("_bucket{" in line for line in lines[0]) and any('quantile="' in line for line in lines[0])


def test_a_histogram_keeps_its_label_text_once_whatever_its_buckets():
    """Not a text for each bucket: at 10,000 pods those were some 100 MB of the render."""
    target = Target("t", "http://127.0.0.1:1/metrics")
    kept = []
    for bounds in ((0.5, math.inf), tuple(0.01 * 2 ** k for k in range(30)) + (math.inf,)):
        templates: tuple[dict, dict] = ({}, {})
        families = TextFamilies("1m", ("team",), templates)
        families.histogram("prefixcache_vllm_time_to_first_token_seconds", ("m", "0"), tuple((le, 1.0) for le in bounds), 1.0, target)
        families.summary("prefixcache_ttft_seconds", ("m", "1m"), tuple((q, 0.1) for q in (0.5, 0.9, 0.99)), (3, 0.3), target)
        lines = b"".join(families.fragments().values()).decode().splitlines()
        assert f'prefixcache_vllm_time_to_first_token_seconds_bucket{{engine="0",le="{bounds[0]!r}",model_name="m",target="t",team=""}} 1.0' in lines
        assert 'prefixcache_ttft_seconds{model_name="m",quantile="0.99",target="t",team="",window="1m"} 0.1' in lines
        kept.append(sum(map(len, flat(templates[0].values()))))
    assert kept[0] == kept[1]


def test_targets_share_label_text_patterns_and_print_what_a_text_built_anew_prints():
    """Braces, quotes, backslashes, newlines and NUL in a target's labels and in a series'
    own values: the lines with patterns are those built label by label, and a second
    target adds no pattern."""
    targets = [Target(name, "http://127.0.0.1:1/metrics", labels=(("team", team), ("namespace", "%s%%")))
               for name, team in (('a{0}"\\\n}', "x{1}y"), ("b", "{}"))]
    own = ("m{0}\x00", "0}")

    def lines(templates, target) -> list[str]:
        families = TextFamilies("1m", ("namespace", "team"), templates)  # "target" sorts between them
        families.add("prefixcache_target_up", (), 1.0, target)
        families.histogram("prefixcache_vllm_time_to_first_token_seconds", own, ((0.5, 1.0), (math.inf, 2.0)), 1.0, target)
        families.histogram("prefixcache_vllm_time_to_first_token_seconds", ("m{%s", "0"), ((math.inf, 2.0),), 1.0, target)
        families.summary("prefixcache_ttft_seconds", ("m}", "1m"), ((0.5, 0.1), (0.9, 0.2)), (3, 0.3), target)
        return b"".join(families.fragments().values()).decode().splitlines()

    used: dict = {}
    assert lines((used, {}), targets[0]) == lines(None, targets[0])
    patterns = dict(used)
    assert lines((used, {}), targets[1]) == lines(None, targets[1]) and used == patterns
    assert len(patterns) == 7 and [k[2] for k, p in patterns.items() if p is False] == ["le", ""]  # NUL: built anew
    assert lines((used, {}), targets[1])[0] == 'prefixcache_target_up{namespace="%s%%",target="b",team="{}"} 1.0'
    assert 'team="x{1}y"' in lines((used, {}), targets[0])[0] and 'target="a{0}\\"' in lines((used, {}), targets[0])[0]


def flat(values) -> list[str]:
    return [text for v in values for text in ((v,) if isinstance(v, str) else flat(v) if isinstance(v, tuple) else ())]


def test_a_fragments_lines_follow_every_value_from_render_to_render():
    """A target's fragment, rendered again with the label-text patterns the last render used,
    prints every value as prometheus_client does: a repeat, a signed zero, NaN, an int, Go's
    exponents."""
    known: dict = {}  # what FragmentRender keeps between renders
    target = Target("t", "http://127.0.0.1:1/metrics")
    for value in (1.0, 1.0, 0.0, -0.0, -0.0, 0.0, 0, math.nan, math.nan, 5, 5.0, 1e7, 1e7, 12345678.9, math.inf, -math.inf, 2.5):
        used: dict = {}
        families = TextFamilies("1m", (), (used, known))
        families.add("prefixcache_target_up", (), value, target)
        families.histogram("prefixcache_vllm_time_to_first_token_seconds", ("m", "0"), ((0.5, value), (math.inf, value)), 1.0, target)
        lines = b"".join(families.fragments().values()).decode().splitlines()
        assert len(lines) == 5 and lines[0].startswith('prefixcache_target_up{target="t"} ')
        sum_line = [line for line in lines if line.startswith("prefixcache_vllm_time_to_first_token_seconds_sum")]
        assert sum_line == ['prefixcache_vllm_time_to_first_token_seconds_sum{engine="0",model_name="m",target="t"} 1.0']
        assert all(line.rpartition(" ")[2] == floatToGoString(value) for line in lines if line not in sum_line), (value, lines)
        known = used


def test_a_scrape_that_may_not_wait_hears_so_and_a_burst_shares_one_runtime_reading():
    """The selector's thread asks without waiting (immediate.py): where a scrape would wait
    for a render it gets WouldWait and a worker asks again. Scrapes less than
    `runtime_max_age` apart share one reading of the runtime collectors."""
    import pytest
    from prometheus_client.core import GaugeMetricFamily

    from exporter.serve.exposition import WouldWait

    class Counting:
        reads = 0

        def collect(self):
            Counting.reads += 1
            yield GaugeMetricFamily("runtime_reads", "reads of the runtime collectors", value=Counting.reads)

    runtime = CollectorRegistry(auto_describe=False)
    runtime.register(Counting())
    now = [1000.0]
    state = fleet_state()
    exposition = Exposition(state, runtime, min_interval=0.0, clock=lambda: now[0],
                            collector=PrefixCacheCollector(state, ["1m", "5m"]), runtime_max_age=0.1)
    state.update(config_reload_success=False)
    with pytest.raises(WouldWait):  # its first render since: every scrape would wait for it
        exposition.parts(False, wait=False)
    ours, first = exposition.parts(False)
    assert b"prefixcache_config_last_reload_successful 0.0" in ours and b"runtime_reads 1.0" in first
    now[0] += 0.05
    assert exposition.parts(False, wait=False)[1] == first and exposition.parts(True)[1] != first
    now[0] += 0.06
    assert b"runtime_reads 2.0" in exposition.parts(False, wait=False)[1]
    assert Counting.reads == 2


def test_a_burst_right_after_a_quiet_state_changed_does_not_wait_for_its_render():
    """Polls every 5 s, scrapers every second: the state stays still for seconds, then a
    poll round changes it just before a burst. The last render was read seconds ago, but
    the scrape a second ago found it still the state: the burst gets it at once, and a
    scrape after a long quiet still waits for the state as it is now."""
    import threading

    state = fleet_state()
    now = [0.0]
    exposition = Exposition(state, CollectorRegistry(), min_interval=1.0, clock=lambda: now[0], wait=30.0,
                            collector=PrefixCacheCollector(state, ["1m", "5m"]), max_age=2.0)
    state.update(config_reload_success=False)
    assert b"prefixcache_config_last_reload_successful 0.0" in exposition.get(False)
    for second in range(1, 5):  # nothing changes: each scrape finds the render still the state
        now[0] = float(second)
        exposition.get(False)
    gate = threading.Event()
    real = exposition.fragments.render
    exposition.fragments.render = lambda *between: (gate.wait(30.0), real(*between))[1]
    state.update(config_reload_success=True)  # the poll round
    now[0] = 5.0  # the render read the state 5 s ago, but it was the state a second ago
    answers = [exposition.get(False) for _ in range(50)]
    assert all(b"prefixcache_config_last_reload_successful 0.0" in a for a in answers)  # none waited
    gate.set()
    assert wait_for(lambda: b"prefixcache_config_last_reload_successful 1.0" in exposition.get(False))
    exposition.fragments.render = real
    now[0] = 30.0  # quiet since the render: a change now is news to this scrape, which waits for it
    state.update(config_reload_success=False)
    assert b"prefixcache_config_last_reload_successful 0.0" in exposition.get(False)


def test_a_render_lets_a_burst_that_comes_while_it_runs_go_first_after_each_target():
    """Scrapes that come while a render runs (a burst the poll round spaced out) get the
    last answer at once, and the render pauses after the target it was rendering until
    they stop for `quiet`, or until `max_defer` from when it was asked for has passed."""
    state = fleet_state()
    now = [0.0]
    collector = PrefixCacheCollector(state, ["1m", "5m"])
    exposition = Exposition(state, CollectorRegistry(), min_interval=0.0, clock=lambda: now[0], max_age=1000.0,
                            collector=collector, quiet=0.05, max_defer=5.0)
    before = exposition.get(False)
    rendered, real_target = [], collector.target

    def target(families, view, *more):
        rendered.append(view.target.name)
        if len(rendered) == 1:
            assert exposition.get(False) == before  # a scrape mid-render: the last answer, at once
        return real_target(families, view, *more)

    collector.target = target

    def later():  # a scrape a while after the last
        now[0] += 0.1
        return exposition.get(False)

    views = state.targets()
    for view in views:  # the poll round: every target changed
        state.publish(replace(view, scrape_duration=0.5))
    now[0] = 1.0
    assert exposition.get(False) == before  # asks for the render, which waits for a pause first
    now[0] = 1.06
    assert wait_for(lambda: len(rendered) == 1, timeout=5.0, step=0.01)
    time.sleep(0.3)  # real time: the stopped clock says the scrape mid-render was 0 s ago
    assert len(rendered) == 1
    now[0] = 1.2  # the scrapes stopped 0.14 s ago: the render goes on
    assert wait_for(lambda: len(rendered) == len(views), timeout=5.0, step=0.01)
    assert wait_for(lambda: b'scrape_duration_seconds{namespace="llm",target="vllm-1",team="t1"} 0.5\n' in later(), timeout=5.0, step=0.01)
    assert sorted(rendered) == sorted(v.target.name for v in views)

    rendered.clear()
    for view in views:
        state.publish(replace(view, scrape_duration=0.25))
    now[0] = 10.0
    exposition.get(False)
    collector.target = lambda *a: (rendered.append(a[1].target.name), exposition.get(False), real_target(*a))[-1]
    now[0] = 15.5  # a scrape after every target, but the render was asked for more than max_defer ago
    assert wait_for(lambda: len(rendered) == len(views), timeout=2.0, step=0.01)
    assert wait_for(lambda: b'scrape_duration_seconds{namespace="llm",target="vllm-1",team="t1"} 0.25\n' in later(), timeout=5.0, step=0.01)


def test_work_that_can_wait_waits_for_a_pause_in_the_scrapes_and_never_longer_than_the_limit():
    """A poll's parse (Exposition.wait_for_pause): at once without scrapes; while a burst
    comes, until the scrapes pause for `quiet`; and never more than `limit` after the
    burst's first scrape, so scrapers that never pause hold no poll back."""
    import threading

    state = fleet_state()
    now = [0.0]
    exposition = Exposition(state, CollectorRegistry(), min_interval=0.0, clock=lambda: now[0],
                            collector=PrefixCacheCollector(state, ["1m", "5m"]), quiet=0.05)
    began = time.monotonic()
    exposition.wait_for_pause(limit=5.0)  # never scraped
    assert time.monotonic() - began < 0.5
    exposition.get(False)  # a burst begins at 0
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (exposition.wait_for_pause(limit=5.0), done.set()))
    waiter.start()
    assert not done.wait(0.3)  # the stopped clock: the scrape was 0 s ago
    now[0] = 0.06  # 60 ms without a scrape
    assert done.wait(5.0)
    waiter.join()

    for step in range(140):  # scrapes 40 ms apart for 5.6 s, the last one now: they never paused
        now[0] = 10.0 + step * 0.04
        exposition.get(False)
    began = time.monotonic()
    exposition.wait_for_pause(limit=5.0)
    assert time.monotonic() - began < 0.5


def test_a_view_the_state_replaced_is_not_kept_alive_by_the_last_render():
    """A view holds its history's arrays as they were at its poll; once the history thinned
    them it holds arrays of its own. Kept by the render until the next one, every target's
    history was held twice between two renders."""
    import gc
    import weakref

    state = fleet_state()
    state.publish(replace(state.target("vllm-2"), scrapes=(("success", 400),)))  # a view only the state holds
    exposition = Exposition(state, CollectorRegistry(), min_interval=0.0, collector=PrefixCacheCollector(state, ["1m", "5m"]))
    state.update(config_reload_time=1764480001.0)
    exposition.get(False)  # rendered twice: the views' texts are kept
    assert exposition.fragments._fragments["vllm-2"][1] is not None
    old = weakref.ref(state.target("vllm-2"))
    state.publish(replace(state.target("vllm-2"), scrapes=(("success", 500),)))
    gc.collect()
    assert old() is None
    text = exposition.get(False).decode()  # and the render finds the new view, not a stale text
    assert 'result="success",target="vllm-2",team="t2"} 500.0' in text and samples(text) == samples(whole(state))

"""A cold start judged by what the cache does: the grace ends once the ratio is back at its
level before the restart, or flat at a plateau; ten minutes stay the bound for thin traffic."""
import pytest

from exporter.alerting import rules
from exporter.alerting.deploys import RESTART, WAKE, DeployEvent
from exporter.alerting.warmth import cold_restart, is_warm_after
from exporter.config.sections import load
from exporter.monitor.engine import Engine
from exporter.parse.vllm_metrics import parse

from helpers import CounterPod

START = 50_000.0
STEP = 5.0
GRACE = 600.0


def play(ratio_at, seconds: float, tokens: float = 10000.0, restart_at: float | None = None, before: float = 0.0, step: float = STEP):
    """Polls every `step` s from START - before to START + seconds; the process starts at START
    (and again at START + restart_at). -> (engine, transitions as (seconds after START, alertname, state, cause))."""
    engine = Engine(load({"targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/metrics"}],
                          "global": {"poll_interval": f"{step:g}s"}}))
    pod = CounterPod(START - before - 1.0 if before else START - 1.0)
    seen = []
    t = START - before
    while t <= START + seconds:
        if restart_at is not None and t >= START + restart_at and pod.started < START + restart_at:
            pod = CounterPod(t - 1.0)
        engine.ingest("vllm-0", t, parse(pod.body(ratio_at(t - START), tokens)))
        seen += [(tr.t - START, tr.alert.alertname, tr.state, dict(tr.alert.labels).get("cause")) for tr in engine.evaluate(t)]
        t += step
    return engine, seen


def firing(seen, name=None):
    return [s for s in seen if s[2] == "firing" and (name is None or s[1] == name)]


def test_a_cache_refilled_in_seconds_is_warm_and_a_prompt_change_right_after_pages_within_3_minutes():
    """The real engine's story: warm at 85% a few seconds after the start, the timestamp
    atop the prompt 150 s after it, far inside the ten minutes of the old grace."""
    change = 150.0
    engine, seen = play(lambda s: 0.85 if s < change else 0.03, 400)
    warm = engine.tracks["vllm-0"].view.warm_since
    assert warm is not None and START < warm < START + change
    drop = firing(seen, rules.DROP_AFTER_DEPLOY)
    assert drop and drop[0][0] - change <= 180 and drop[0][3] == "prompt_prefix_change"


@pytest.mark.parametrize("step", [5.0, 30.0])
def test_the_early_incident_is_caught_and_resolves_after_the_fix_at_a_5_s_and_a_30_s_cadence(step):
    """As Prometheus scrapes (30 s) as at our own polls (5 s): warm a minute or two after the
    start, the timestamp caught within 3 minutes, the alert ends once the prompt is fixed."""
    change, fixed = 150.0, 300.0
    engine, seen = play(lambda s: 0.03 if change <= s < fixed else 0.85, 900, tokens=2000.0 * step, step=step)
    drop = [x for x in seen if x[1] == rules.DROP_AFTER_DEPLOY]
    assert [x[2] for x in drop] == ["pending", "firing", "resolved"], seen
    assert drop[1][0] - change <= 180 and drop[1][3] == "prompt_prefix_change"
    assert drop[2][0] > fixed


def test_a_cache_still_climbing_is_cold_and_a_climb_that_stops_ends_the_grace_quietly():
    """A refill that takes minutes (many prefixes) climbs by more than the plateau's 3
    points a minute: cold while it climbs, warm once it levels off, and nothing fires."""
    engine, seen = play(lambda s: min(0.85, s / 400.0), 590)
    assert seen == []
    warm = engine.tracks["vllm-0"].view.warm_since
    assert warm is not None and warm - START >= 340 - 60  # the minute it stopped climbing, not before


def test_back_at_its_level_before_the_restart_is_warm_after_one_span():
    engine, seen = play(lambda s: 0.85, 200, restart_at=0.0, before=600.0)
    restart = max(e.t for e in engine.events if e.is_restart)
    warm = engine.tracks["vllm-0"].view.warm_since
    assert warm is not None and restart <= warm <= restart + 2 * STEP
    assert seen == []


def test_thin_traffic_keeps_the_ten_minute_grace_and_the_grace_stays_the_bound():
    """Too few tokens a minute to tell: cold for the whole grace, as before."""
    engine, seen = play(lambda s: 0.85 if s < 150 else 0.0, 590, tokens=1000.0)
    assert engine.tracks["vllm-0"].view.warm_since is None
    assert firing(seen) == []


def test_a_restart_that_never_refills_is_a_regression_behind_it_reported_before_the_grace_ends():
    """The ratio refilled to 3% against 85% before the restart: flat, so the grace ends and
    the low ratio warns with the restart as its cause's evidence, minutes before 600 s."""
    engine, seen = play(lambda s: 0.85 if s < 0 else 0.03, 420, restart_at=0.0, before=600.0)
    low = firing(seen, rules.HIT_RATE_LOW)
    assert low and low[0][0] < GRACE and low[0][3] == "prompt_prefix_change"


def test_cold_restart_is_the_newest_restart_in_the_grace_unless_seen_warm_since():
    restart = DeployEvent(100.0, "vllm-0", "restart@100", RESTART, "counter reset")
    wake = DeployEvent(300.0, "vllm-0", "wake@300", WAKE, "woke")
    assert cold_restart((restart,), 200.0, GRACE, None) is restart
    assert cold_restart((restart,), 200.0, GRACE, 150.0) is None
    assert cold_restart((restart, wake), 320.0, GRACE, 150.0) is wake  # a newer cold start: cold again
    assert cold_restart((restart,), 100.0 + GRACE + 1, GRACE, None) is None  # the grace is the bound
    assert is_warm_after(restart, 100.0) and not is_warm_after(restart, 99.0) and not is_warm_after(restart, None)

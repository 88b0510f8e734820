import pytest

from exporter.alerting import causes
from exporter.alerting.causes import Evidence
from exporter.config.sections import load
from exporter.alerting.deploys import DeployEvent

NOW = 10_000.0
SETTINGS = load({}).rules.cause_settings()  # the configured look-back and grace, defaults from exporter/config/default_rules.yml


def classify(e: Evidence, s: causes.Settings = SETTINGS) -> tuple[str, str]:
    return causes.classify(e, s)


def ev(source, ago, target="t"):
    return DeployEvent(NOW - ago, target, "v42", source)


def evidence(**kw):
    base = dict(now=NOW, caching_enabled=True, ratio=0.04, ratio_earlier=0.05, baseline=0.88, kv_usage_max=0.2, preemptions=0.0)
    base.update(kw)
    return Evidence(**base)


@pytest.mark.parametrize("kw, cause", [
    pytest.param(dict(caching_enabled=False), causes.CACHING_DISABLED, id="disabled"),
    pytest.param(dict(events=(ev("restart", 60),), ratio=0.4, ratio_earlier=0.2), causes.COLD_START, id="cold-start-climbing"),
    pytest.param(dict(events=(ev("api", 20),)), causes.PROMPT_PREFIX_CHANGE, id="after-a-deploy"),
    pytest.param(dict(events=(ev("change_point", 20),)), causes.PROMPT_PREFIX_CHANGE, id="after-a-change-point"),
    pytest.param(dict(events=(ev("api", 20),), kv_usage_max=0.97), causes.EVICTION_PRESSURE, id="deploy-but-kv-full"),
    pytest.param(dict(kv_usage_max=0.95, ratio=0.3), causes.EVICTION_PRESSURE, id="kv-near-full"),
    pytest.param(dict(preemptions=12.0, ratio=0.3), causes.EVICTION_PRESSURE, id="preemptions"),
    pytest.param(dict(events=(ev("api", 20),), preemptions=1.0, requests=60.0), causes.PROMPT_PREFIX_CHANGE,
                 id="one-preemption-does-not-outrank-a-deploy"),
    pytest.param(dict(events=(ev("api", 20),), preemptions=50.0, requests=60.0), causes.EVICTION_PRESSURE,
                 id="most-requests-preempted-explain-the-drop"),
    pytest.param(dict(preemptions=1.0, requests=200.0, ratio=0.3), causes.UNKNOWN, id="a-stray-preemption-is-no-pressure"),
    pytest.param(dict(ratio=0.33, peer_ratios=(0.31, 0.35)), causes.LOAD_BALANCER_SCATTER, id="fleet-moderate-together"),
    pytest.param(dict(ratio=0.33, peer_ratios=(0.31, 0.85)), causes.UNKNOWN, id="one-replica-alone"),
    pytest.param(dict(ratio=0.33, peer_ratios=(0.31,), peers_had_events=True), causes.UNKNOWN, id="peers-had-deploys"),
    pytest.param(dict(events=(ev("api", 5000),)), causes.UNKNOWN, id="deploy-too-long-ago"),
    # within the 30m event_lookback (causes used to say 900 s of its own, the YAML 30m)
    pytest.param(dict(events=(ev("api", 1200),)), causes.PROMPT_PREFIX_CHANGE, id="deploy-20-minutes-ago"),
    pytest.param(dict(), causes.UNKNOWN, id="nothing-explains-it"),
    pytest.param(dict(events=(ev("api", 20),), ratio=0.56, token_rates=(5900.0, 10500.0), baseline_token_rates=(5800.0, 6500.0)),
                 causes.TRAFFIC_MIX, id="hits-held-queries-grew-after-a-deploy"),
    pytest.param(dict(ratio=0.45, token_rates=(5600.0, 12500.0), baseline_token_rates=(5800.0, 6500.0)),
                 causes.TRAFFIC_MIX, id="hits-held-queries-grew-without-a-deploy"),
    pytest.param(dict(events=(ev("api", 20),), token_rates=(250.0, 10500.0), baseline_token_rates=(5800.0, 6500.0)),
                 causes.PROMPT_PREFIX_CHANGE, id="hits-collapsed-while-queries-grew"),
    pytest.param(dict(events=(ev("api", 20),), ratio=0.6, token_rates=(3900.0, 6500.0), baseline_token_rates=(5800.0, 6500.0)),
                 causes.PROMPT_PREFIX_CHANGE, id="hits-fell-at-the-same-traffic"),
    pytest.param(dict(events=(ev("restart", 60),), token_rates=(5900.0, 10500.0), baseline_token_rates=(5800.0, 6500.0)),
                 causes.COLD_START, id="a-restart-outranks-the-mix"),
    pytest.param(dict(events=(ev("api", 20),), kv_usage_max=0.97, token_rates=(5900.0, 10500.0), baseline_token_rates=(5800.0, 6500.0)),
                 causes.EVICTION_PRESSURE, id="new-traffic-that-fills-the-kv-cache-is-pressure"),
])
def test_classify(kw, cause):
    got, why = classify(evidence(**kw))
    assert got == cause and why


def test_the_look_back_and_grace_are_the_configured_ones_only():
    """causes has no look-back of its own: the deploy 20 minutes ago is after it under a
    30m `rules.event_lookback`, and no longer under a configured 15m."""
    assert SETTINGS == causes.Settings(event_lookback=1800.0, cold_start_grace=600.0)
    short = load({"rules": {"event_lookback": "15m"}}).rules.cause_settings()
    assert classify(evidence(events=(ev("api", 1200),)), short)[0] == causes.UNKNOWN
    with pytest.raises(TypeError):  # the values come from the config, not from here
        causes.Settings()

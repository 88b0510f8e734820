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


# --- causes that are not deploys: a lost tier, a grown fleet, a wake, evicted blocks --------------
def fleet(ago, was=2, now=6, ratio_before=0.56):
    return DeployEvent(NOW - ago, None, f"replicas:{was}->{now}", "replicas", model="m", replicas=(was, now),
                       ratio_before=ratio_before)


TWO_TIERS = (("device", 0.30), ("external", 0.58))


@pytest.mark.parametrize("kw, cause", [
    pytest.param(dict(ratio=0.3, baseline=0.88, tiers=(("device", 0.30), ("external", 0.0)), baseline_tiers=TWO_TIERS),
                 causes.CACHE_TIER_LOST, id="the-connector-stopped-the-gpu-held"),
    pytest.param(dict(ratio=0.3, events=(ev("change_point", 20),), tiers=(("device", 0.30), ("external", 0.0)),
                      baseline_tiers=TWO_TIERS), causes.CACHE_TIER_LOST, id="a-change-point-that-is-a-lost-tier"),
    pytest.param(dict(ratio=0.03, events=(ev("api", 20),), tiers=(("device", 0.02), ("external", 0.01)),
                      baseline_tiers=TWO_TIERS), causes.PROMPT_PREFIX_CHANGE, id="every-tier-fell-a-prompt-change"),
    pytest.param(dict(ratio=0.8, tiers=(("device", 0.30), ("external", 0.5)), baseline_tiers=TWO_TIERS),
                 causes.UNKNOWN, id="a-wobble-of-a-tier-is-no-loss"),
    pytest.param(dict(ratio=0.3, tiers=(("device", 0.3),), baseline_tiers=(("device", 0.85),)),
                 causes.UNKNOWN, id="one-tier-only-is-no-tier-lost"),
    pytest.param(dict(ratio=0.3, events=(fleet(200),), per_request=(700.0, 2580.0), per_request_before_fleet=(1500.0, 2580.0)),
                 causes.REPLICAS_CHANGED, id="more-replicas-fewer-hits-per-request"),
    pytest.param(dict(ratio=0.3, events=(fleet(200),)), causes.REPLICAS_CHANGED, id="a-new-pod-of-the-grown-fleet"),
    pytest.param(dict(ratio=0.03, events=(fleet(200),)), causes.UNKNOWN, id="deeper-than-the-fleet-explains"),
    pytest.param(dict(ratio=0.3, events=(fleet(200),), per_request=(700.0, 5000.0), per_request_before_fleet=(1500.0, 2580.0)),
                 causes.UNKNOWN, id="the-requests-changed-not-only-where-they-go"),
    pytest.param(dict(ratio=0.3, ratio_earlier=0.3, events=(fleet(200, was=6, now=2),)), causes.UNKNOWN,
                 id="fewer-replicas-and-a-fall-that-does-not-refill"),
    pytest.param(dict(ratio=0.3, ratio_earlier=0.2, events=(fleet(200, was=4, now=3, ratio_before=0.93),)),
                 causes.REPLICAS_CHANGED, id="a-scale-in-under-hash-mod-routing-refills"),
    pytest.param(dict(ratio=0.3, ratio_earlier=0.9, events=(fleet(30, was=4, now=3, ratio_before=0.93),)),
                 causes.REPLICAS_CHANGED, id="a-scale-in-still-falling-at-first"),
    pytest.param(dict(ratio=0.3, ratio_earlier=0.9, events=(ev("change_point", 45), fleet(30, was=4, now=3, ratio_before=0.93))),
                 causes.REPLICAS_CHANGED, id="the-change-point-seen-before-the-new-count-is-its-fall"),
    pytest.param(dict(ratio=0.02, ratio_earlier=0.9, events=(fleet(30, was=4, now=3, ratio_before=0.93), ev("api", 20))),
                 causes.PROMPT_PREFIX_CHANGE, id="a-deploy-during-a-scale-in-is-a-deploy"),
    pytest.param(dict(ratio=0.02, ratio_earlier=0.9, events=(ev("change_point", 40), fleet(30, was=4, now=3, ratio_before=0.93))),
                 causes.PROMPT_PREFIX_CHANGE, id="a-collapse-at-a-scale-in-is-no-refill"),
    pytest.param(dict(ratio=0.02, ratio_earlier=0.02, events=(ev("change_point", 240), fleet(200, was=3, now=4, ratio_before=0.93))),
                 causes.PROMPT_PREFIX_CHANGE, id="flat-near-zero-after-the-grace-is-no-refill"),
    pytest.param(dict(ratio=0.03, events=(fleet(600), ev("api", 20))), causes.PROMPT_PREFIX_CHANGE,
                 id="a-deploy-after-the-scale-out-is-a-deploy"),
    pytest.param(dict(ratio=0.3, events=(fleet(200),), kv_usage_max=0.97), causes.EVICTION_PRESSURE,
                 id="a-full-kv-cache-is-pressure-whatever-the-fleet"),
    pytest.param(dict(ratio=0.3, evicted_before_reuse=True), causes.EVICTION_PRESSURE, id="blocks-evicted-before-reuse"),
    pytest.param(dict(events=(ev("api", 20),), evicted_before_reuse=True), causes.PROMPT_PREFIX_CHANGE,
                 id="residency-alone-never-outranks-a-deploy"),
    pytest.param(dict(events=(ev("wake", 60),), ratio=0.4, ratio_earlier=0.2), causes.COLD_START, id="a-wake-is-a-cold-start"),
])
def test_classify_the_causes_that_are_not_deploys(kw, cause):
    got, why = classify(evidence(**kw))
    assert got == cause and why


def test_a_lost_tier_names_itself_and_its_shares():
    _, why = classify(evidence(ratio=0.3, tiers=(("device", 0.30), ("external", 0.0)), baseline_tiers=TWO_TIERS))
    assert why.startswith("the external cache tier served 58% of prompt tokens and serves 0% now, while the others hold "
                          "(device 30%): it carried 66% of the cached tokens")


def test_a_grown_fleet_says_when_and_what_routing_gets_it_back():
    _, why = classify(evidence(ratio=0.3, events=(fleet(200),)))
    assert "6 replicas since" in why and "(was 2)" in why and "the model hit 56% before" in why
    assert "prefix-hash or session-affinity routing" in why and "whatif --routing" in why


def test_a_shrunk_fleet_says_which_prefixes_moved_and_that_they_refill():
    _, why = classify(evidence(ratio=0.3, ratio_earlier=0.2, events=(fleet(200, was=4, now=3, ratio_before=0.93),)))
    assert "3 replicas since" in why and "(was 4)" in why and "the model hit 93% before" in why
    assert "replicas that left" in why and "refill" in why and "consistent hashing" in why


def test_a_lost_tier_says_how_much_of_the_cache_it_carried():
    """No cause changes a severity (one alert name, one severity): a tier whose loss
    takes the ratio the drop rule's distance down pages as the drop, a smaller one warns."""
    minor = evidence(ratio=0.7, tiers=(("device", 0.70), ("external", 0.0)), baseline_tiers=(("device", 0.70), ("external", 0.18)))
    got, why = classify(minor)
    assert got == causes.CACHE_TIER_LOST and "it carried 20% of the cached tokens" in why


def test_a_traffic_mix_needs_enough_requests_to_be_more_than_chance():
    rates = dict(ratio=0.45, token_rates=(5600.0, 12500.0), baseline_token_rates=(5800.0, 6500.0))
    assert classify(evidence(**rates, requests=300.0))[0] == causes.TRAFFIC_MIX
    assert classify(evidence(**rates, requests=40.0))[0] == causes.UNKNOWN


def test_a_scale_out_seen_in_steps_is_one_change_from_the_first_count():
    steps = (fleet(300, was=2, now=4, ratio_before=0.56), fleet(280, was=4, now=6, ratio_before=0.40))
    got, why = classify(evidence(ratio=0.3, events=steps))
    assert got == causes.REPLICAS_CHANGED and "(was 2)" in why and "the model hit 56% before" in why
    assert classify(evidence(ratio=0.3, events=(fleet(300, was=6, now=2), fleet(280, was=2, now=6))))[0] == causes.UNKNOWN


# --- first-hand: vLLM's KV cache events (exporter/series/blockindex.py) ---------------------------
def kv_view(recent: dict, earlier: dict | None = None, cleared_at=None, last=NOW - 1, text="token 13 changes: `time: 17:4`"):
    from exporter.series.blockindex import Counts, KVView, Window

    window = lambda counts, since, secs, cleared=None: Window(since, secs, Counts(**counts), cleared, None, {})
    return KVView("tcp://10.0.0.5:5557", connected=True, last_message=last, received=100,
                  recent=window(recent, NOW - 60, 60.0, cleared_at),
                  earlier=window(earlier or {}, NOW - 660, 600.0), divergence_text=text)


def test_events_of_a_value_changing_per_request_name_a_prompt_change_with_its_tokens_even_without_a_deploy():
    cause, why = classify(evidence(kv=kv_view(dict(stores=60, new_first=58, volatile=58, blocks=60)), requests=61))
    assert cause == causes.PROMPT_PREFIX_CHANGE
    assert "58 of the 61 requests" in why and "token 13 changes: `time: 17:4`" in why


def test_a_client_that_always_sent_a_timestamp_is_usual_not_a_change():
    usual = kv_view(dict(stores=20, volatile=20, blocks=20), earlier=dict(stores=200, volatile=200, blocks=200))
    assert classify(evidence(kv=usual))[0] == causes.UNKNOWN  # nothing else points anywhere either


def test_blocks_stored_again_soon_after_their_removal_outrank_a_deploy():
    kv = kv_view(dict(stores=40, volatile=0, blocks=120, restored=50))
    cause, why = classify(evidence(kv=kv, events=(ev("api", 20),)))
    assert cause == causes.EVICTION_PRESSURE and "50 of the 120 blocks" in why


def test_a_clear_of_the_whole_cache_is_a_reset_never_a_prompt_change():
    kv = kv_view(dict(stores=60, new_first=60, volatile=60, blocks=60, clears=1), cleared_at=NOW - 30)
    cause, why = classify(evidence(kv=kv))
    assert cause == causes.COLD_START and "cleared 30s ago" in why
    assert classify(evidence(kv=kv, warm_since=NOW - 5))[0] == causes.PROMPT_PREFIX_CHANGE  # refilled since: judged again


def test_a_silent_publisher_is_no_evidence_and_the_inference_stands():
    silent = kv_view(dict(stores=60, volatile=0, blocks=600, restored=300), last=NOW - 600)
    assert classify(evidence(kv=silent, events=(ev("api", 20),)))[0] == causes.PROMPT_PREFIX_CHANGE
    assert classify(evidence(kv=None, events=(ev("api", 20),)))[0] == causes.PROMPT_PREFIX_CHANGE

"""The replica count of each model: established over two evaluations, and its changes as events."""
from exporter.alerting.deploys import REPLICAS
from exporter.config.sections import Target
from exporter.monitor.fleetsize import ReplicaCounts, fleet_ratios
from exporter.monitor.targetview import TargetView


M = ("m", ())  # model "m" of targets without scope labels


def views(*names):
    return {n: TargetView(Target(n, f"http://127.0.0.1:1/{n}")) for n in names}


def test_the_first_count_is_no_change_and_a_wobble_of_one_evaluation_is_none_either():
    counts = ReplicaCounts()
    two = {M: ["a", "b"]}
    assert counts.changes(0.0, two, views("a", "b"), 300.0) == []
    assert counts.changes(5.0, two, views("a", "b"), 300.0) == []
    assert counts.changes(10.0, {M: ["a"]}, views("a"), 300.0) == []  # seen once
    assert counts.changes(15.0, two, views("a", "b"), 300.0) == []  # back: no event


def test_a_count_seen_twice_is_an_event_of_the_model_dated_when_it_was_first_seen_in_either_direction():
    counts = ReplicaCounts()
    for t in (0.0, 5.0):
        counts.changes(t, {M: ["a", "b"]}, views("a", "b"), 300.0)
    counts.changes(10.0, {M: ["a", "b", "c"]}, views("a", "b", "c"), 300.0)
    [grew] = counts.changes(15.0, {M: ["a", "b", "c"]}, views("a", "b", "c"), 300.0)
    assert (grew.source, grew.t, grew.model, grew.replicas, grew.target) == (REPLICAS, 10.0, "m", (2, 3), None)
    counts.changes(20.0, {M: ["a"]}, views("a"), 300.0)
    [shrank] = counts.changes(25.0, {M: ["a"]}, views("a"), 300.0)
    assert shrank.replicas == (3, 1) and shrank.ratio_before is None  # no history in these views


def test_a_model_gone_starts_afresh():
    counts = ReplicaCounts()
    for t in (0.0, 5.0):
        counts.changes(t, {M: ["a"]}, views("a"), 300.0)
    counts.changes(10.0, {}, {}, 300.0)
    assert counts.counts == {}
    assert counts.changes(15.0, {M: ["a", "b"]}, views("a", "b"), 300.0) == []


PROD, STAGING = (("namespace", "prod"), ("owner", "vllm")), (("namespace", "staging"), ("owner", "vllm"))


def test_staging_scaling_up_is_an_event_of_staging_s_replicas_only():
    """Counted by model alone, staging's third replica was an event of prod's replicas too:
    it explained their drops (replicas_changed) and kept their change point quiet."""
    counts = ReplicaCounts()
    for t in (0.0, 5.0):
        counts.changes(t, {("m", PROD): ["p1", "p2"], ("m", STAGING): ["s1"]}, views("p1", "p2", "s1"), 300.0)
    grown = {("m", PROD): ["p1", "p2"], ("m", STAGING): ["s1", "s2"]}
    counts.changes(10.0, grown, views("p1", "p2", "s1", "s2"), 300.0)
    [grew] = counts.changes(15.0, grown, views("p1", "p2", "s1", "s2"), 300.0)
    assert (grew.model, grew.scope, grew.replicas) == ("m", STAGING, (1, 2)) and "in namespace=staging,owner=vllm" in grew.description
    assert grew.concerns("m", STAGING) and not grew.concerns("m", PROD) and not grew.concerns("n", STAGING)
    assert grew.to_json()["scope"] == {"namespace": "staging", "owner": "vllm"}


def test_a_replica_s_peers_are_those_of_its_scope():
    from test_analysis import ws
    from dataclasses import replace
    by_name = views("p1", "p2", "s1")
    ratios = {"p1": 0.88, "p2": 0.9, "s1": 0.6}
    for name, view in by_name.items():
        by_name[name] = replace(view, stats={"m": {"5m": ws(ratios[name] * 100_000, 100_000)}})
    got = fleet_ratios(by_name, {"p1": PROD, "p2": PROD, "s1": STAGING}, "5m")
    assert got == {("m", PROD): [("p1", 0.88), ("p2", 0.9)], ("m", STAGING): [("s1", 0.6)]}
    assert fleet_ratios(by_name, {"p1": PROD, "p2": PROD, "s1": STAGING}, None) == {}

"""The replica count of each model: established over two evaluations, and its changes as events."""
from exporter.alerting.deploys import REPLICAS
from exporter.config.sections import Target
from exporter.monitor.fleetsize import ReplicaCounts
from exporter.monitor.targetview import TargetView


def views(*names):
    return {n: TargetView(Target(n, f"http://127.0.0.1:1/{n}")) for n in names}


def test_the_first_count_is_no_change_and_a_wobble_of_one_evaluation_is_none_either():
    counts = ReplicaCounts()
    two = {"m": ["a", "b"]}
    assert counts.changes(0.0, two, views("a", "b"), 300.0) == []
    assert counts.changes(5.0, two, views("a", "b"), 300.0) == []
    assert counts.changes(10.0, {"m": ["a"]}, views("a"), 300.0) == []  # seen once
    assert counts.changes(15.0, two, views("a", "b"), 300.0) == []  # back: no event


def test_a_count_seen_twice_is_an_event_of_the_model_dated_when_it_was_first_seen_in_either_direction():
    counts = ReplicaCounts()
    for t in (0.0, 5.0):
        counts.changes(t, {"m": ["a", "b"]}, views("a", "b"), 300.0)
    counts.changes(10.0, {"m": ["a", "b", "c"]}, views("a", "b", "c"), 300.0)
    [grew] = counts.changes(15.0, {"m": ["a", "b", "c"]}, views("a", "b", "c"), 300.0)
    assert (grew.source, grew.t, grew.model, grew.replicas, grew.target) == (REPLICAS, 10.0, "m", (2, 3), None)
    counts.changes(20.0, {"m": ["a"]}, views("a"), 300.0)
    [shrank] = counts.changes(25.0, {"m": ["a"]}, views("a"), 300.0)
    assert shrank.replicas == (3, 1) and shrank.ratio_before is None  # no history in these views


def test_a_model_gone_starts_afresh():
    counts = ReplicaCounts()
    for t in (0.0, 5.0):
        counts.changes(t, {"m": ["a"]}, views("a"), 300.0)
    counts.changes(10.0, {}, {}, 300.0)
    assert counts.counts == {}
    assert counts.changes(15.0, {"m": ["a", "b"]}, views("a", "b"), 300.0) == []

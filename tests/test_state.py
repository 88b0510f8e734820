"""The published state: typed fields, one consistent reading, views that only move forward."""
import pytest

from exporter.config.sections import Target
from exporter.serve.state import Counters, Deploys, Published, State
from exporter.monitor.targetview import TargetView


def test_a_misspelled_field_fails_loudly_instead_of_reading_as_empty():
    """A string-keyed bag read with `or {}` turned a typo into metrics silently gone."""
    state = State()
    with pytest.raises(AttributeError):
        state.published.alertz  # noqa: B018 - the read itself must fail
    with pytest.raises(TypeError):
        state.update(alertz=())
    with pytest.raises(TypeError):
        state.count(clock_step_back=1)
    assert state.published == Published()  # nothing half-applied


def test_counters_and_fields_are_replaced_whole():
    state = State()
    before = state.published
    state.count(clock_steps_back=1)
    state.count(clock_steps_back=2, collect_errors=1)
    state.update(config_reload_success=False)
    assert state.published.counters == Counters(collect_errors=1, clock_steps_back=3)
    assert state.published.config_reload_success is False
    assert before == Published()  # an earlier reading never changes under its reader


def test_a_reading_is_one_moment_of_the_views_and_the_rest():
    state = State()
    a, b = Target("a", "http://127.0.0.1:1/a"), Target("b", "http://127.0.0.1:1/b")
    state.set_targets([TargetView(a), TargetView(b)])
    state.update(alerts=())
    reading = state.read()
    state.publish(TargetView(a, up=True, polled=True))
    state.update(alerts=None, deploys=Deploys(({"t": 1.0},), {"a": {"api": 1}}, {"a": 1.0}))
    assert [(v.target.name, v.up) for v in reading.targets] == [("a", False), ("b", False)]
    assert reading.published.alerts == () and reading.published.deploys is None and not reading.ready()
    assert state.read().generation > reading.generation
    assert state.published.deploys.to_json() == {"recent": [{"t": 1.0}], "counts": {"a": {"api": 1}}, "last": {"a": 1.0}}


def test_a_view_of_a_target_no_longer_installed_stays_out():
    """A poll that finishes after a reload removed its target publishes into nothing."""
    state = State()
    a = Target("a", "http://127.0.0.1:1/a")
    state.set_targets([TargetView(a)])
    state.set_targets([])
    state.publish(TargetView(a, up=True, polled=True))
    assert state.targets() == [] and state.ready()


def test_the_installed_target_wins_over_the_one_a_poll_started_with():
    state = State()
    old, new = Target("a", "http://127.0.0.1:1/a", (("team", "old"),)), Target("a", "http://127.0.0.1:1/a", (("team", "new"),))
    state.set_targets([TargetView(old)])
    state.set_targets([TargetView(new)])
    state.publish(TargetView(old, up=True, polled=True))
    assert state.target("a").target is new and state.target("a").up

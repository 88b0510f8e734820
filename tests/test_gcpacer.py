"""The cycle collector's collections at moments without scrapes (exporter/serve/gcpacer.py):
the generation the collector would pick, only in a pause of the scrapes, nothing while the
collector is off, and the thread that looks."""
import gc

import pytest
from prometheus_client import CollectorRegistry

from exporter.serve.collector import PrefixCacheCollector
from exporter.serve.exposition import Exposition
from exporter.serve.gcpacer import CollectionPacer, generation_due
from exporter.serve.state import State

from conftest import wait_for

THRESHOLDS = (50_000, 20, 20)  # the sidecar's (sidecar.GC_THRESHOLDS)


@pytest.mark.parametrize("counts, due", [
    ((0, 0, 0), None),
    ((24_999, 25, 25), None),  # under half the young threshold: nothing, whatever the older counts
    ((25_000, 0, 0), 0),
    ((49_000, 20, 20), 0),  # at a threshold is not past it, as the collector counts
    ((30_000, 21, 3), 1),
    ((30_000, 21, 19), 1),  # the oldest generation past its threshold, as the collector picks
    ((30_000, 21, 21), None),  # a full collection may be due: the collector's rule decides, which counts
    ((30_000, 5, 21), None),  # long-lived objects pending that Python does not show
])
def test_the_generation_due_is_the_one_the_collector_would_pick(counts, due):
    assert generation_due(counts, THRESHOLDS, 0.5) == due


def test_a_young_threshold_of_zero_is_a_collector_turned_off():
    assert generation_due((10**6, 99, 99), (0, 20, 20), 0.5) is None


class Fakes:
    def __init__(self, quiet_for=0.05, counts=(30_000, 3, 3), enabled=True):  # right after a scrape
        self.quiet, self.counts, self.enabled, self.collected = quiet_for, counts, enabled, []

    def pacer(self, **kwargs) -> CollectionPacer:
        return CollectionPacer(lambda: self.quiet, collect=self.collected.append, counts=lambda: self.counts,
                               thresholds=lambda: THRESHOLDS, enabled=lambda: self.enabled, **kwargs)


def test_it_collects_only_when_the_scrapes_pause_and_the_collector_is_on():
    fakes = Fakes(quiet_for=0.005)
    pacer = fakes.pacer(quiet=0.02)
    assert pacer.step() is None and fakes.collected == []  # a scrape 5 ms ago: a burst may be under way
    fakes.quiet = 0.05
    assert pacer.step() == 0 and fakes.collected == [0]
    fakes.counts = (30_000, 21, 3)
    assert pacer.step() == 1 and fakes.collected == [0, 1]
    fakes.enabled = False  # a Prometheus read decoding its answer turned it off: not now
    assert pacer.step() is None and fakes.collected == [0, 1]
    fakes.enabled, fakes.counts = True, (100, 0, 0)
    assert pacer.step() is None and pacer.collections == 2


def test_its_thread_looks_until_stopped_and_a_failure_leaves_the_collector_alone(caplog):
    fakes = Fakes()
    pacer = fakes.pacer(every=0.01).start()
    assert wait_for(lambda: len(fakes.collected) >= 3, timeout=10.0, step=0.01)
    pacer.stop()
    pacer._thread.join(5.0)
    assert not pacer._thread.is_alive()

    broken = CollectionPacer(lambda: 1.0, every=0.01, counts=lambda: 1 / 0).start()
    broken._thread.join(5.0)
    assert not broken._thread.is_alive() and "gc pacer failed" in caplog.text
    assert gc.isenabled()


def test_the_real_collector_runs_the_collection_it_is_asked_for():
    was = gc.get_count()
    # the real collector and counts; thresholds under which only the young generation is ever due,
    # whatever this process's older counts (the suite's collector has Python's default thresholds)
    pacer = CollectionPacer(lambda: 1.0, share=0.0, late_share=0.0, thresholds=lambda: (1, 10**9, 10**9))
    generation = pacer.step()
    assert generation == 0 and pacer.collections == 1
    assert gc.get_count()[0] <= max(was[0], 50)  # the young generation was just collected


def test_the_exposition_says_how_long_since_a_scrape_got_its_answer():
    state = State()
    now = [100.0]
    exposition = Exposition(state, CollectorRegistry(), clock=lambda: now[0], collector=PrefixCacheCollector(state, ["1m"]))
    assert exposition.quiet_for() > 10**6  # never scraped
    exposition.get(False)
    now[0] = 100.25
    assert exposition.quiet_for() == pytest.approx(0.25)


def test_right_after_a_scrape_it_collects_sooner_than_at_any_other_moment():
    """Scrapers every few seconds: the moment right after one (`window`) is the furthest
    from the next, so a collection due by `share` runs there; elsewhere it waits for
    `late_share` of the threshold."""
    fakes = Fakes(counts=(30_000, 0, 0))  # 60% of the way to the young threshold
    pacer = fakes.pacer(quiet=0.02, window=0.1, late_share=0.9)
    fakes.quiet = 0.5  # long after the last scrape
    assert pacer.step() is None
    fakes.quiet = 0.05  # right after one
    assert pacer.step() == 0
    fakes.quiet, fakes.counts = 3.0, (46_000, 0, 0)  # no scrape for long, and 92% of the way
    assert pacer.step() == 0 and fakes.collected == [0, 0]


def test_it_runs_only_where_the_collector_is_cpythons_generational_one():
    import sys

    from exporter.serve.gcpacer import supported

    assert supported() == (sys.implementation.name == "cpython" and sys.version_info < (3, 14))

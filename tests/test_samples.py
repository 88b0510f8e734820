"""A history's samples kept as columns (exporter/series/samples.py): a view is the samples
as they were when it was taken, whatever the History appends and thins afterwards (a
render or the status page reads it from another thread), and reads as the sequence of
TargetSamples it replaced: index, iterate, runs of one layout."""
import gc
import math
from array import array
from weakref import WeakValueDictionary

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.parse.vllm_metrics import parse
from exporter.series.history import History
from exporter.series.samples import Samples, TargetSample


def body(t: float, models=("m",)) -> str:
    lines = []
    for m in models:
        labels = f'engine="0",model_name="{m}"'
        lines += [f"vllm:prefix_cache_queries_total{{{labels}}} {100.0 * t}", f"vllm:prefix_cache_hits_total{{{labels}}} {40.0 * t}",
                  f'vllm:time_to_first_token_seconds_bucket{{{labels},le="0.5"}} {t}',
                  f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {2 * t}',
                  f"vllm:time_to_first_token_seconds_count{{{labels}}} {2 * t}", f"vllm:time_to_first_token_seconds_sum{{{labels}}} {t}"]
    return "\n".join(lines) + "\n"


def copy(view: Samples) -> list[tuple]:
    return [(s.t, s.layout, list(s.values)) for s in view]


def same(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and x[1] is y[1] and [v for v in x[2] if v == v] == [v for v in y[2] if v == v]
                                    for x, y in zip(a, b))


def test_a_view_stays_what_it_was_while_the_history_appends_thins_and_changes_layout():
    history = History(3600.0, 300.0, windows=(60.0, 3600.0), mid_seconds=900.0, mid_step=30.0)
    views = []
    for k in range(400):
        t = 15.0 * k
        models = ("m",) if k < 150 or k >= 300 else ("m", "n")  # a model comes and goes: three layouts
        history.append(t, parse(body(t, models)))
        if k % 37 == 0:
            view = history.samples()
            views.append((view, copy(view), list(view.times)))
    for view, seen, times in views:
        assert same(copy(view), seen) and list(view.times) == times
    last = history.samples()
    # an hour, thinned: the two models' layout and the last one's; the first one's samples gone, its
    # layout the last one's again (one object while anything holds it: here the first view)
    layouts = [r[0] for r in last.runs()]
    assert len(last) < 100 and len(layouts) == 2 and layouts[0].keys == (("m", "0"), ("n", "0")) and layouts[1] is last[-1].layout
    assert views[0][0][0].layout is layouts[1] and layouts[1].keys == (("m", "0"),)


def test_histories_given_one_mapping_share_a_layout_while_one_holds_it():
    """A fleet's pods have one layout: one object for all of them (some 2 KB a target each),
    which leaves the mapping once no history or view holds it."""
    layouts = WeakValueDictionary()
    a, b = (History(3600.0, 300.0, layouts=layouts) for _ in range(2))
    a.append(0.0, parse(body(0.0, ("m",))))
    b.append(0.0, parse(body(0.0, ("m",))))
    b.append(15.0, parse(body(15.0, ("m", "n"))))
    assert a.samples()[0].layout is b.samples()[0].layout and len(layouts) == 2
    assert b.samples()[1].layout is not a.samples()[0].layout and len(b.samples()[1].layout.keys) == 2
    del a, b
    gc.collect()
    assert len(layouts) == 0


def test_a_view_reads_as_the_samples_it_was_made_of():
    history = History(600.0)
    for k in range(30):
        history.append(10.0 * k, parse(body(10.0 * k, ("m",) if k < 20 else ("m", "n"))))
    view = history.samples()
    rebuilt = Samples(tuple(view), view.logs, view.running)
    assert same(copy(rebuilt), copy(view)) and list(rebuilt.times) == list(view.times)
    assert rebuilt.runs() == view.runs() and [(a, b) for _, a, b in view.runs()] == [(0, 19), (20, 29)]
    assert view[-1].t == view[len(view) - 1].t == 290.0 and [s.t for s in view[28:]] == [280.0, 290.0]
    assert view[5].get(("m", "0"), "queries") == 5000.0 and view[25].get(("n", "0"), "hits") == 40.0 * 250
    assert view[5].get(("n", "0"), "hits") is None and view[25].buckets(("m", "0")) == ((0.5, math.inf), [250.0, 500.0])
    with pytest.raises(IndexError):
        view[30]
    empty = Samples(())
    assert len(empty) == 0 and list(empty) == [] and empty.runs() == [] and list(empty.times) == []


def reference_thinning(times: list[float], now: float, keep: float, fine: float, mid: float, mid_step: float,
                       coarse_step: float, far: float = math.inf, far_step: float = 0.0) -> list[float]:
    """The thinning as it was written over a deque of sample objects, one append at a time
    (and the far tier, beyond `far` seconds of age, in the same way)."""
    from collections import deque

    samples = deque(times)
    horizon = now - keep
    while len(samples) > 2 and samples[1] <= horizon:
        samples.popleft()
    edge = now - fine
    if len(samples) >= 3 and samples[1] <= edge:
        kept: list[float] = []
        while len(samples) > 1 and samples[0] <= edge:
            s = samples.popleft()
            step = mid_step if now - s <= mid else coarse_step if now - s <= far else far_step
            if not kept or s - kept[-1] >= step or samples[0] > edge:
                kept.append(s)
        samples.extendleft(reversed(kept))
    return list(samples)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([5.0, 15.0, 0.7, 90.0]), st.floats(min_value=0.5, max_value=40.0)), min_size=1, max_size=300),
       st.sampled_from([  # ..., far_seconds, windows: the far edge and step they give
           (600.0, 120.0, 300.0, 20.0, 45.0, math.inf, (), math.inf, 0.0), (3615.0, 300.0, 900.0, 30.0, 60.0, math.inf, (), math.inf, 0.0),
           (300.0, 300.0, 0.0, 0.0, 60.0, math.inf, (), math.inf, 0.0),
           (3615.0, 300.0, 900.0, 30.0, 60.0, 2100.0, (300.0, 3600.0), 2160.0, 120.0),
           (3615.0, 300.0, 900.0, 30.0, 60.0, 1200.0, (300.0, 2400.0, 3600.0), 1260.0, 80.0),
           (1200.0, 60.0, 240.0, 10.0, 30.0, 400.0, (1200.0,), 430.0, 40.0), (900.0, 100.0, 0.0, 0.0, 20.0, 200.0, (900.0,), 220.0, 30.0)]))
def test_the_columns_keep_the_samples_the_thinning_kept_sample_by_sample(gaps, settings_):
    keep, fine, mid, mid_step, coarse_step, far, windows, far_edge, far_step = settings_
    history = History(keep, fine, coarse_step=coarse_step, mid_seconds=mid, mid_step=mid_step, windows=windows, far_seconds=far)
    expected: list[float] = []
    t = 0.0
    for gap in gaps:
        t += gap
        history.append(t, parse(body(t)))
        expected = reference_thinning(expected + [t], t, keep, history.fine_seconds, mid, mid_step, coarse_step, far_edge,
                                      far_step)
        assert list(history.samples().times) == expected
    view = history.samples()
    assert [s.get(("m", "0"), "queries") for s in view] == [100.0 * x for x in expected]


def test_a_target_sample_is_its_values_at_its_layout():
    history = History(60.0)
    sample = history.append(1.0, parse(body(1.0)))
    assert isinstance(sample, TargetSample) and isinstance(sample.values, array) and len(sample.values) == sample.layout.size


def test_the_samples_of_a_target_with_no_series_are_kept_and_thinned_too():
    """A router's /metrics has no engine series: its samples have no values, and are still
    samples (their times are the windows' edges)."""
    history = History(600.0, 120.0, coarse_step=60.0)
    for k in range(100):
        history.append(15.0 * k, parse("router_requests_total 1\n"))
    view = history.samples()
    assert 10 < len(view) < 100 and view[0].layout.size == 0 and list(view[0].values) == []
    assert view.times[-1] == 15.0 * 99 and view.runs() == [(view[0].layout, 0, len(view) - 1)]

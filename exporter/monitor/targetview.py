"""One target as everything downstream sees it: the one immutable view per target.

The engine's Track holds the latest one and the poll that computed it publishes that
very object to the state (exporter/serve/state.py), where the collector, the HTTP APIs and
the status page read it; the rules read the same object off the Track. Never changed
in place: a poll replaces it whole, so a reader on another thread always sees one
consistent poll.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..config.sections import Target
from ..parse.snapshot import Snapshot
from ..series.blockindex import KVView
from ..series.samples import Samples
from ..series.window import WindowStats


# A poll's result, the `result` label of prefixcache_scrapes_total: how the GET went
# (exporter/poll/scrape.py), or what became of a body that arrived
SUCCESS = "success"
TIMEOUT = "timeout"
CONNECTION_ERROR = "connection_error"
HTTP_ERROR = "http_error"
TOO_LARGE = "too_large"
DECODE_ERROR = "decode_error"
NO_VLLM_METRICS = "no_vllm_metrics"
LIMIT_EXCEEDED = "limit_exceeded"
INTERNAL_ERROR = "internal_error"
STALE = "stale"  # read from a Prometheus: no sample of the target newer than discovery.read_prometheus.stale_after
POLL_RESULTS = (SUCCESS, TIMEOUT, CONNECTION_ERROR, HTTP_ERROR, TOO_LARGE, DECODE_ERROR, NO_VLLM_METRICS, LIMIT_EXCEEDED, INTERNAL_ERROR,
                STALE)


@dataclass(frozen=True)
class TargetView:
    target: Target
    # what the engine made of the polls (the rules read these)
    samples: Samples = field(default_factory=lambda: Samples(()))  # the history at this poll: the status page draws from it
    stats: dict[str, dict[str, WindowStats]] = field(default_factory=dict)  # model -> window -> stats, of `samples`
    snapshot: Snapshot | None = None  # the last body that parsed, with what ingesting it refused
    up: bool = False
    down_since: float | None = None
    ever_up: bool = False
    last_t: float | None = None  # the last poll that entered the history
    since: float | None = None  # the first successful poll
    samples_kept: int = 0
    warm_since: float | None = None  # the newest restart's cache seen warm from this time on (alerting/warmth.py)
    kv: KVView | None = None  # its KV cache events at this poll, where it publishes them (poll/kvsource.py)
    # how the polls went (the poller's part)
    polled: bool = False
    last_result: str | None = None  # one of POLL_RESULTS
    last_error: str | None = None
    last_scrape_time: float | None = None
    last_success_time: float | None = None
    scrape_duration: float | None = None
    scrapes: tuple[tuple[str, int], ...] = ()  # result -> count, cumulative
    rejected: tuple[tuple[str, int], ...] = ()  # reason -> samples the parser refused, cumulative

    def evolve(self, **changes) -> TargetView:
        """dataclasses.replace(self, **changes), at the cost of copying a dict: every poll of
        every target makes two (replace's per-field __init__ took 10-15 us each of a
        10,000-pod read's 400 us a pod). The view has no __post_init__ to run."""
        unknown = changes.keys() - _FIELDS
        if unknown:
            raise TypeError(f"TargetView has no field {sorted(unknown)[0]!r}")
        view = object.__new__(TargetView)
        view.__dict__.update(self.__dict__)
        view.__dict__.update(changes)
        return view


_FIELDS = frozenset(TargetView.__dataclass_fields__)


def count(counts: tuple[tuple[str, int], ...], key: str, n: int = 1) -> tuple[tuple[str, int], ...]:
    """`counts` with `key` raised by `n`: the views' cumulative counters stay immutable tuples."""
    out = dict(counts)
    out[key] = out.get(key, 0) + n
    return tuple(sorted(out.items()))


def add(total: tuple[tuple[str, int], ...], more: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    for key, n in more:
        total = count(total, key, n)
    return total

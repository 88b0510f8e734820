"""The Prometheus source (central mode at fleet size): the engines' samples read from the
Prometheus that already scrapes every pod, instead of scraping each pod again.

Every poll_interval one query (exporter/discovery/promseries.py) returns the raw samples
since the last read (with a margin for scrapes Prometheus commits late, and further back
where a store commits every scrape late; a pod's samples already read are left out).
Each pod found is a target, sharded as discovered ones are;
each of its samples goes through the scrape path's parser and the same engine
(TargetPoller.ingest), at the time Prometheus scraped it, so the windows, rules, causes,
versions and the gate are the scrape path's, at the resolution of Prometheus's scrape
interval. A pod with no sample newer than `stale_after` is down (its series stopped), not
frozen; one with none for discovery.accept_empty_after is forgotten.

The query has one deadline (name resolution included) and a size cap; it runs on its
own thread, so a slow Prometheus delays the next read, never a poll or SIGTERM.
"""
from __future__ import annotations

import gc
import logging
import math
import statistics
import time
from collections import Counter
from dataclasses import replace

from ..config.discovery import DiscoveryConfig
from ..config.sections import Target
from ..discovery import promseries
from ..monitor.targetview import STALE
from ..discovery.answercost import decoded_budget
from ..discovery.targets import DiscoveryError, Limits, SourceState, limits_log, over_limits, settle
from ..peers.promapi import PrometheusAPI, PrometheusAPIError
from ..peers.urls import redact_url

log = logging.getLogger(__name__)

READ_PROMETHEUS = "read_prometheus"
# what the status page and the start's log line say where no Prometheus is read
SCRAPED_SINCE_START = ("Samples scraped by this process since its start: nothing before it is known, so a drop under way "
                       "before it is judged only against what was scraped since (discovery.read_prometheus reads back what "
                       "the rules need from Prometheus).")
MARGIN = 30.0  # seconds a read reaches past the last one at least: scrapes that ended late are committed late
MAX_RANGE = 300.0  # at most this far back after a failure (the first read reaches back what the rules need)
MAX_OUTAGES = 16  # failing stretches of the source kept (those within accept_empty_after; beyond, the closest merge)
UP_QUERY_PODS = 200  # pods named in one query of their `up` (a rollout's stale pods, asked in chunks)
FULL_COLLECTION_EVERY = 40  # reads between two full collections, in a process that freezes each read (10 minutes at 15 s)
# a range selector answers no sample after its evaluation time; the time we send is cut to
# the millisecond: a sample later than that by more than this slack is refused
FUTURE_SLACK = 1.0


class PrometheusReader:
    def __init__(self, cfg: DiscoveryConfig, poll_interval: float, read_back: float = MAX_RANGE, stepped: float = 0.0):
        read = cfg.read_prometheus
        assert read is not None
        self.cfg = cfg
        self.read = read
        self.poll_interval = poll_interval
        # how far the first read (and the first after a reload that selects otherwise) reaches:
        # what the rules look back on (Config.anchored_seconds), so that a restart of ours in
        # the middle of an incident judges it against the baseline from before it, from the
        # history Prometheus holds, instead of resolving the page
        self.read_back = max(read_back, MAX_RANGE)
        # the last this many seconds of a read back are read and evaluated a poll_interval at
        # a time, as the live rules ran: the longest `for` or keep_firing_for of a rule
        self.stepped = stepped
        self.backfilling = False  # a read back is being stepped through: the live evaluation waits
        self.limits = Limits(cfg.target_limit, cfg.label_limit, cfg.label_value_length_limit)
        self.api = PrometheusAPI(read.url, read.timeout, read.bearer_token, read.username, read.password,
                                 max_answer=read.max_answer, compressed=read.compression == "gzip")
        self.where = redact_url(self.api.base_url + "/api/v1/query")
        self.source_url = redact_url(self.api.base_url)
        self.last_read: float | None = None
        self.newest: dict[str, float] = {}  # pod -> its newest sample read
        self.gap: dict[str, float] = {}  # pod -> the last interval between two of its samples
        self.targets: dict[str, Target] = {}  # pod -> its target, while not forgotten
        self.memo = promseries.PodMemo()  # pod -> its series as the last answer had them
        self.learnt: dict[str, tuple[dict, Target, Counter]] = {}  # pod -> (its labels, its target, the labels dropped)
        self.state = SourceState(READ_PROMETHEUS)
        self.query_seconds: float | None = None  # the last query's duration, for the status page and benchmarks
        self._empty_since: float | None = None  # the first read that answered and matched nothing
        self.reselected = False  # a reload changed what is selected, and no whole read followed yet
        self.present: set[str] = set()  # the pods this read's answers had series of, new samples or none
        # (last whole read, the whole read after it) around each failing stretch, most recent last:
        # a pod is not judged by the time the source did not answer
        self.outages: list[tuple[float, float]] = []
        self._nothing_since: float | None = None  # the first of successive answers with no series at all
        self._hinted = False  # the "nothing matches" line, said once
        self._unnamed_said = False  # the "no target_label" line, said once
        # pod -> reason -> its samples refused for their time (promseries.pods), counted with
        # the pod's next sample ingested (the rejected-samples counter is a target's)
        self.refused: dict[str, Counter] = {}
        self._refusal_said = False  # the "samples after the query's time" line, said once

    def carry_over(self, old: "PrometheusReader") -> None:
        """A reload's new reader goes on from where the old one was. One that selects other
        series (another URL, match_labels or target_label) keeps the pods it still finds,
        their histories and targets with them: its first whole read forgets, at once, every
        pod it did not find (they leave as gone targets, whose alerts resolve). Judged
        stale instead, the old selection's pods would all go down, each a false
        TargetDown pointing the on-call at the pods, not at the config."""
        self.newest, self.gap, self.targets, self.last_read = dict(old.newest), dict(old.gap), dict(old.targets), old.last_read
        self.memo, self.outages = old.memo, list(old.outages)
        self.learnt = dict(old.learnt) if old.limits == self.limits else {}  # the labels dropped stay counted till read again
        reselected = _selection(old.read) != _selection(self.read)
        self.reselected = old.reselected or reselected
        # how its reads went (a reload during an outage still knows it failed: judged by the
        # wall clock, every pod went down once it answered); what it matched, for its selection
        self.state = replace(old.state, targets=(), matched_ever=False, answered=False, empty_since=None) if reselected else old.state
        if not reselected:
            self._empty_since, self._hinted, self._unnamed_said = old._empty_since, old._hinted, old._unnamed_said

    def reach(self, now: float) -> float:
        """How far back this read asks: MARGIN past the last read (scrapes are committed
        late, within their timeout), and further where the pods' newest samples are older.
        What a pod holds unread is newer than its newest sample read (a series' samples
        are appended in time order, however late a scrape is committed): a store that
        commits every scrape late (remote write) has every pod's newest sample that much
        older, and a read reaches back to the next scrape of the oldest of those among the
        pods that were sending at the last read (an interval after it, with half an
        interval's slack), within a scrape interval (at most MARGIN) of the median pod's age (a pod
        that stopped, missed a scrape or is scraped less often does not widen every read
        until it goes stale). At least two intervals, at most MAX_RANGE (the first read,
        or after failures).
        A read that reached two intervals back, not MARGIN past the last read, asked each
        sample twice instead of three times at 15 s (5-8% less CPU offline, within the
        noise live), but lost for good the pods of a store lagging 15-30 s behind a
        Querier whose other stores did not, and every pod after a stall longer than
        stale_after: what is not followed keeps the margin."""
        if self.reading_back():
            return max(self.read_back, 2 * self.poll_interval)
        last = self.last_read
        ages = [last - t for name, t in self.newest.items() if self.sending(name, t, last)]
        behind = 0.0  # how far before the last read the lagging fleet's next scrapes may lie
        if ages:
            scrape_interval = max(self.poll_interval, self.resolution() or 0.0)
            # within the margin of the median: at a 60 s interval a whole interval let pods that
            # stopped or missed a scrape (60-90 s old) widen every read of a rolling rollout
            bound = statistics.median_low(ages) + min(scrape_interval, MARGIN)
            oldest_age = max((age for age in ages if age <= bound), default=0.0)
            # a pod's next scrape comes an interval after its newest; half of one is the scrape times' slack
            behind = oldest_age - scrape_interval / 2
        reach = now - last + max(behind, MARGIN)
        return max(min(MAX_RANGE, reach), 2 * self.poll_interval)

    def reading_back(self) -> bool:
        """The next read is the first (or the first of a new selection): it reads back."""
        return self.last_read is None or self.reselected

    def slices(self, now: float, reach: float, stepped: float = 0.0) -> list[tuple[float, float]]:
        """(evaluation time, range) of the queries a read asks of each part, oldest first. A
        read that reaches further back than a regular one (the first reads back what the
        rules look back on, one after failures up to 5 minutes) is asked in spans of about a regular read's reach, so that
        no answer holds much more than a regular read's samples of its part: a sidecar starting
        against a Prometheus that held 5 minutes of 10,000 pods read them in one answer a
        part and peaked at 1.41-1.48 GB (880-930 MB once running). Each range reaches back
        to the evaluation time of the one before (both ends are in a range before
        Prometheus 3, the start is out from 3 on): the spans meet, and a sample on an edge,
        read twice, is left out the second time as every sample already read is.
        The last `stepped` seconds (whole poll intervals) are spans of one poll interval:
        a read back steps the rules at each span's end, and an alert whose condition began
        within the last span of a regular read's reach went pending only at the live
        evaluation after a restart (a restart 2 s after a page: pending again, firing
        `for` later, and resolved by Alertmanager where endsAt came first)."""
        regular = max(self.poll_interval + MARGIN, 2 * self.poll_interval)
        steps = int(min(stepped, reach) / self.poll_interval + 1e-9)
        fine = steps * self.poll_interval
        cuts = []
        if reach - fine > 1e-6:
            count = max(1, round((reach - fine) / regular))
            span = (reach - fine) / count
            cuts = [(now - reach + k * span, span) for k in range(1, count + 1)]
        return cuts + [(now - fine + k * self.poll_interval, self.poll_interval) for k in range(1, steps + 1)]

    def parts(self) -> list[str]:
        return promseries.partitions(self.read.target_label, self.read.partitions)

    def fetch(self, at: float, reach: float, part: str) -> dict[str, promseries.Pod]:
        """One part's samples of the `reach` seconds up to `at` (a slice of the read), those
        already read left out; DiscoveryError when Prometheus gave none.
        The answer's JSON (some 270 lists and dicts a pod) holds no cycle: the cycle
        collector is kept from walking it again and again while it is decoded and read
        (measured: a third of a read's CPU), and runs once it is gone."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            body = self.api.get_bytes("/api/v1/query", {"query": promseries.query(self.read.match_labels, reach, part),
                                                        "time": f"{at:.3f}"})
            refused: dict[str, Counter] = {}
            found = promseries.pods_of_answer(body, self.read.target_label, self.where, self.newest, self.memo, self.present,
                                              not_after=at + FUTURE_SLACK, refused=refused,
                                              budget=decoded_budget(self.read.max_answer),
                                              partitions=self.read.partitions)
            self._note_refused(refused, at)
            return found
        except PrometheusAPIError as exc:
            raise DiscoveryError(str(exc)) from None
        finally:
            body = None
            if collecting:
                gc.enable()

    def _note_refused(self, refused: dict[str, Counter], at: float) -> None:
        """Samples an answer held at no finite time or after the query's time `at`: kept to
        be counted, said once (a non-conforming store or proxy sends them at every read)."""
        for pod, counts in refused.items():
            self.refused.setdefault(pod, Counter()).update(counts)
        if refused and not self._refusal_said:
            self._refusal_said = True
            pod = min(refused)
            log.warning("read_prometheus: %s answered samples after the query's time %.3f or at no finite time (%s of %s, "
                        "and %d other pod(s)); refused: Prometheus answers none there, this store or proxy does "
                        "(prefixcache_rejected_samples, reasons future_timestamp and non_finite_timestamp)",
                        self.source_url, at, dict(refused[pod]), pod, len(refused) - 1)

    def refused_of(self, pod: str) -> dict[str, int]:
        """The pod's samples refused for their time since this was last asked (reason -> count)."""
        return dict(self.refused.pop(pod, {}))

    def failed(self, now: float, error: str) -> None:
        self.memo.settle()  # reads that keep failing keep no more layouts than one read's
        old, self.state = self.state, settle(self.state, now, None, error, self.cfg.accept_empty_after)
        if error != old.error:
            log.warning("read_prometheus: %s; the targets' samples wait for the next read", error)

    def learn(self, pods: dict[str, promseries.Pod]) -> bool:
        """A part's pods: each a target (made again when its labels changed), the interval
        between its last two samples noted. Whether a target came or changed."""
        changed = False
        for name, pod in pods.items():
            times = sorted(pod.times)
            if len(times) > 1:
                self.gap[name] = times[-1] - times[-2]
            elif name in self.newest:
                self.gap[name] = times[-1] - self.newest[name]
            learnt = self.learnt.get(name)
            if learnt is None or learnt[0] is not pod.labels:  # the memo hands out a pod's labels again while they stay
                if self.read.target_label not in pod.labels and not self._unnamed_said:
                    self._unnamed_said = True  # once: a mistyped label names every pod so
                    log.warning("read_prometheus: the series of %s have no %r label (read_prometheus.target_label), so it is "
                                "named by its instance; pods that share an instance (behind a Service, or honor_labels) are "
                                "then read as one, their samples mixed: set target_label to the label that names them",
                                name, self.read.target_label)
                dropped = Counter()
                learnt = self.learnt[name] = (pod.labels, promseries.target(pod, self.source_url, self.limits, dropped), dropped)
            target = learnt[1]
            known = self.targets.get(name)
            if known is not target and known != target:
                self.targets[name] = target
                changed = True
        return changed

    def found(self) -> list[Target]:
        """The targets known now, within the target limit (what a part's new pods are polled
        as before the read ends)."""
        found = sorted(self.targets.values(), key=lambda t: t.name)
        return found[:self.cfg.target_limit] if self.cfg.target_limit else found

    def update(self, now: float, seen: set[str]) -> list[Target]:
        """After a read whose parts were all learnt: who is known (long-silent pods out) ->
        the targets."""
        if self.last_read is not None and self.state.refreshed and not self.state.ok:  # answering again
            self.outages = _with_outage(self.outages, (self.last_read, now), now, self.cfg.accept_empty_after)
        # after a reload that selects otherwise, a pod that was sending at the last read and of which
        # the answers had no series is not selected; one already silent ages as before (the
        # read reaches too little back to tell, and forgotten, its TargetDown would resolve)
        last = self.last_read if self.last_read is not None else -math.inf
        aged = [n for n, t in self.newest.items() if n not in seen and now - t > self.cfg.accept_empty_after]
        deselected = [n for n, t in self.newest.items() if n not in self.present and self.sending(n, t, last)
                      and now - t <= self.cfg.accept_empty_after] if self.reselected else []
        if deselected:
            log.info("read_prometheus: %d pod(s) not in what the new configuration selects (%s); forgotten",
                     len(deselected), ", ".join(sorted(deselected)[:5]) + (", ..." if len(deselected) > 5 else ""))
        for name in aged:
            log.info("read_prometheus: %s has had no sample for %gs; forgotten", name, self.cfg.accept_empty_after)
        self.forget(aged + deselected)
        # a name given in a read that failed before its pod was read, to a pod not seen since
        for name in [n for n in self.memo.names.owner if n not in self.newest and n not in self.present]:
            self.memo.names.forget(name)
        self.memo.settle()  # the layouts of this read's answers, for the next
        self.last_read = now
        self.reselected = False
        limited = self.found()
        # the labels dropped of every pod known, as its target was last made: counted of this read's
        # pods alone, a read that found no new sample of some said the limit stopped, and the next that it started
        dropped: Counter = Counter()
        for name in self.targets:
            dropped.update(self.learnt[name][2] if name in self.learnt else ())
        if len(limited) < len(self.targets):
            dropped["target_limit"] += len(self.targets) - len(limited)
        old = self.state
        # matched: the answers held series of the selector (a pod kept down from before is no match)
        said = tuple(sorted(dropped.items()))
        self.state = replace(settle(old, now, limited, "", self.cfg.accept_empty_after), dropped=said, found=len(self.targets),
                             over_limits=over_limits(said, len(self.targets), len(limited), self.limits),
                             matched_ever=old.matched_ever or bool(self.present))
        level, line = limits_log(old, self.state)
        if line:
            log.log(logging.WARNING if level == "warning" else logging.INFO, "read_prometheus: %s", line)
        if old.error and not self.state.error:
            log.info("read_prometheus: working again")
        if not self.state.matched_ever and self._empty_since is None:
            self._empty_since = now
        # a Prometheus that just started has scraped nothing yet: said once it stayed so for accept_empty_after
        if not self.state.matched_ever and not self._hinted and now - self._empty_since >= self.cfg.accept_empty_after:
            self._hinted = True
            selector = ", ".join(f'{k}="{v}"' for k, v in self.read.match_labels)
            log.warning("read_prometheus: answered for %.0fs, but no series of the engines matches {%s}; a source that never "
                        "matched is far more often a wrong selector than an empty fleet (prefixcache_discovery_matched_nothing)",
                        now - self._empty_since, selector)
        if len(self.state.targets) != len(old.targets):
            log.info("read_prometheus: %d target(s) (was %d)", len(self.state.targets), len(old.targets))
        return list(self.state.targets)

    def read_samples(self, pod: promseries.Pod) -> list[float]:
        """The pod's new sample times, oldest first; marks them read."""
        times = sorted(pod.times)
        self.newest[pod.name] = times[-1]
        return times

    def sending(self, name: str, newest: float, at: float) -> bool:
        """Whether a pod whose newest sample is `newest` was sending at the read at `at`."""
        return at - newest <= self.stale_after(name)

    def stale_after(self, name: str) -> float:
        if self.read.stale_after:
            return self.read.stale_after
        return max(3 * self.gap.get(name, self.poll_interval), 2 * self.poll_interval)

    def stale(self, now: float) -> dict[str, float]:
        """pod -> its newest sample, for the pods whose samples stopped: none for
        stale_after of the time the source answered. While it failed (an outage of
        Prometheus, which scraped nothing then either) no pod is judged, and once it
        answers again a pod is judged down only when it still sends nothing: judged by
        the wall clock, every pod went down at the first read after each Prometheus
        restart, and the fleet's TargetDown went pending."""
        out = {}
        for name, t in self.newest.items():
            unseen, after = now - t, self.stale_after(name)
            if unseen > after and (not self.outages or unseen - _overlap(self.outages, t, now) > after):
                out[name] = t
        return out

    def answered_nothing(self, now: float) -> str:
        """Why a read whose answers held no series at all, while pods were sending at the
        last read, is taken for a failure of the source (a Thanos with a partial response, a
        Prometheus that lost its data), or "": the whole fleet gone at once is believed only
        after discovery.accept_empty_after, as discovery believes an empty answer."""
        last = self.last_read if self.last_read is not None else -math.inf
        # a new selection may well match nothing: its pods leave (update() says so)
        if self.present or self.reselected or not any(self.sending(n, t, last) for n, t in self.newest.items()):
            self._nothing_since = None
            return ""
        self._nothing_since = self._nothing_since if self._nothing_since is not None else now
        if now - self._nothing_since >= self.cfg.accept_empty_after:
            # believed: the source's empty answer has been held as long already (settle() would hold it again)
            self.state = replace(self.state, empty_since=self._nothing_since)
            return ""
        return (f"{self.where} answered success with no series of any pod, while {len(self.newest)} pod(s) were sending: "
                f"taken for a failure of the source (kept as they were) until it stays so for {self.cfg.accept_empty_after:g}s")

    def scrape_health(self, at: float, names: list[str]) -> dict[str, float] | None:
        """Pod -> Prometheus's `up` for it at `at`, for those of `names` whose scrape target
        Prometheus still has (1 scraped, 0 failing); a pod left out was removed. None where
        the source cannot tell: the query failed, or it holds no `up` of the selector at all."""
        label, out = self.read.target_label, {}
        try:
            selected = self.api.get("/api/v1/query", {"query": f"count({promseries.up_query(self.read.match_labels, label, None)})",
                                                      "time": f"{at:.3f}"})
            if not (isinstance(selected, dict) and isinstance(selected.get("data"), dict) and selected["data"].get("result")):
                return None  # no `up` of the selector at all (a store fed without it): absence says nothing
            for k in range(0, len(names), UP_QUERY_PODS):
                raw = [self.memo.names.owner.get(n, (n, ""))[0] for n in names[k:k + UP_QUERY_PODS]]
                answer = self.api.get("/api/v1/query", {"query": promseries.up_query(self.read.match_labels, label, raw),
                                                        "time": f"{at:.3f}"})
                out.update(promseries.scrape_health(answer, label, self.memo.names, self.where))
        except (PrometheusAPIError, DiscoveryError) as exc:
            log.info("read_prometheus: cannot tell removed pods from down ones: %s", exc)
            return None
        return out

    def forget(self, names: list[str]) -> None:
        """Pods that left (aged, deselected, removed from Prometheus): all that is kept of them."""
        for name in names:
            for known in (self.newest, self.gap, self.targets, self.memo.pods, self.learnt, self.refused):
                known.pop(name, None)
            self.memo.names.forget(name)  # no layout settle() keeps has it: it had no series in this read

    def resolution(self) -> float | None:
        """Prometheus's scrape interval as the samples show it (the median pod's; of two
        medians the lower, an interval some pod has, not their mean)."""
        gaps = [g for g in self.gap.values() if g > 0 and math.isfinite(g)]
        return statistics.median_low(gaps) if gaps else None

    def close(self) -> None:
        self.api.close()


def _overlap(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of (start, end) that the spans cover (they do not overlap each other)."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)


def _with_outage(outages: list[tuple[float, float]], outage: tuple[float, float], now: float,
                 keep_seconds: float) -> list[tuple[float, float]]:
    """The failing stretches with `outage` added, those that ended more than keep_seconds
    ago gone, at most MAX_OUTAGES: beyond, the two with the least answered time between
    them become one. The oldest dropped instead, a pod silent through them was judged
    by the time the source failed (a false TargetDown); merged, the few seconds it
    answered between two are not judged either (a pod that stopped then is judged a
    little later)."""
    kept = [o for o in outages if now - o[1] <= keep_seconds] + [outage]
    while len(kept) > MAX_OUTAGES:
        i = min(range(len(kept) - 1), key=lambda k: kept[k + 1][0] - kept[k][1])
        kept[i:i + 2] = [(kept[i][0], kept[i + 1][1])]
    return kept


def _selection(read) -> tuple:
    """What decides which series a reader reads and which pod each is."""
    return read.url, read.match_labels, read.target_label


def read_once(poller) -> None:
    """One read (below). In a process that freezes what a read leaves (poller.freeze_reads,
    the sidecar), the cycle collector waits for the whole read, and what is alive after it
    (the pods' new views, windows and snapshots, some 45 objects a pod, which the next read
    replaces) is frozen instead of walked: at 10,000 pods each young collection walked
    some 450,000 of them, their references scattered over a heap of 900 MB (0.3-0.6 s a
    collection; bench_promsource.py: 6-17% less CPU a read). Garbage is still freed by its
    count of references; cycles among what was frozen wait for the full collection every
    FULL_COLLECTION_EVERY reads, which unfreezes everything, collects and freezes again."""
    if poller.reader is None or not (poller.freeze_reads and gc.isenabled()):
        _read(poller)
        return
    gc.disable()
    try:
        _read(poller)
    finally:
        poller.reads_frozen += 1
        if poller.reads_frozen % FULL_COLLECTION_EVERY == 0:
            gc.unfreeze()
            gc.collect()
        gc.freeze()
        gc.enable()


def _read(poller) -> None:
    """One read, slice by slice (a long one) and part by part (one answer in memory at a
    time): ask, install the part's new pods (as a discovery change), feed each new sample
    to its target's poller in time order; after the last part, forget the long-silent pods
    and mark the silent ones down.
    `poller` is the Poller (exporter/poll/poller.py), whose locks this takes in its order.
    A part that fails ends the read: what earlier parts fed stays fed (each pod's newest
    sample read is kept), the rest waits for the next read, which reaches back to the last
    whole one."""
    reader = poller.reader
    if reader is None:
        return
    now = poller.samples_now()
    reach = reader.reach(now)
    reading_back = reader.backfilling = reader.reading_back()
    try:
        _read_slices(poller, reader, now, reach, reading_back)
    finally:
        reader.backfilling = False
    if reading_back and reader.last_read == now:  # the whole read went through
        log.info("read_prometheus: read back %.0fs of %d pod(s)' samples, the rules stepped through them: what was under way "
                 "before this start (an incident and its baseline) is judged as before", reach, len(reader.state.targets))


def _read_slices(poller, reader: PrometheusReader, now: float, reach: float, reading_back: bool) -> None:
    seen = set()
    reader.present.clear()
    polled = None  # (the poller.current it was taken at, ours, by_pod): 10,000 pods' maps, made again only on a change
    cuts = reader.slices(now, reach, reader.stepped if reading_back else 0.0)
    for k, (at, span) in enumerate(cuts):
        for part in reader.parts():
            try:
                pods = reader.fetch(at, span, part)
            except DiscoveryError as exc:
                reader.failed(now, str(exc))
                poller.publish_discovery()
                return
            seen.update(pods)
            with poller.reload_lock:
                if reader is not poller.reader:
                    return  # a reload replaced it while Prometheus answered
                if reader.learn(pods) or polled is None:
                    _install(poller, reader.found())  # a part's new pods are polled before their samples come
                if polled is None or polled[0] is not poller.current:  # what is polled changed (a discovery refresh too)
                    polled = (poller.current, *_polled(poller))
                _, ours, by_pod = polled
            _ingest(reader, pods, ours, by_pod)
            del pods  # this part's samples, before the next part is asked
        if reading_back and k < len(cuts) - 1:
            # the rules step through the history read back as they did live, so an alert that
            # was firing before our restart is firing again at the first evaluation (its `for`
            # met long ago), never resolved for want of a baseline
            _evaluate_at(poller, at)
    nothing = reader.answered_nothing(now)
    if nothing:
        reader.failed(now, nothing)
        poller.publish_discovery()
        return
    with poller.reload_lock:
        if reader is not poller.reader:
            return
        _install(poller, reader.update(now, seen))
        poller.publish_discovery()
        ours, by_pod = _polled(poller)
        resolution = reader.resolution()
        poller.state.update(samples_source=f"Samples of {len(reader.state.targets)} target(s) read from Prometheus at {reader.source_url}: "
                                           "the windows' resolution is Prometheus's scrape interval"
                                           # to a tenth of a second: a loaded Prometheus stamps its scrapes a few ms off
                                           + (f" (observed {round(resolution, 1):g}s)" if resolution else "") + ", not global.poll_interval.")
    going = {}  # the pods whose samples just stopped: removed, or down?
    for pod_name, newest in reader.stale(now).items():
        target = ours.get(by_pod.get(pod_name, ""))
        view = poller.state.target(target.target.name) if target is not None else None
        if view is not None and (view.up or not view.polled):  # said once, as it goes down
            going[pod_name] = (target, newest)
    health = reader.scrape_health(now, sorted(going)) if going else None
    removed = [] if health is None else sorted(n for n in going if n not in health)
    if removed:
        # gone from Prometheus's targets (a rollout deleted it): it leaves, its alerts resolve; no TargetDown
        log.info("read_prometheus: %d pod(s) no longer scraped by Prometheus, removed: %s", len(removed),
                 ", ".join(removed[:5]) + (", ..." if len(removed) > 5 else ""))
        reader.forget(removed)
        with poller.reload_lock:
            if reader is poller.reader:
                _install(poller, reader.found())
    for pod_name, (target, newest) in going.items():
        if pod_name in removed:
            continue
        since = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(newest))  # a time, not "Ns ago": it stays on the status page
        if health is not None and health.get(pod_name) == 0:
            target.mark_down(now, STALE, f"Prometheus cannot scrape it (up == 0); its last sample is from {since}")
        else:
            target.mark_down(now, STALE, f"no sample in Prometheus since {since} (stale after {round(reader.stale_after(pod_name), 1):g}s)")


def _evaluate_at(poller, at: float) -> None:
    """The rules at a past time of a history being read back: alerts step as they did then;
    nothing is logged or sent (the next evaluation sends what is active)."""
    with poller.engine_lock:
        poller.engine.evaluate(at, poller.engine.take_events(at))


def _polled(poller) -> tuple[dict, dict[str, str]]:
    """Under the reload lock: the pollers of the targets read from Prometheus (this
    shard's), by target name, and pod -> the name of the target polled as it."""
    read = poller.read_names
    ours = {name: poller.pollers[name] for name in read if name in poller.pollers}
    return ours, {t.url.rpartition("#")[2]: t.name for t in poller.current.targets if t.name in read}


def _install(poller, found: list[Target]) -> None:
    if found != poller.read_found:
        poller.read_found = found
        poller._install(poller.config)


def _ingest(reader: PrometheusReader, pods: dict[str, promseries.Pod], ours: dict, by_pod: dict[str, str]) -> None:
    for pod_name, pod in pods.items():
        times = reader.read_samples(pod)
        target = ours.get(by_pod.get(pod_name, ""))
        refused = reader.refused_of(pod_name)
        if target is None:
            continue  # another shard's (which counts them)
        for t in times:
            snapshot = pod.snapshot(t, target.series_limit)
            if refused:
                snapshot, refused = snapshot.noted((), refused), None
            target.ingest(t, snapshot)


def reader_settings(d: DiscoveryConfig, poll_interval: float) -> tuple:
    """What a reader is made with: a reload that changes any of it makes a new one (a
    raised label_limit kept by the old reader dropped the labels on)."""
    return how_read(d.read_prometheus), d.target_limit, d.label_limit, d.label_value_length_limit, poll_interval


def how_read(read):
    """What a reader reads by: whether our /metrics exports what it read is not, and a reload
    that changes only that keeps the reader and its state."""
    return replace(read, reexport_engine_series=False) if read is not None else None

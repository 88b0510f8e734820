"""The status page (`/`) of a big fleet: time to render it and its size at 100, 1,000 and
10,000 targets, each serving one model with a full hour of 10 s polls behind its four
windows; 2% of the targets fire an alert, 3% are down, 50 deploy events are recent.

A render follows a state change, which brings new window stats whose TTFT quantiles are
not computed yet: each measured render gets fresh stats ("cold"), the cost a reader sees
after a poll. Goals: under a second at 1,000 targets; the size bounded (past 50 targets
the page summarises: the same size at 10,000 as at 1,000, but for the alert list)."""
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.sim import simulator  # noqa: E402
from exporter.config.sections import Target  # noqa: E402
from exporter.alerting.rules_state import FIRING, Alert  # noqa: E402
from exporter.monitor.targetview import TargetView  # noqa: E402
from exporter.serve.statuspage import PageInput, render  # noqa: E402
from exporter.series.history import History  # noqa: E402
from exporter.series.window import summarize  # noqa: E402

WINDOWS = (("1m", 60.0), ("5m", 300.0), ("15m", 900.0), ("1h", 3600.0))
HOUR, STEP = 3600.0, 10.0
ALERT_ITEM = b'<li class="alert '
DISTINCT = 4  # histories played for real; the targets share them, each with stats of its own


def played(i: int) -> tuple[object, object]:
    """An hour of one replica (every third one's prompt broken halfway): (samples, block size)."""
    scenario = simulator.incident(900.0 + HOUR / 2) if i % 3 == 0 else simulator.Scenario(tenants=60 + 10 * i)
    replica = simulator.Replica(f"r{i}", scenario, start=-900.0, seed=i)
    history = History(HOUR + STEP, 300.0, windows=[s for _, s in WINDOWS], mid_seconds=900.0, mid_step=30.0)
    snap, _ = simulator.play_into(replica, history, HOUR, STEP)
    return history.samples(), snap


def fleet(n: int, histories, now: float) -> PageInput:
    targets, alerts = [], []
    for i in range(n):
        samples, snap = histories[i % len(histories)]
        name = f"vllm-{i:05d}"
        target = Target(name, f"http://10.0.{i // 250}.{i % 250}:8000/metrics", (("namespace", "llm"), ("pod", name), ("version", "v1")))
        view = TargetView(target=target, up=True, polled=True, last_result="success", last_scrape_time=now, last_success_time=now,
                          snapshot=snap, samples=samples, samples_kept=len(samples))
        if i % 33 == 5:
            view = replace(view, up=False, last_result="timeout", last_error="scrape timed out after 6 s")
        targets.append(view)
        if i % 50 == 7:
            alerts.append(Alert("PrefixCacheHitRateDropAfterDeploy", name, "demo/llama-3-8b", state=FIRING, active_at=now - 600,
                                labels=(("cause", "prompt_prefix_change"), ("severity", "critical")),
                                annotations=(("description", "Probable cause: prompt_prefix_change (the prompt's first tokens changed)."),
                                             ("summary", f"Prefix-cache hit rate of demo/llama-3-8b on {name} fell from 88% to 4%"))))
    deploys = tuple({"t": now - HOUR + 60 * k, "target": f"vllm-{k:05d}", "version": f"v{k}", "source": "api", "description": "rollout"}
                    for k in range(50))
    return PageInput(tuple(targets), tuple(alerts), deploys, {}, ("/", "/metrics", "/api/v1/status"), "bench")


def fresh_stats(page: PageInput, now: float) -> PageInput:
    """What a state change brings: every view's stats computed anew (TTFT not yet asked)."""
    by_samples: dict[int, dict] = {}
    views = []
    for v in page.targets:
        key = id(v.samples)
        if key not in by_samples:
            by_samples[key] = summarize(v.samples, now, WINDOWS, 1000.0, v.snapshot.block_size)
        views.append(replace(v, stats={m: {w: ws._replace(lazy_ttft=type(ws.lazy_ttft)(ws.lazy_ttft.source, ws.lazy_ttft.keys))
                                            for w, ws in windows.items()} for m, windows in by_samples[key].items()}))
    return replace(page, targets=tuple(views))


def main() -> None:
    began = time.perf_counter()
    histories = [played(i) for i in range(DISTINCT)]
    print(f"status page: {DISTINCT} one-hour histories played in {time.perf_counter() - began:.1f} s")
    now = HOUR
    for n in (100, 1000, 10000):
        base = fleet(n, histories, now)
        cold, size = [], 0
        for _ in range(5):
            page = fresh_stats(base, now)
            t0 = time.perf_counter()
            body = render(page, now)
            cold.append(time.perf_counter() - t0)
            size = len(body)
        t0 = time.perf_counter()
        render(page, now)
        warm = time.perf_counter() - t0
        print(f"  {n:>6,} targets: render {statistics.median(cold) * 1000:7.1f} ms median of 5 cold "
              f"(max {max(cold) * 1000:.1f}), {warm * 1000:.1f} ms warm; {size / 1024:7.1f} KiB, "
              f"{body.count(b'<article')} target cards, {body.count(ALERT_ITEM)} alerts listed")
    print("  goal: < 1 s at 1,000 targets; size flat from 1,000 to 10,000 targets but for the alert list")


if __name__ == "__main__":
    main()

"""(d) one process polling 1,000 discovered targets every 5 s beside a real Prometheus
scraping the same 1,000 targets at the same interval, in the same run: the CPU share of
each, their ratio (which holds across machines), peak RSS, and how long /metrics took to
answer throughout; with --old REV, the code of REV measured the same way right after,
against the same Prometheus. Two windows a phase: in the first our /metrics is scraped
every 15 s, as a Prometheus scrapes the sidecar (the CPU ratio of a deployment); in the
second it is probed every 2 s (its answers' times; each probe asks for a render of the
targets polled since the one before, so this window's CPU is reported too). (e) memory
per target with every 1 h window full, measured by driving the engine on a simulated
clock through a full hour.

(d) runs the real `vllm-prefix-cache-exporter run` with a file_sd file listing the
simulated replicas (served by `simulate` in other processes); Prometheus reads the same
file. (e) counts what the exporter's own modules hold (tracemalloc, the simulated
replicas left out) after an hour of polls of N targets, divided by N."""
import argparse
import gc
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from urllib.parse import urlsplit

import requests

sys.path.insert(0, str(Path(__file__).parent))
from bench_sidecar import start_fleet, start_sidecar_with  # noqa: E402
from procstat import cpu_seconds, peak_rss_mb  # noqa: E402
from promserver import Prometheus, version  # noqa: E402

from exporter.sim import simulator  # noqa: E402
from exporter.config.sections import load  # noqa: E402
from exporter.monitor.engine import Engine  # noqa: E402
from exporter.parse.vllm_metrics import parse  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def start_fleets(targets: int, per_process: int, rate: float):
    procs, urls = [], []
    for start in range(0, targets, per_process):
        proc, more = start_fleet(min(per_process, targets - start), rate)
        procs.append(proc)
        urls += more
    return procs, urls


def file_sd(urls, path: Path) -> None:
    groups = []
    for i, url in enumerate(urls):
        parts = urlsplit(url)
        groups.append({"targets": [parts.netloc], "labels": {"pod": f"vllm-{i}", "__metrics_path__": parts.path,
                                                            "version": "v1", "deployment": f"model-{i % 50}"}})
    path.write_text(json.dumps(groups))


class MetricsProbe:
    """GET /metrics every `every` seconds on a thread, on the clock's ticks as a Prometheus
    scrape loop asks (a tick missed while an answer is awaited is skipped), the first at
    once, so that a window of N ticks holds N asks: each answer's time (the client's gunzip
    of it included), and the failures. Not `every` seconds after the last answer: a faster
    answer would ask for more renders, and cost more CPU."""

    def __init__(self, url: str, every: float = 2.0):
        self.url, self.every = url, every
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        tick = time.monotonic()
        while not self._stop.wait(max(0.0, tick - time.monotonic())):
            began = time.monotonic()
            try:
                ok = requests.get(self.url + "/metrics", timeout=10).status_code == 200
            except requests.RequestException:
                ok = False
            if ok:
                self.latencies.append(time.monotonic() - began)
            else:
                self.failures += 1
            tick += self.every * max(1, math.ceil((time.monotonic() - tick) / self.every))

    def stop(self):
        self._stop.set()
        self._thread.join(15)


def old_checkout(rev: str) -> Path:
    """The code of `rev` in a scratch folder (git archive: no worktree is touched)."""
    where = Path(tempfile.mkdtemp(prefix="bench-old-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True, timeout=120)
    return where


def this_and_old(measure, old: str | None) -> list[dict]:
    """measure(label, code) for this checkout (code None: the Python path as it is), then,
    with `old`, for that revision's code against the same peers, right after."""
    rows = [measure("this checkout", None)]
    if old:
        code = old_checkout(old)
        try:
            rows.append(measure(f"old: {old}", code))
        finally:
            shutil.rmtree(code, ignore_errors=True)
    return rows


SCRAPED_EVERY = 15.0  # how often a Prometheus scrapes the sidecar in the first window
PROBED_EVERY = 2.0  # the second window's probe


def window(sidecar, prom: Prometheus, url: str, seconds: float, every: float) -> dict:
    """Our CPU share and Prometheus's over `seconds` while /metrics is asked every `every` s."""
    probe = MetricsProbe(url, every)
    ours0, theirs0, t0 = cpu_seconds(sidecar.pid), cpu_seconds(prom.pid), time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    ours, theirs = (cpu_seconds(sidecar.pid) - ours0) / wall, (cpu_seconds(prom.pid) - theirs0) / wall
    probe.stop()
    return {"cpu_share": ours, "prometheus_cpu_share": theirs, "ratio": ours / theirs, "latencies": probe.latencies,
            "failures": probe.failures}


def phase(label: str, code: Path | None, sd: Path, prom: Prometheus, seconds: float, workdir: Path) -> dict:
    cfg = {"global": {"poll_interval": "5s"}, "discovery": {"file_sd": {"files": [str(sd)]}}}
    sidecar, url = start_sidecar_with(cfg, workdir, ready_within=180.0, code=code)
    try:
        time.sleep(10)
        scraped = window(sidecar, prom, url, seconds, SCRAPED_EVERY)
        probed = window(sidecar, prom, url, seconds, PROBED_EVERY)
        peak = peak_rss_mb(sidecar.pid)
        text = requests.get(url + "/metrics", timeout=60).text
        up = sum(1 for line in text.splitlines() if line.startswith("prefixcache_target_up{") and line.endswith(" 1.0"))
    finally:
        sidecar.terminate()
        sidecar.wait(timeout=30)
    latencies = scraped["latencies"] + probed["latencies"]
    failures = scraped["failures"] + probed["failures"]
    worst = max(latencies, default=float("nan"))
    median = statistics.median(probed["latencies"]) if probed["latencies"] else float("nan")
    print(f"discovered ({label}): {up} of 1000 targets up, poll 5s, two windows of {seconds:.0f}s | "
          f"/metrics scraped every {SCRAPED_EVERY:g}s: ours {scraped['cpu_share'] * 100:.1f}% of a core, Prometheus "
          f"{scraped['prometheus_cpu_share'] * 100:.1f}% scraping the same targets: {scraped['ratio']:.2f}x | "
          f"probed every {PROBED_EVERY:g}s: ours {probed['cpu_share'] * 100:.1f}%, Prometheus "
          f"{probed['prometheus_cpu_share'] * 100:.1f}%: {probed['ratio']:.2f}x | peak RSS {peak:.1f} MB | /metrics: median "
          f"{median * 1000:.0f} ms probed, slowest {worst * 1000:.0f} ms of both windows (scraped: "
          f"{', '.join(f'{t * 1000:.0f}' for t in scraped['latencies'])} ms; probed: slowest "
          f"{max(probed['latencies'], default=float('nan')) * 1000:.0f} ms), {failures} failed of {len(latencies) + failures}")
    return {"code": label, "targets_up": up, "cpu_share": scraped["cpu_share"], "prometheus_cpu_share": scraped["prometheus_cpu_share"],
            "ratio": scraped["ratio"], "probed_cpu_share": probed["cpu_share"], "probed_ratio": probed["ratio"],
            "peak_rss_mb": peak, "metrics_median_s": median, "metrics_slowest_s": worst, "metrics_failures": failures}


def bench_discovered(targets: int, seconds: float, old: str | None) -> list[dict]:
    fleets, urls = start_fleets(targets, per_process=250, rate=0.2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sd = Path(tmp) / "sd.json"
        file_sd(urls, sd)
        prom = Prometheus([{"job_name": "vllm", "file_sd_configs": [{"files": [str(sd)]}]}], scrape_interval="5s")
        try:
            print(f"discovered: {version()} scrapes the same {targets} targets every 5s throughout")
            rows = this_and_old(lambda label, code: phase(label, code, sd, prom, seconds, Path(tmp)), old)
        finally:
            prom.stop()
            for f in fleets:
                f.terminate()
                f.wait(timeout=30)
    return rows


def _exporter_bytes() -> int:
    # the simulated replicas' own memory left out: the simulator and the block pool it keeps a replica's cache in
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*exporter/*"),
                                                      tracemalloc.Filter(False, "*exporter/sim/*"),
                                                      tracemalloc.Filter(False, "*exporter/tools/cachemodel.py")])
    return sum(stat.size for stat in snap.statistics("filename"))


def bench_full_hour(targets: int, poll: float = 5.0) -> dict:
    """The engine of a sidecar with `targets` targets, polled every `poll` s for a full
    hour on a simulated clock, rules evaluated every poll."""
    names = [f"vllm-{i}" for i in range(targets)]
    engine = Engine(load({"targets": [{"name": n, "url": f"http://127.0.0.1:1/{n}", "labels": {"version": "v1"}} for n in names]}))
    replicas = [simulator.Replica(n, simulator.Scenario(request_rate=1.0), start=-900.0, seed=i) for i, n in enumerate(names)]
    gc.collect()
    tracemalloc.start()
    base = _exporter_bytes()
    t = 0.0
    while t <= 3600.0:
        for n, r in zip(names, replicas):
            r.advance(t)
            engine.ingest(n, t, parse(r.render()))
        engine.evaluate(t)
        t += poll
    gc.collect()
    held = _exporter_bytes() - base
    tracemalloc.stop()
    per_target = held / targets / 1024
    print(f"full hour: {targets} targets polled every {poll:.0f}s for 3600 simulated s, rules evaluated every poll | "
          f"held by the exporter's objects (history, window stats, views, alerts) {per_target:.0f} KiB per target")
    return {"targets": targets, "kib_per_target": per_target}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--targets", type=int, default=1000)
    p.add_argument("--hour-targets", type=int, default=20)
    p.add_argument("--old", default="", help="a git revision whose code is measured the same way after this checkout's")
    p.add_argument("--skip-hour", action="store_true")
    args = p.parse_args(argv)
    out = {"discovered": bench_discovered(args.targets, args.seconds, args.old or None)}
    if not args.skip_hour:
        out["full_hour"] = bench_full_hour(args.hour_targets)
    return out


if __name__ == "__main__":
    main()

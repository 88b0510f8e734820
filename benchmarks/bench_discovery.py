"""(d) one process polling 1000 discovered targets every 5 s: its CPU share of a core and
peak RSS; (e) memory per target with every 1 h window full, measured by driving the
engine on a simulated clock through a full hour (not projected).

(d) runs the real `vllm-prefix-cache-exporter run` with a file_sd file listing the
simulated replicas (served by `simulate` in other processes), and reads its /proc
counters. (e) counts what the exporter's own modules hold (tracemalloc, the simulated
replicas left out) after an hour of polls of N targets, divided by N."""
import argparse
import gc
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from urllib.parse import urlsplit

import requests

sys.path.insert(0, str(Path(__file__).parent))
from bench_sidecar import measure, start_fleet, start_sidecar_with  # noqa: E402

from exporter.sim import simulator  # noqa: E402
from exporter.config.sections import load  # noqa: E402
from exporter.monitor.engine import Engine  # noqa: E402
from exporter.parse.vllm_metrics import parse  # noqa: E402

GOAL_CPU, GOAL_KIB = 0.60, 150.0


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


def bench_discovered(targets: int, seconds: float) -> dict:
    fleets, urls = start_fleets(targets, per_process=250, rate=0.2)
    with tempfile.TemporaryDirectory() as tmp:
        sd = Path(tmp) / "sd.json"
        file_sd(urls, sd)
        sidecar, url = start_sidecar_with({"global": {"poll_interval": "5s"}, "discovery": {"file_sd": {"files": [str(sd)]}}},
                                          Path(tmp), ready_within=120.0)
        try:
            time.sleep(10)
            cpu, peak, _ = measure(sidecar, url, seconds)
            text = requests.get(url + "/metrics", timeout=30).text
            up = sum(1 for line in text.splitlines() if line.startswith("prefixcache_target_up{") and line.endswith(" 1.0"))
        finally:
            sidecar.terminate()
            sidecar.wait(timeout=30)
            for f in fleets:
                f.terminate()
                f.wait(timeout=30)
    print(f"discovered: {targets} targets from file_sd ({up} up), poll 5s, measured {seconds:.0f}s | "
          f"CPU {cpu * 100:.1f}% of one core (goal < {GOAL_CPU * 100:.0f}%) | peak RSS {peak:.1f} MB")
    return {"targets": targets, "targets_up": up, "seconds": seconds, "cpu_share": cpu, "peak_rss_mb": peak}


def _exporter_bytes() -> int:
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*exporter/*"),
                                                      tracemalloc.Filter(False, "*exporter/sim/*")])
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
          f"held by the exporter's objects (history, window stats, views, alerts) {per_target:.0f} KiB per target "
          f"(goal < {GOAL_KIB:.0f} KiB)")
    return {"targets": targets, "kib_per_target": per_target}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--targets", type=int, default=1000)
    p.add_argument("--hour-targets", type=int, default=20)
    args = p.parse_args(argv)
    return {"discovered": bench_discovered(args.targets, args.seconds), "full_hour": bench_full_hour(args.hour_targets)}


if __name__ == "__main__":
    main()

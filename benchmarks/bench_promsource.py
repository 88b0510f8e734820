"""(f) The Prometheus source at fleet size: one process reading 10,000 pods from a real
Prometheus every 15 s (discovery.read_prometheus) instead of scraping them. The pods are
simulated 100 to an endpoint (benchmarks/podfarm.py) and scraped every 15 s by the real
Prometheus with honor_labels, as many pods behind few targets. Measured in the same run:
our CPU share and peak RSS over the measured reads, Prometheus's CPU share beside it,
the time and size of one read's query, and the time one /metrics render of every pod
takes (timed once at the end: rendering 10,000 pods' series is separate from reading)."""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).parent))
from bench_sidecar import start_sidecar_with  # noqa: E402
from procstat import cpu_seconds, peak_rss_mb  # noqa: E402
from promserver import Prometheus, version  # noqa: E402

from exporter.discovery import promseries  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--pods", type=int, default=10000)
    p.add_argument("--per-endpoint", type=int, default=100)
    p.add_argument("--interval", type=float, default=15.0)
    p.add_argument("--reads", type=int, default=8, help="reads measured")
    p.add_argument("--partitions", type=int, default=8, help="queries a read is split into (discovery.read_prometheus.partitions)")
    args = p.parse_args(argv)
    groups = args.pods // args.per_endpoint
    farm = subprocess.Popen([sys.executable, str(Path(__file__).parent / "podfarm.py"), f"--groups={groups}",
                             f"--pods={args.per_endpoint}"], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(farm.stdout.readline())
        return _run(args, farm, info, groups)
    finally:
        farm.terminate()
        farm.wait(timeout=30)


def _run(args, farm, info: dict, groups: int) -> dict:
    interval = f"{args.interval:g}s"
    prom = Prometheus([{"job_name": f"pods-{g}", "honor_labels": True, "metrics_path": f"/group/{g}/metrics",
                        "static_configs": [{"targets": [f"127.0.0.1:{info['port']}"], "labels": {"group": str(g)}}],
                        "relabel_configs": [{"target_label": "job", "replacement": "pods"}]}
                       for g in range(groups)], scrape_interval=interval)
    sidecar = None
    try:
        deadline = time.monotonic() + 120
        while prom.up_targets() < groups and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(args.interval + 2)  # every endpoint scraped at least twice
        with tempfile.TemporaryDirectory() as tmp:
            cfg = {"global": {"poll_interval": interval, "connect_timeout": "2s", "read_timeout": "10s", "scrape_timeout": "12s"},
                   "discovery": {"read_prometheus": {"url": prom.url, "match_labels": {"job": "pods"}, "timeout": "60s",
                                                     "partitions": args.partitions},
                                 "target_limit": 0}}
            began = time.monotonic()
            sidecar, url = start_sidecar_with(cfg, Path(tmp), ready_within=600.0)
            ready = time.monotonic() - began
            time.sleep(args.interval)  # past the first read, which reaches back 5 minutes
            ours0, theirs0, t0 = cpu_seconds(sidecar.pid), cpu_seconds(prom.pid), time.monotonic()
            time.sleep(args.interval * args.reads)
            wall = time.monotonic() - t0
            ours, theirs = (cpu_seconds(sidecar.pid) - ours0) / wall, (cpu_seconds(prom.pid) - theirs0) / wall
            peak = peak_rss_mb(sidecar.pid)
            q0, query_mb, series = time.monotonic(), 0.0, 0
            for part in promseries.partitions("pod", args.partitions):  # one read's queries, as the reader asks them
                query = promseries.query((("job", "pods"),), args.interval + 30, part)
                answer = requests.get(prom.url + "/api/v1/query", params={"query": query, "time": f"{time.time():.3f}"}, timeout=120)
                query_mb += len(answer.content) / 2**20
                series += len(answer.json()["data"]["result"])
            query_s = time.monotonic() - q0
            r0 = time.monotonic()  # a scrape starts a render and gets the last one at once: ask until it holds every pod
            text = ""
            while text.count("prefixcache_target_up{") < args.pods * 0.99 and time.monotonic() - r0 < 600:
                text = requests.get(url + "/metrics", timeout=60).text
                time.sleep(0.5)
            render_s = time.monotonic() - r0
            up = text.count(" 1.0\n", 0) and sum(1 for line in text.splitlines()
                                                 if line.startswith("prefixcache_target_up{") and line.endswith(" 1.0"))
    finally:
        if sidecar is not None:
            sidecar.terminate()
            sidecar.wait(timeout=30)
        prom.stop()
    print(f"prometheus source: {args.pods} pods ({up} up), {info['samples_per_pod']} series each, {args.per_endpoint} a target "
          f"scraped every {interval} by {version()}, read every {interval}, {args.reads} reads measured | ours "
          f"{ours * 100:.1f}% of a core, Prometheus {theirs * 100:.1f}% (scraping and answering) | peak RSS {peak:.0f} MB | "
          f"one read's {args.partitions} queries: {series} series, {query_mb:.0f} MB, {query_s:.2f} s | ready after {ready:.0f} s | "
          f"our /metrics with every pod after {render_s:.1f} s, {len(text) / 2**20:.0f} MB")
    return {"pods": args.pods, "up": up, "cpu_share": ours, "prometheus_cpu_share": theirs, "peak_rss_mb": peak,
            "query_seconds": query_s, "query_mb": query_mb, "series": series, "ready_seconds": ready, "render_seconds": render_s}


if __name__ == "__main__":
    main()

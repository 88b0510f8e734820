"""(f) The Prometheus source at fleet size: one process reading 10,000 pods from a real
Prometheus every 15 s (discovery.read_prometheus) instead of scraping them. The pods are
simulated 100 to an endpoint (benchmarks/podfarm.py) and scraped every 15 s by the real
Prometheus with honor_labels, as many pods behind few targets. Measured in the same run:
Prometheus's CPU alone first (scraping, before any read; with the series one read's
queries select, of every name the parser reads and of those the reader asks), then per
phase the CPU the reads add (ours plus what Prometheus spends over its own) against it,
our CPU share and peak RSS over the measured reads, Prometheus's CPU share beside it, the
reads that completed meanwhile (Prometheus's count of the queries it answered: a read is
`partitions` queries; a read that outlasts the interval delays the next) and our CPU a
read, the time and size of one read's query, and the time one /metrics render of every
pod takes (timed once at the end: rendering 10,000 pods' series is separate from
reading). With --compression both, this checkout reads gzipped answers (the default) and
then plain ones (read_prometheus.compression: none). With --old REV, the code of REV is
measured the same way after this checkout's, against the same Prometheus and pods. The
phase run second has cost 18-38% more a read, whichever code it ran; --settle starts the
first phase once Prometheus holds 5 minutes of samples, as later phases find it (both
codes then cost more: the order effect is the box's, a Prometheus that holds more, not
the reader's first read)."""
import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).parent))
from bench_discovery import old_checkout  # noqa: E402
from bench_sidecar import start_sidecar_with  # noqa: E402
from procstat import cpu_seconds, peak_rss_mb, rss_mb  # noqa: E402
from promserver import Prometheus, version  # noqa: E402

from exporter.discovery import promseries  # noqa: E402
from exporter.parse.names import QUERY_NAMES, SAMPLE_NAMES  # noqa: E402
from exporter.poll.promread import MARGIN, MAX_RANGE  # noqa: E402


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser()
    p.add_argument("--pods", type=int, default=10000)
    p.add_argument("--per-endpoint", type=int, default=100)
    p.add_argument("--interval", type=float, default=15.0)
    p.add_argument("--reads", type=int, default=8, help="read intervals measured")
    p.add_argument("--partitions", type=int, default=8, help="queries a read is split into (discovery.read_prometheus.partitions)")
    p.add_argument("--old", default="", help="a git revision whose code is measured the same way after this checkout's")
    p.add_argument("--settle", action="store_true", help="start the first phase once Prometheus holds 5 minutes of samples, "
                   "as later phases find it (default: at once)")
    p.add_argument("--hold", type=float, default=0.0,
                   help="minutes each phase runs before it is measured (65: the hour windows full, as a sidecar "
                        "finds them from then on), its RSS printed every 5 minutes meanwhile")
    p.add_argument("--compression", choices=("gzip", "none", "both"), default="gzip",
                   help="read_prometheus.compression of this checkout's phase; both: a phase of each, gzip first "
                        "(the old code's phase asks for gzip, as it did)")
    args = p.parse_args(argv)
    groups = args.pods // args.per_endpoint
    farm = subprocess.Popen([sys.executable, str(Path(__file__).parent / "podfarm.py"), f"--groups={groups}",
                             f"--pods={args.per_endpoint}"], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(farm.stdout.readline())
        return _run(args, info, groups)
    finally:
        farm.terminate()
        farm.wait(timeout=30)


def _run(args, info: dict, groups: int) -> list[dict]:
    interval = f"{args.interval:g}s"
    prom = Prometheus([{"job_name": f"pods-{g}", "honor_labels": True, "metrics_path": f"/group/{g}/metrics",
                        "static_configs": [{"targets": [f"127.0.0.1:{info['port']}"], "labels": {"group": str(g)}}],
                        "relabel_configs": [{"target_label": "job", "replacement": "pods"}]}
                       for g in range(groups)], scrape_interval=interval)
    rows = []
    began = time.monotonic()
    try:
        deadline = time.monotonic() + 120
        while prom.up_targets() < groups and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(args.interval + 2)  # every endpoint scraped at least twice
        if args.settle:
            # a phase's first read reaches 5 minutes back: the first phase, at once, finds half a minute of
            # samples, the next all 5 minutes; settled, every phase finds them (and a Prometheus that has
            # held 450,000 series for 5 minutes, as the phases after the first do)
            time.sleep(max(0.0, MAX_RANGE - (time.monotonic() - began)))
        # Prometheus alone, scraping the pods, before any read: what the reads' cost is compared with
        alone0, a0 = cpu_seconds(prom.pid), time.monotonic()
        time.sleep(args.interval * args.reads)
        alone = (cpu_seconds(prom.pid) - alone0) / (time.monotonic() - a0)
        print(f"prometheus source: Prometheus alone (scraping, no reads) {alone * 100:.1f}% of a core over "
              f"{args.reads} intervals", flush=True)
        regular = args.interval + MARGIN  # a regular read's reach
        every = promseries.query((("job", "pods"),), regular).replace("|".join(QUERY_NAMES), "|".join(SAMPLE_NAMES))
        for names, asked in (("every name the parser reads", every), ("the names the reader asks", None)):
            t0, n = time.monotonic(), 0
            for part in promseries.partitions("pod", args.partitions):
                query = asked.replace("}[", f",{part}}}[") if asked and part else asked or promseries.query((("job", "pods"),), regular, part)
                n += len(requests.get(prom.url + "/api/v1/query", params={"query": query, "time": f"{time.time():.3f}"},
                                      timeout=120).json()["data"]["result"])
            print(f"prometheus source: one read's queries of {names}: {n} series, {time.monotonic() - t0:.2f} s", flush=True)
        took = {}
        for encoding in ("gzip", "identity"):  # the reader asks for gzip; plain beside it
            q0, query_mb, series = time.monotonic(), 0.0, 0
            for part in promseries.partitions("pod", args.partitions):  # one read's queries, as the reader asks them
                query = promseries.query((("job", "pods"),), regular, part)
                answer = requests.get(prom.url + "/api/v1/query", params={"query": query, "time": f"{time.time():.3f}"},
                                      headers={"Accept-Encoding": encoding}, timeout=120)
                query_mb += len(answer.content) / 2**20
                series += len(answer.json()["data"]["result"])
                del answer
            took[encoding] = time.monotonic() - q0
        query_s = took["gzip"]
        print(f"prometheus source: {args.pods} pods, {info['samples_per_pod']} series each, {args.per_endpoint} a target scraped "
              f"every {interval} by {version()}; one read's {args.partitions} queries (a {regular:g} s range): {series} series, "
              f"{query_mb:.0f} MB, {took['gzip']:.2f} s gzipped ({took['identity']:.2f} s plain) from Prometheus", flush=True)
        compressions = ("gzip", "none") if args.compression == "both" else (args.compression,)
        rows = [phase("this checkout" + ("" if c == "gzip" else f", compression {c}"), None, args, prom, c) for c in compressions]
        if args.old:  # its phase asks for gzip, as the old code did
            code = old_checkout(args.old)
            try:
                rows.append(phase(f"old: {args.old}", code, args, prom, "gzip"))
            finally:
                shutil.rmtree(code, ignore_errors=True)
    finally:
        prom.stop()
    for row in rows:
        added = row["cpu_share"] + row["prometheus_cpu_share"] - alone
        print(f"prometheus source ({row['code']}): added CPU (ours {row['cpu_share'] * 100:.1f}% + Prometheus's "
              f"{(row['prometheus_cpu_share'] - alone) * 100:+.1f}% over its {alone * 100:.1f}% alone) = "
              f"{added / alone:.2f}x Prometheus's own cost of scraping the pods", flush=True)
        row.update(prometheus_alone_cpu_share=alone, added_over_alone=added / alone)
        row.update(query_seconds=query_s, query_plain_seconds=took["identity"], query_mb=query_mb, series=series)
    return rows


def queries_answered(prom: Prometheus) -> float:
    """Prometheus's own count of the /api/v1/query requests it answered."""
    text = requests.get(prom.url + "/metrics", timeout=30).text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line)


def steady_reads(prom: Prometheus, partitions: int, interval: float) -> float:
    """Seconds until the reads are regular: the first read reaches 5 minutes back in slices
    (its later slices still run once every pod was polled once, which is when the sidecar
    is ready) and the read after it reaches back to where the first began, so both ask
    Prometheus more than `partitions` queries. Waits for a burst of exactly `partitions`
    queries (a regular read) after the last of theirs, as Prometheus counts what it answered;
    at most 20 intervals (then measured as it is, said so)."""
    began = time.monotonic()
    count, burst, last_change = queries_answered(prom), 0, time.monotonic()
    while time.monotonic() - began < 20 * interval:
        time.sleep(0.5)
        now_count = queries_answered(prom)
        if now_count != count:
            burst, count, last_change = burst + now_count - count, now_count, time.monotonic()
        elif burst and time.monotonic() - last_change >= 2.5:  # the read's queries ended
            if burst == partitions:
                return time.monotonic() - began
            burst = 0
    print(f"prometheus source: the reads were not regular within {20 * interval:g} s; measured as they are", flush=True)
    return time.monotonic() - began


def phase(label: str, code: Path | None, args, prom: Prometheus, compression: str) -> dict:
    interval = f"{args.interval:g}s"
    sidecar = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cfg = {"global": {"poll_interval": interval, "connect_timeout": "2s", "read_timeout": "10s", "scrape_timeout": "12s"},
                   "discovery": {"read_prometheus": {"url": prom.url, "match_labels": {"job": "pods"}, "timeout": "60s",
                                                     "partitions": args.partitions,
                                                     **({} if compression == "gzip" else {"compression": compression})},
                                 "target_limit": 0}}
            began = time.monotonic()
            sidecar, url = start_sidecar_with(cfg, Path(tmp), ready_within=600.0, code=code)
            ready = time.monotonic() - began
            steady = steady_reads(prom, args.partitions, args.interval)
            held = hold(sidecar.pid, args.hold * 60, label)
            ours0, theirs0, asked0, t0 = cpu_seconds(sidecar.pid), cpu_seconds(prom.pid), queries_answered(prom), time.monotonic()
            time.sleep(args.interval * args.reads)
            wall = time.monotonic() - t0
            ours_s, theirs = cpu_seconds(sidecar.pid) - ours0, (cpu_seconds(prom.pid) - theirs0) / wall
            reads = (queries_answered(prom) - asked0) / args.partitions  # its /metrics is no query: only the sidecar's count
            ours = ours_s / wall
            peak = peak_rss_mb(sidecar.pid)
            r0, render_cpu0 = time.monotonic(), cpu_seconds(sidecar.pid)  # a scrape starts a render: ask until it holds every pod
            text = ""
            while text.count("prefixcache_target_up{") < args.pods * 0.99 and time.monotonic() - r0 < 600:
                text = requests.get(url + "/metrics", timeout=60).text
                time.sleep(0.5)
            render_s, render_cpu = time.monotonic() - r0, cpu_seconds(sidecar.pid) - render_cpu0
            render_peak = peak_rss_mb(sidecar.pid)
            up = sum(1 for line in text.splitlines() if line.startswith("prefixcache_target_up{") and line.endswith(" 1.0"))
            size = len(text) / 2**20
            del text
            # as a Prometheus scraping us finds it: two reads later every pod's view changed, and is rendered anew
            time.sleep(2 * args.interval)
            requests.get(url + "/metrics", timeout=60, headers={"Accept-Encoding": "gzip"})
            time.sleep(args.interval)  # a render its scrape started, when that did not wait for it
            requests.get(url + "/metrics", timeout=60, headers={"Accept-Encoding": "gzip"})
            again_rss, again_peak = rss_mb(sidecar.pid), peak_rss_mb(sidecar.pid)
        finally:
            if sidecar is not None:
                sidecar.terminate()
                sidecar.wait(timeout=30)
    if held:
        print(f"prometheus source ({label}): held {args.hold:g} min before measuring; RSS then {held['rss_mb']:.0f} MB, its CPU "
              f"{held['cpu_share'] * 100:.1f}% of a core over the hold", flush=True)
    print(f"prometheus source ({label}): {up} of {args.pods} pods up, read every {interval}: {reads:.1f} reads completed in "
          f"{args.reads} intervals ({wall:.0f} s) | ours {ours * 100:.1f}% of a core ({ours_s / reads if reads else float('nan'):.2f} s "
          f"CPU a read), Prometheus {theirs * 100:.1f}% (scraping and answering) | peak RSS {peak:.0f} MB | ready after {ready:.0f} s "
          f"(regular {steady:.0f} s after that) | our /metrics with every pod after {render_s:.1f} s ({render_cpu:.1f} s of our CPU meanwhile), {size:.0f} MB, "
          f"peak RSS then {render_peak:.0f} MB; rendered again {2 * args.interval:g} s later: RSS {again_rss:.0f} MB, peak "
          f"{again_peak:.0f} MB", flush=True)
    return {"code": label, "pods": args.pods, "up": up, "cpu_share": ours, "cpu_seconds_a_read": ours_s / reads if reads else None,
            "reads": reads, "prometheus_cpu_share": theirs, "peak_rss_mb": peak, "ready_seconds": ready, "steady_seconds": steady, "render_seconds": render_s,
            "render_cpu_seconds": render_cpu, "render_peak_rss_mb": render_peak,
            "rendered_again_rss_mb": again_rss, "rendered_again_peak_rss_mb": again_peak, "held_minutes": args.hold,
            "held_rss_mb": held.get("rss_mb"), "held_cpu_share": held.get("cpu_share")}


def hold(pid: int, seconds: float, label: str) -> dict:
    """Lets the sidecar run `seconds` before it is measured: its history grows until the
    longest window (an hour) is full, and what it costs then is what it costs from then on.
    Prints its RSS every 5 minutes."""
    if seconds <= 0:
        return {}
    t0, c0 = time.monotonic(), cpu_seconds(pid)
    for k in range(1, int(seconds // 300) + 1):
        time.sleep(max(0.0, t0 + 300 * k - time.monotonic()))
        print(f"prometheus source ({label}): {5 * k} min: RSS {rss_mb(pid):.0f} MB (peak {peak_rss_mb(pid):.0f} MB), CPU "
              f"{(cpu_seconds(pid) - c0) / (time.monotonic() - t0) * 100:.1f}% of a core so far", flush=True)
    time.sleep(max(0.0, t0 + seconds - time.monotonic()))
    return {"rss_mb": rss_mb(pid), "cpu_share": (cpu_seconds(pid) - c0) / (time.monotonic() - t0)}


if __name__ == "__main__":
    main()

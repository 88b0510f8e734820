"""Our /metrics under a busy Prometheus: 50 concurrent scrapers, each on its own
keep-alive connection, hammer a sidecar that polls 200 simulated targets every 5 s.
Reports a single scraper's time (one at a time, the median of 20), then throughput,
p50/p99/max latency and errors of 50 at once and back to back, and their p99 as a
multiple of the single scrape's time (a ratio that holds across machines), side by side
with the same loads on /-/healthy (the server's floor, no rendering), and the same
clients on a C server that sends the same gzip bytes and does nothing else
(floorserver.c, built with the system's cc): the machine's floor, what any server's
ratio is bounded by when its clients share its cores.

Clients run in separate processes (5 x 10 threads) so that their own interpreter lock
does not become the bottleneck being measured. With --old REV, the code of REV is measured
the same way right after, against the same simulated targets."""
import argparse
import http.client
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from bench_discovery import this_and_old  # noqa: E402
from procstat import cpu_seconds  # noqa: E402
from promserver import Prometheus, version  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client_process(port: int, path: str, threads: int, seconds: float, out, interval: float = 0.0, start_at: float = 0.0) -> None:
    """Each thread is one scraper on its own keep-alive connection: with `interval`, all
    scrape at the same instant every interval (aligned, the worst case of concurrency);
    without, back to back (a closed loop: saturation). The first aligned burst is kept
    apart: its connections are new, and it comes after seconds without a scrape, so it
    waits for the state as it is now by design (a scrape after a quiet does); the
    steady state is every burst after it."""
    latencies, errors, first = [], [0], []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        mine = []
        tick = 0
        while time.monotonic() < stop_at:
            if interval:
                tick += 1
                wait = start_at + tick * interval - time.time()
                if wait > 0:
                    time.sleep(wait)
            start = time.perf_counter()
            try:
                conn.request("GET", path, headers={"Accept-Encoding": "gzip"})
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            elapsed = time.perf_counter() - start
            if ok:
                (first if interval and tick == 1 else mine).append(elapsed)
            else:
                with lock:
                    errors[0] += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put((latencies, errors[0], first))


def load(port: int, path: str, scrapers: int, seconds: float, interval: float = 0.0) -> dict:
    processes = 5
    queue = multiprocessing.Queue()
    start_at = time.time() + 1.0
    procs = [multiprocessing.Process(target=_client_process, args=(port, path, scrapers // processes, seconds, queue, interval, start_at))
             for _ in range(processes)]
    for p in procs:
        p.start()
    latencies, errors, first = [], 0, []
    for _ in procs:
        lat, err, first_burst = queue.get(timeout=seconds + 60)
        latencies += lat
        errors += err
        first += first_burst
    for p in procs:
        p.join()
    return {"requests": len(latencies), "errors": errors, "rps": len(latencies) / seconds, **milliseconds(latencies),
            "first_burst_max_ms": max(first, default=0.0) * 1000}


def milliseconds(seconds: list[float]) -> dict:
    """p50, p99 and max of durations, in ms; under 100 of them the p50 is their median
    and the p99 their maximum."""
    ordered = sorted(seconds) or [0.0]
    if len(ordered) >= 100:
        q = statistics.quantiles(ordered, n=100)
        p50, p99 = q[49], q[98]
    else:
        p50, p99 = statistics.median(ordered), ordered[-1]
    return {"p50_ms": p50 * 1000, "p99_ms": p99 * 1000, "max_ms": ordered[-1] * 1000}


def prometheus_scrapers(port: int, scrapers: int, seconds: float, interval: float, ours: int) -> dict:
    """`scrapers` scrape loops of one real Prometheus on our /metrics, each every
    `interval` at the offset Prometheus gives a loop (a hash of its labels: spread over the
    interval, as the loops of that many Prometheus servers are), every sample dropped after
    parsing so that Prometheus's storage does not take the 2 cores; each scrape's time as
    Prometheus measures it (scrape_duration_seconds: the request, the answer read and
    decompressed, parsed), the scrapes that failed (up == 0), and the CPU shares of
    Prometheus and of our process (pid `ours`) meanwhile: on 2 cores, the scrapers' own
    work competes with our server's."""
    every = f"{interval:g}s"
    jobs = [{"job_name": f"scraper-{i}", "scrape_interval": every, "scrape_timeout": every,
             "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
             "metric_relabel_configs": [{"source_labels": ["__name__"], "regex": ".+", "action": "drop"}]}
            for i in range(scrapers)]
    prom = Prometheus(jobs, scrape_interval=every, scrape_timeout=every)
    try:
        time.sleep(2 * interval + 1)  # every loop past its first scrape
        end = time.time() + seconds
        theirs0, ours0 = cpu_seconds(prom.pid), cpu_seconds(ours)
        time.sleep(seconds)
        theirs_cpu, ours_cpu = (cpu_seconds(prom.pid) - theirs0) / seconds, (cpu_seconds(ours) - ours0) / seconds

        def samples(query: str) -> list[float]:
            answer = requests.get(prom.url + "/api/v1/query", params={"query": f"{query}[{seconds:g}s]", "time": f"{end:.3f}"},
                                  timeout=30).json()["data"]["result"]
            return [float(v) for series in answer for _, v in series["values"]]
        durations, up = samples("scrape_duration_seconds"), samples("up")
    finally:
        prom.stop()
    return {"scrapes": len(durations), "failed": sum(1 for v in up if v == 0.0), **milliseconds(durations),
            "prometheus_cpu_share": theirs_cpu, "our_cpu_share": ours_cpu}


def single_scrape_ms(url: str) -> float:
    """One scraper alone on its keep-alive connection: the median of 20, gzip asked."""
    single = []
    with requests.Session() as one:
        for _ in range(20):
            began = time.perf_counter()
            one.get(url, headers={"Accept-Encoding": "gzip"}, timeout=10).content
            single.append(time.perf_counter() - began)
            time.sleep(0.25)
    return statistics.median(single) * 1000


def machine_floor(body: bytes, scrapers: int, seconds: float) -> dict | None:
    """The same clients, one alone and all at once every second, on floorserver.c sending
    `body` (our gzipped answer); None where no C compiler is installed."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        binary, answer, port = Path(tmp) / "floorserver", Path(tmp) / "answer.gz", free_port()
        subprocess.run([cc, "-O2", "-pthread", "-o", str(binary), str(Path(__file__).parent / "floorserver.c")], check=True, timeout=120)
        answer.write_bytes(body)
        server = subprocess.Popen([str(binary), str(answer), str(port)])
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            single_ms = single_scrape_ms(f"http://127.0.0.1:{port}/metrics")
            aligned = load(port, "/metrics", scrapers, seconds, interval=1.0)
        finally:
            server.terminate()
            server.wait(timeout=10)
    return {"single_ms": single_ms, "aligned": aligned}


def phase(label: str, code: Path | None, urls: list[str], args) -> dict:
    """One sidecar (this checkout's code, or `code`'s) polling `urls`, measured under every load."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.yml"
        cfg.write_text(yaml.safe_dump({"global": {"poll_interval": args.poll, "connect_timeout": "500ms", "read_timeout": "1s"},
                                       "targets": [{"name": f"vllm-{i}", "url": u} for i, u in enumerate(urls)]}))
        env = {**os.environ, "PYTHONPATH": str(code)} if code is not None else None
        sidecar = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={cfg}",
                                    f"--web.listen-address=127.0.0.1:{port}", "--log.level=warning"], cwd=code, env=env)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if requests.get(f"http://127.0.0.1:{port}/-/ready", timeout=1).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                time.sleep(0.2)
            time.sleep(3)
            size = len(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).content)
            single_ms = single_scrape_ms(f"http://127.0.0.1:{port}/metrics")
            aligned = load(port, "/metrics", args.scrapers, args.seconds, interval=1.0)
            floor_aligned = load(port, "/-/healthy", args.scrapers, args.seconds / 2, interval=1.0)
            floor = load(port, "/-/healthy", args.scrapers, args.seconds / 2)
            metrics = load(port, "/metrics", args.scrapers, args.seconds)
            real_one = prometheus_scrapers(port, 1, args.seconds, 1.0, sidecar.pid)
            real = prometheus_scrapers(port, args.scrapers, args.seconds, 1.0, sidecar.pid)
            gzipped = requests.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"}, stream=True,
                                   timeout=10).raw.read()
        finally:
            sidecar.terminate()
            sidecar.wait(timeout=30)
    print(f"scrapers ({label}): one scraper alone on /metrics ({args.targets} targets polled every {args.poll}, exposition "
          f"{size / 1024:.0f} KiB, gzip): median {single_ms:.1f} ms of 20")
    for name, mode, r in (("/metrics", "all scraping at once every 1 s", aligned), ("/-/healthy", "all at once every 1 s", floor_aligned),
                          ("/-/healthy", "back to back, saturation", floor), ("/metrics", "back to back, saturation", metrics)):
        print(f"scrapers ({label}): {args.scrapers} concurrent on {name}, {mode} ({args.targets} targets polled every {args.poll}"
              f"{f', exposition {size / 1024:.0f} KiB' if name == '/metrics' else ''}) | {r['rps']:.0f} req/s | "
              f"p50 {r['p50_ms']:.1f} ms | p99 {r['p99_ms']:.1f} ms | max {r['max_ms']:.1f} ms | errors {r['errors']} of "
              f"{r['requests'] + r['errors']}")
    print(f"scrapers ({label}): {args.scrapers} at once every second: p99 {aligned['p99_ms']:.1f} ms = {aligned['p99_ms'] / single_ms:.1f}x one "
          f"scrape alone, {aligned['errors']} errors (their first burst, not counted: max {aligned['first_burst_max_ms']:.1f} ms); /-/healthy the same way (no rendering, a 9-byte answer): p99 "
          f"{floor_aligned['p99_ms']:.1f} ms (saturated, back to back: p99 {metrics['p99_ms']:.1f} ms, {metrics['errors']} "
          f"errors; 2 cores shared by the server and the 50 clients)")
    print(f"scrapers ({label}): {version()} scraping /metrics every 1 s, its loops at their own offsets: one loop alone p50 "
          f"{real_one['p50_ms']:.1f} ms, p99 {real_one['p99_ms']:.1f} ms ({real_one['scrapes']} scrapes); {args.scrapers} loops: "
          f"p50 {real['p50_ms']:.1f} ms, p99 {real['p99_ms']:.1f} ms = {real['p99_ms'] / real_one['p50_ms']:.1f}x one loop's "
          f"median, max {real['max_ms']:.1f} ms, {real['failed']} of {real['scrapes']} failed (scrape_duration_seconds: "
          f"request, read, gunzip and parse, as Prometheus times a scrape); CPU meanwhile: Prometheus "
          f"{real['prometheus_cpu_share'] * 100:.0f}% of a core, ours {real['our_cpu_share'] * 100:.0f}% "
          f"(one loop: {real_one['prometheus_cpu_share'] * 100:.0f}%, {real_one['our_cpu_share'] * 100:.0f}%)")
    floor_of_machine = machine_floor(gzipped, args.scrapers, args.seconds) if code is None else None  # the same for both codes
    if floor_of_machine is not None:
        f = floor_of_machine
        print(f"scrapers ({label}): the machine's floor, the same clients on a C server sending the same {len(gzipped) / 1024:.0f} KiB "
              f"and nothing else (benchmarks/floorserver.c): one alone {f['single_ms']:.2f} ms, {args.scrapers} at once every second "
              f"p99 {f['aligned']['p99_ms']:.1f} ms = {f['aligned']['p99_ms'] / f['single_ms']:.1f}x, {f['aligned']['errors']} errors")
    elif code is None:
        print(f"scrapers ({label}): no C compiler (cc): the machine's floor is not measured")
    return {"code": label, "single_ms": single_ms, "aligned": aligned, "healthy_aligned": floor_aligned, "healthy": floor,
            "metrics": metrics, "exposition_bytes": size, "prometheus_one": real_one, "prometheus_scrapers": real,
            "machine_floor": floor_of_machine}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser()
    p.add_argument("--targets", type=int, default=200)
    p.add_argument("--poll", default="5s")
    p.add_argument("--scrapers", type=int, default=50)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--old", default="", help="a git revision whose code is measured the same way after this checkout's")
    args = p.parse_args(argv)
    fleet = subprocess.Popen([sys.executable, "-m", "exporter", "simulate", f"--replicas={args.targets}", "--rate=2"],
                             stdout=subprocess.PIPE, text=True)
    rows = []
    try:
        urls = json.loads(fleet.stdout.readline())["targets"]
        rows = this_and_old(lambda label, code: phase(label, code, urls, args), args.old)
    finally:
        fleet.terminate()
        fleet.wait(timeout=30)
    return rows


if __name__ == "__main__":
    main()

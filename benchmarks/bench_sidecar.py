"""(b) one sidecar polling 200 simulated targets every 5 s, served by another process:
its CPU share and peak RSS; (c) an idle sidecar with one target: its peak RSS.

Both run the real `vllm-prefix-cache-exporter run` in a child process and read its
/proc counters. A run shorter than the longest window (1h) has not filled the history
yet, so (b) also measures, in this process, what a full hour of history for one target
costs and prints the peak RSS that adds up to at a full window."""
import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import requests
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from procstat import cpu_seconds, peak_rss_mb, rss_mb  # noqa: E402

from exporter.sim import simulator  # noqa: E402
from exporter.parse.vllm_metrics import parse  # noqa: E402
from exporter.monitor.engine import _FINE_SECONDS, _MID_SECONDS, _MID_STEP  # noqa: E402
from exporter.series.history import History  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_fleet(replicas: int, rate: float):
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "simulate", f"--replicas={replicas}", f"--rate={rate}"],
                            stdout=subprocess.PIPE, text=True)
    info = json.loads(proc.stdout.readline())
    return proc, info["targets"]


def start_sidecar(targets, workdir: Path, poll: str = "5s"):
    cfg = {"global": {"poll_interval": poll}, "targets": [{"name": f"vllm-{i}", "url": u} for i, u in enumerate(targets)]}
    return start_sidecar_with(cfg, workdir)


def start_sidecar_with(cfg: dict, workdir: Path, ready_within: float = 20.0, code: Path | None = None):
    """`vllm-prefix-cache-exporter run` with this config, once its /-/ready answers 200;
    `code`: a checkout whose package runs instead of this one (old code beside new)."""
    import os
    port = free_port()
    path = workdir / "config.yml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(code)} if code is not None else None
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={path}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warning"], cwd=code, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_within
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/-/ready", timeout=2).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.1)
    proc.terminate()
    raise RuntimeError("sidecar did not become ready")


def measure(proc, url, seconds: float, scrape_every: float = 15.0):
    """CPU share over `seconds` while a Prometheus-like client scrapes /metrics."""
    start_cpu, start = cpu_seconds(proc.pid), time.monotonic()
    next_scrape = start
    while time.monotonic() - start < seconds:
        if time.monotonic() >= next_scrape:
            requests.get(url + "/metrics", timeout=10)
            next_scrape += scrape_every
        time.sleep(0.5)
    wall = time.monotonic() - start
    return (cpu_seconds(proc.pid) - start_cpu) / wall, peak_rss_mb(proc.pid), rss_mb(proc.pid)


def _history_bytes() -> int:
    # the history's storage moved out of window.py into history.py and modellog.py: count all three
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, f"*exporter/{name}.py")
                                                      for name in ("history", "modellog", "window")])
    return sum(stat.size for stat in snap.statistics("filename"))


def full_hour_history_mb(poll: float = 5.0) -> tuple[float, float]:
    """Memory one target's History holds after 5 min and after a full 1h (allocations
    made in history.py, modellog.py and window.py only; the simulated replica is not
    counted), simulated clock."""
    replica = simulator.Replica("r", simulator.Scenario(request_rate=1.0), start=0.0, seed=1)
    history = History(3600 + poll, _FINE_SECONDS, mid_seconds=_MID_SECONDS, mid_step=_MID_STEP)
    tracemalloc.start()
    at_5m = None
    t = 0.0
    while t <= 3600:
        replica.advance(t)
        history.append(t, parse(replica.render()))
        if at_5m is None and t >= 300:
            at_5m = _history_bytes()
        t += poll
    full = _history_bytes()
    tracemalloc.stop()
    return at_5m / 2**20, full / 2**20


def bench_fleet(seconds: float, targets: int = 200) -> dict:
    fleet, urls = start_fleet(targets, rate=1.0)
    with tempfile.TemporaryDirectory() as tmp:
        sidecar, url = start_sidecar(urls, Path(tmp))
        try:
            time.sleep(10)  # let every target be polled a few times
            cpu, peak, rss = measure(sidecar, url, seconds)
            up = sum(1 for line in requests.get(url + "/metrics", timeout=10).text.splitlines()
                     if line.startswith("prefixcache_target_up{") and line.endswith(" 1.0"))
        finally:
            sidecar.terminate()
            sidecar.wait(timeout=30)
            fleet.terminate()
            fleet.wait(timeout=30)
    h5, h60 = full_hour_history_mb()
    projected = peak + targets * (h60 - h5 * min(1.0, (seconds + 10) / 300))
    result = {"targets": targets, "targets_up": up, "seconds": seconds, "cpu_share": cpu, "peak_rss_mb": peak,
              "history_mb_per_target_5m": h5, "history_mb_per_target_1h": h60, "projected_peak_rss_mb_full_window": projected}
    print(f"fleet: {targets} targets ({up} up), poll 5s, measured {seconds:.0f}s | CPU {cpu * 100:.1f}% of one core (goal <= 25%) | "
          f"peak RSS {peak:.1f} MB (goal <= 120 MB) | history per target {h5 * 1024:.0f} KiB at 5m, {h60 * 1024:.0f} KiB at 1h | "
          f"peak RSS with every 1h window full (measured peak + measured history growth) {projected:.1f} MB")
    return result


def bench_idle(seconds: float) -> dict:
    fleet, urls = start_fleet(1, rate=1.0)
    with tempfile.TemporaryDirectory() as tmp:
        sidecar, url = start_sidecar(urls, Path(tmp))
        try:
            cpu, peak, rss = measure(sidecar, url, seconds)
        finally:
            sidecar.terminate()
            sidecar.wait(timeout=30)
            fleet.terminate()
            fleet.wait(timeout=30)
    print(f"idle: 1 target, measured {seconds:.0f}s | CPU {cpu * 100:.2f}% of one core | peak RSS {peak:.1f} MB (goal <= 45 MB)")
    return {"seconds": seconds, "cpu_share": cpu, "peak_rss_mb": peak}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--targets", type=int, default=200)
    args = p.parse_args(argv)
    return {"fleet": bench_fleet(args.seconds, args.targets), "idle": bench_idle(min(args.seconds, 30.0))}


if __name__ == "__main__":
    main()

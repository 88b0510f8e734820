"""Command line: subcommands, wiring, exit codes. The only module that exits."""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from prometheus_client import CollectorRegistry

from . import __version__, config as config_mod, console, simulator
from .collector import PrefixCacheCollector
from .config import Config, ConfigError, Target
from .http import App, Server
from .poller import Poller
from .scrape import Scraper, SUCCESS
from .state import State
from .vllm_metrics import parse

log = logging.getLogger("exporter")

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


@dataclass
class Sidecar:
    """Everything `run` and `demo` start, wired one way: poller -> state -> collector/HTTP."""

    config: Config
    state: State
    registry: CollectorRegistry
    poller: Poller
    app: App
    server: Server

    def start(self) -> "Sidecar":
        self.server.start()
        self.poller.start()
        return self

    def stop(self) -> None:
        self.poller.stop()
        self.server.stop()

    def reload(self, path: str) -> bool:
        try:
            new = config_mod.load_file(path)
            config_mod.parse_listen_address(new.web.listen_address)
        except ConfigError as exc:
            self.state.set_process(config_reload_success=False)
            for err in exc.errors:
                log.error("reload failed, keeping the old config: %s", err)
            return False
        if new.web.listen_address != self.config.web.listen_address:
            log.warning("reload: web.listen_address changes need a restart; keeping %s", self.config.web.listen_address)
            new = replace(new, web=self.config.web)
        self.poller.reload(new)
        self.config = new
        self.state.set_process(config_reload_success=True, config_reload_time=time.time())
        log.info("reloaded config from %s: %d targets", path, len(new.targets))
        return True


def build_sidecar(cfg: Config, listen: str, clock: Callable[[], float] = time.time) -> Sidecar:
    state = State()
    state.set_process(config_reload_success=True, config_reload_time=time.time(), started=time.time())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, [w for w, _ in cfg.global_.windows]))
    poller = Poller(cfg, state, clock=clock)
    app = App(state, registry)
    host, port = config_mod.parse_listen_address(listen)
    server = Server(app, host, port)
    return Sidecar(cfg, state, registry, poller, app, server)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


# --- subcommands -------------------------------------------------------------------------
def cmd_check_config(args) -> int:
    try:
        cfg = config_mod.load_file(args.file)
    except ConfigError as exc:
        for err in exc.errors:
            print(f"error: {err}", file=sys.stderr)
        print(f"{args.file}: {len(exc.errors)} error(s)", file=sys.stderr)
        return EXIT_USAGE
    print(f"{args.file}: OK, {len(cfg.targets)} target(s)")
    return EXIT_OK


def cmd_parse(args) -> int:
    try:
        text = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8", errors="replace").read()
    except OSError as exc:
        print(f"error: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return EXIT_ERROR
    snap = parse(text)
    json.dump(snap.to_json(), sys.stdout, indent=None)
    sys.stdout.write("\n")
    for w in snap.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if not snap.series:
        print("error: no vLLM prefix-cache series found", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _load_run_config(args) -> Config:
    path = args.config_file or os.environ.get(config_mod.ENV_CONFIG_FILE)
    if not path:
        raise ConfigError([f"no config: pass --config.file or set {config_mod.ENV_CONFIG_FILE}"])
    args.config_file = path
    return config_mod.load_file(path)


def cmd_run(args) -> int:
    try:
        cfg = _load_run_config(args)
        listen = args.listen_address or cfg.web.listen_address
        config_mod.parse_listen_address(listen)
    except (ConfigError, ValueError) as exc:
        for err in getattr(exc, "errors", [str(exc)]):
            log.error("config: %s", err)
        return EXIT_USAGE
    try:
        sidecar = build_sidecar(cfg, listen)
    except OSError as exc:
        log.error("cannot listen on %s: %s", listen, exc.strerror)
        return EXIT_ERROR
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=sidecar.reload, args=(args.config_file,), daemon=True).start())
    sidecar.start()
    log.info("listening on %s:%d, polling %d target(s) every %gs", listen.rpartition(":")[0] or "0.0.0.0",
             sidecar.server.port, len(cfg.targets), cfg.global_.poll_interval)
    stop.wait()
    log.info("shutting down")
    sidecar.stop()
    return EXIT_OK


def demo_config(fleet: simulator.Fleet, names: Sequence[str], listen: str) -> Config:
    return Config(
        targets=tuple(Target(name=n, url=fleet.metrics_url(n)) for n in names),
        global_=config_mod.GlobalConfig(poll_interval=1.0, connect_timeout=0.5, read_timeout=1.0,
                                        windows=(("10s", 10.0), ("1m", 60.0), ("5m", 300.0)), jitter=0.0),
        web=config_mod.WebConfig(listen_address=listen),
    )


def cmd_demo(args) -> int:
    duration = args.duration
    now = time.time()
    deploy_at = duration * 0.4
    names = ("vllm-0", "vllm-1")
    warm = 300.0  # simulated minutes of healthy traffic before the demo starts
    replicas = [simulator.Replica(n, simulator.incident(warm + deploy_at), start=now - warm, seed=i) for i, n in enumerate(names)]
    for r in replicas:
        r.advance(now)
    fleet = simulator.Fleet(replicas, clock=time.time).start()
    cfg = demo_config(fleet, names, args.listen_address)
    try:
        sidecar = build_sidecar(cfg, cfg.web.listen_address).start()
    except OSError as exc:
        fleet.stop()
        print(f"error: cannot listen on {cfg.web.listen_address}: {exc.strerror} (try --web.listen-address=127.0.0.1:0)", file=sys.stderr)
        return EXIT_ERROR
    out = sys.stdout
    print(f"demo: 2 simulated vLLM replicas at http://127.0.0.1:{fleet.port}/<name>/metrics; "
          f"exporter at http://127.0.0.1:{sidecar.server.port}/metrics", file=out)
    print(f"demo: at t={deploy_at:.0f}s a client deploy puts 'Current date and time: ...' at the top of the system prompt", file=out)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    windows = [w for w, _ in cfg.global_.windows]
    before: list[float] = []
    after: list[float] = []
    announced = False
    try:
        while not stop.is_set():
            elapsed = time.time() - now
            if elapsed >= duration:
                break
            if elapsed >= deploy_at and not announced:
                print(f"demo: t={elapsed:.1f}s deploy v42 rolled out", file=out)
                announced = True
            views = sidecar.state.targets()
            print(console.table(views, elapsed, windows), file=out, flush=True)
            ratios = [s[windows[0]].hit_ratio for v in views for s in v.stats.values() if s[windows[0]].hit_ratio is not None]
            if ratios:
                (before if elapsed < deploy_at else after).append(sum(ratios) / len(ratios))
            stop.wait(min(2.0, max(0.0, duration - elapsed)))
    finally:
        sidecar.stop()
        fleet.stop()
    if before and after:
        print(f"demo: hit rate {windows[0]} before the deploy {before[-1] * 100:.1f}%, at the end {after[-1] * 100:.1f}%", file=out)
    return EXIT_OK


def cmd_record(args) -> int:
    scraper = Scraper(args.target, 2.0, max(1.0, args.interval), 16 * 1024 * 1024)
    name = args.name or args.target
    deadline = time.monotonic() + args.duration
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        out = open(args.out, "a", encoding="utf-8")
    except OSError as exc:
        print(f"error: cannot open {args.out}: {exc.strerror}", file=sys.stderr)
        return EXIT_ERROR
    count = 0
    with out:
        while not stop.is_set() and time.monotonic() < deadline:
            t = time.time()
            res = scraper.scrape()
            line = {"t": t, "target": name}
            if res.result == SUCCESS:
                line["body"] = res.body
            else:
                line["error"] = res.error or res.result
                print(f"warning: scrape failed: {line['error']}", file=sys.stderr)
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
            out.flush()
            count += 1
            stop.wait(max(0.0, min(args.interval, deadline - time.monotonic())))
    print(f"recorded {count} scrape(s) of {args.target} to {args.out}", file=sys.stderr)
    return EXIT_OK


SCENARIOS = {
    "healthy": lambda a: simulator.Scenario(request_rate=a.rate),
    "incident": lambda a: simulator.incident(a.event_at, request_rate=a.rate),
    "kv_pressure": lambda a: simulator.kv_pressure(a.event_at, 300.0, request_rate=a.rate),
}


def cmd_simulate(args) -> int:
    now = time.time()
    replicas = [simulator.Replica(f"vllm-{i}", SCENARIOS[args.scenario](args), start=now, seed=i, generation=args.generation)
                for i in range(args.replicas)]
    try:
        fleet = simulator.Fleet(replicas, clock=time.time, port=args.port).start()
    except OSError as exc:
        print(f"error: cannot listen on port {args.port}: {exc.strerror}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps({"port": fleet.port, "targets": [fleet.metrics_url(r.name) for r in replicas]}), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait(args.duration if args.duration > 0 else None)
    fleet.stop()
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-prefix-cache-exporter", description="Prometheus exporter and alerting sidecar for vLLM prefix caching.")
    p.add_argument("--version", action="version", version=__version__)
    p.add_argument("--log.level", dest="log_level", default="info", choices=["debug", "info", "warn", "warning", "error"])
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the sidecar")
    run.add_argument("--config.file", dest="config_file", default=None, help=f"YAML config (or ${config_mod.ENV_CONFIG_FILE})")
    run.add_argument("--web.listen-address", dest="listen_address", default=None, help="HOST:PORT (default :9464 or web.listen_address)")
    run.add_argument("--log.level", dest="log_level", default=argparse.SUPPRESS, choices=["debug", "info", "warn", "warning", "error"])
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="play the incident on a simulated vLLM fleet")
    demo.add_argument("--duration", type=float, default=90.0)
    demo.add_argument("--web.listen-address", dest="listen_address", default="127.0.0.1:9464")
    demo.set_defaults(func=cmd_demo)

    check = sub.add_parser("check-config", help="validate a config file")
    check.add_argument("file")
    check.set_defaults(func=cmd_check_config)

    parse_cmd = sub.add_parser("parse", help="print the normalized snapshot of one /metrics text as JSON")
    parse_cmd.add_argument("file", nargs="?", default="-")
    parse_cmd.set_defaults(func=cmd_parse)

    rec = sub.add_parser("record", help="append scrapes of a target to a recording")
    rec.add_argument("--target", required=True, help="the /metrics URL")
    rec.add_argument("--name", default=None, help="target name in the recording (default: the URL)")
    rec.add_argument("--out", required=True)
    rec.add_argument("--interval", type=float, default=5.0)
    rec.add_argument("--duration", type=float, default=300.0)
    rec.set_defaults(func=cmd_record)

    sim = sub.add_parser("simulate", help="serve simulated vLLM replicas on 127.0.0.1")
    sim.add_argument("--replicas", type=int, default=2)
    sim.add_argument("--port", type=int, default=0)
    sim.add_argument("--generation", choices=simulator.GENERATIONS, default="current")
    sim.add_argument("--scenario", choices=sorted(SCENARIOS), default="healthy")
    sim.add_argument("--rate", type=float, default=5.0, help="requests/s per replica")
    sim.add_argument("--event-at", dest="event_at", type=float, default=60.0)
    sim.add_argument("--duration", type=float, default=0.0, help="seconds; 0 serves until stopped")
    sim.set_defaults(func=cmd_simulate)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.log_level)
    return args.func(args)

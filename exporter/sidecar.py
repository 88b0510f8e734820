"""The composition root: the sidecar's parts built and wired one way (poller -> engine -> state -> collector/HTTP,
transitions -> notifier), its reload policy (what a SIGHUP may change), and the `run` and `check-config` commands."""
from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from .config import sections as config_mod
from .config.discovery import parse_shard
from .config.load import load_file
from .config.reader import parse_listen_address
from .config.sections import Config, ConfigError
from .discovery.annotations import AnnotationsWatcher
from .exitcodes import EXIT_ERROR, EXIT_OK
from .logs import one_line
from .notify.alertmanager import Notifier
from .peers.urls import redact_url
from .poll.poller import Poller
from .poll.warmup import Warmer
from .serve.app import App, analysis_handlers, deploy_handlers
from .serve.collector import PrefixCacheCollector
from .serve.exposition import ReservedNames
from .serve import gcpacer, heaptrim
from .serve.server import Server
from .serve.state import State
from .serve.webconfig import WebSecurity, load_web_config
from .steadyclock import SteadyClock
from .stopping import ignore_signals, on_signals, stop_event

log = logging.getLogger("exporter")


@dataclass
class Sidecar:
    """Everything `run` and `demo` start, wired one way:
    poller -> engine -> state -> collector/HTTP, and transitions -> notifier."""

    config: Config
    state: State
    registry: CollectorRegistry
    poller: Poller
    app: App
    server: Server
    notifier: Notifier
    warmer: Warmer
    shard: str | None = None  # --shard, which outlives reloads
    web_config_file: str | None = None  # --web.config.file, re-read on every reload

    def start(self) -> "Sidecar":
        self.server.start()
        self.notifier.start()
        self.poller.start()
        return self

    def stop(self, budget: float = 5.0) -> bool:
        """Stop polling, give Alertmanager deliveries what is left of `budget` seconds in
        all, stop serving: no peer, however slow, holds the stop past its budget. False
        when a poll still waits on its target (it ends at its own scrape deadline)."""
        deadline = time.monotonic() + budget
        idle = self.poller.stop(min(2.0, budget / 3))
        self.warmer.stop(min(1.0, max(0.0, deadline - time.monotonic()) / 2))
        self.notifier.stop(max(0.5, deadline - time.monotonic()))
        self.server.stop()
        return idle

    def reload(self, path: str) -> bool:
        """The config file and the web config again; then discovery's sources are asked
        under no lock and for at most the poller's reload_discovery_budget: a slow or dead
        peer never holds the reads waiting on reload_lock, and SIGTERM (which closes
        discovery first) never waits for it."""
        with self.poller.reload_lock:  # concurrent SIGHUPs (and discovery's changes) apply one after the other
            config_ok = self._reload(path)
            web_ok = self._reload_web_config()
        if config_ok and self.poller.scheduler.running:
            self.poller.discover(self.poller.reload_discovery_budget)
        return web_ok and config_ok

    def _reload_web_config(self) -> bool:
        """Users, headers and TLS settings of --web.config.file from the next request or
        connection on (a removed user is refused at once); a bad file keeps the old one."""
        if not self.web_config_file:
            return True
        try:
            security = load_web_config(self.web_config_file)
            self.server.secure(security)
        except ConfigError as exc:
            self.state.update(config_reload_success=False)
            log.error("reload failed, keeping the old web config of %s: %s", self.web_config_file, "; ".join(exc.errors))
            return False
        self.app.secure(security)
        log.info("reloaded the web config from %s", self.web_config_file)
        return True

    def _reload(self, path: str) -> bool:
        try:
            new = with_shard(load_file(path), self.shard)
            parse_listen_address(new.web.listen_address)
        except ConfigError as exc:
            self.state.update(config_reload_success=False)
            for err in exc.errors:
                log.error("reload failed, keeping the old config: %s", err)
            return False
        except Exception as exc:  # a config no check foresaw must not end the reload thread unreported
            self.state.update(config_reload_success=False)
            log.error("reload failed, keeping the old config: %s: %s", type(exc).__name__, exc)
            log.debug("reload failure", exc_info=True)
            return False
        if new.web.listen_address != self.config.web.listen_address:
            log.warning("reload: web.listen_address changes need a restart; keeping %s", self.config.web.listen_address)
            new = replace(new, web=self.config.web)
        for section in ("alertmanager", "warmup"):
            if getattr(new, section) != getattr(self.config, section):
                log.warning("reload: %s changes need a restart; keeping the old settings", section)
                new = replace(new, **{section: getattr(self.config, section)})
        # the deploy API's token and api_open are re-read (rotation without a restart); the annotations file is not
        if replace(new.deploys, api_token="", api_open=False) != replace(self.config.deploys, api_token="", api_open=False):
            log.warning("reload: deploys.annotations_file and annotation_key changes need a restart; keeping the old ones")
            new = replace(new, deploys=replace(self.config.deploys, api_token=new.deploys.api_token, api_open=new.deploys.api_open))
        if new.deploys.api_token != self.config.deploys.api_token:
            log.info("reload: the deploy API token changed")
        self.poller.reload(new, refresh=False)  # the caller refreshes discovery once it let go of reload_lock
        self.config = new
        self.state.update(config_reload_success=True, config_reload_time=time.time())
        log.info("reloaded config from %s: %d static target(s), %d polled", path, len(new.targets), len(self.poller.current.targets))
        return True


# The sidecar keeps a large, slowly changing set of objects (histories, window stats of
# every model) and allocates a new generation of them every poll. Python's default
# thresholds run a full collection every few polls of a big target, whose cost grows
# with everything alive; fewer young collections keep a poll's cost linear in what the
# target sends (benchmarks/bench_ingest.py measures both settings side by side).
GC_THRESHOLDS = (50_000, 20, 20)


def tune_gc() -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    gc.freeze()  # what start-up allocated is never garbage: keep it out of every collection


def raise_file_limit() -> None:
    """The soft limit on open files up to the hard one, as Go programs (Prometheus, the
    exporters) do at start: every target's kept-alive connection, every scraper's and every
    peer's is a file, and a soft limit of 1024 is reached near a thousand targets."""
    try:
        import resource
    except ImportError:  # not a Unix
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as exc:
            log.debug("open files limit stays %d: %s", soft, exc)


def build_sidecar(cfg: Config, listen: str, clock: Callable[[], float] = time.time, security: WebSecurity | None = None,
                  on_transitions: Callable[[list], None] | None = None) -> Sidecar:
    state = State()
    state.update(config_reload_success=True, config_reload_time=time.time())
    # ours, rendered from per-target fragments when the state changed; the process's own memory,
    # CPU and GC (what the benchmarks measure, visible in production) read on every scrape
    collector = PrefixCacheCollector(state, [w for w, _ in cfg.global_.windows], cfg.kv_events.top_groups)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReservedNames(collector))  # no runtime collector may take one of our names
    for runtime_collector in (ProcessCollector, GCCollector, PlatformCollector):
        runtime_collector(registry=registry)
    host, port = parse_listen_address(listen)
    generator = cfg.web.external_url or f"http://{socket.gethostname()}:{port}/"
    notifier = Notifier(cfg.alertmanager, generator, clock)
    state.update(alertmanagers_discovered=notifier.discovered())
    sources = []
    if cfg.deploys.annotations_file:
        sources.append(AnnotationsWatcher(cfg.deploys.annotations_file, cfg.deploys.annotation_key).poll)
    sidecar: Sidecar  # made last; the callbacks read its config when called, as reloads change it
    warmer = Warmer(cfg.warmup, clock)

    def on_evaluated(transitions, engine_firing) -> None:
        if on_transitions is not None and transitions:
            on_transitions(transitions)
        notifier.transitions(transitions)
        notifier.resend(engine_firing)
        state.update(alertmanager=tuple(notifier.stats()), alertmanagers_discovered=notifier.discovered(),
                     warmup=warmer.snapshot() if cfg.warmup.enabled else None)

    def on_start(target: str, reason: str) -> None:
        if target == sidecar.config.warmup_target:
            warmer.trigger(f"{reason} of {target}")

    def ready() -> tuple[bool, str]:
        # no evidence is never ready: a discovery source that has not answered once may hold the whole fleet
        waiting = [f"{s.name} ({s.error or 'first refresh running'})" for s in state.published.discovery if not s.refreshed]
        if waiting:
            return False, "discovery has not answered yet: " + "; ".join(waiting)
        if not state.ready():
            return False, "not every target has been polled yet"
        return warmer.ready()

    poller = Poller(cfg, state, clock=clock, after_evaluate=on_evaluated, sources=sources, on_start=on_start)
    app = App(state, registry, ready=ready, security=security,
              deploy_api_open=lambda: sidecar.config.deploys.api_open and not sidecar.config.deploys.api_token, collector=collector)
    post, get = deploy_handlers(state, poller.add_event, lambda: sidecar.config.deploys.api_token,
                                lambda: {t.name for t in poller.current.targets}, clock, lambda: sidecar.config.deploys.api_open)
    app.route("POST", "/api/v1/deploys", post)
    app.route("GET", "/api/v1/deploys", get)
    analysis_get, flagger_post = analysis_handlers(
        lambda model, version, baseline, where: poller.analyze(clock(), model, version, baseline, where))
    app.route("GET", "/api/v1/analysis", analysis_get)
    app.route("POST", "/api/v1/analysis/flagger", flagger_post)
    # while a deploy token is configured (asked per request: reloads change it), it stands in for basic auth
    app.own_auth[("POST", "/api/v1/deploys")] = lambda: bool(sidecar.config.deploys.api_token)
    poller.pause_for_scrapes = app.exposition.wait_for_pause
    server = Server(app, host, port, security)
    sidecar = Sidecar(cfg, state, registry, poller, app, server, notifier, warmer)
    return sidecar


def load_run_config(args) -> Config:
    path = args.config_file or os.environ.get(config_mod.ENV_CONFIG_FILE)
    if not path:
        raise ConfigError([f"no config: pass --config.file or set {config_mod.ENV_CONFIG_FILE}"])
    args.config_file = path
    return with_shard(load_file(path), getattr(args, "shard", None))


def with_shard(cfg: Config, shard: str | None) -> Config:
    """--shard=I/N wins over discovery.shard (the key label stays the config's)."""
    if not shard:
        return cfg
    try:
        s = parse_shard(shard)
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    return replace(cfg, discovery=replace(cfg.discovery, shard=replace(s, key_label=cfg.discovery.shard.key_label)))


def run(args) -> int:
    """`run`: the sidecar until SIGTERM; SIGHUP reloads its config. A bad config is a ConfigError main reports."""
    cfg = load_run_config(args)
    listen = args.listen_address or cfg.web.listen_address
    try:
        parse_listen_address(listen)
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    security = None
    if args.web_config_file:
        try:
            security = load_web_config(args.web_config_file)
        except ConfigError as exc:
            raise ConfigError(exc.errors, source="web config") from None
    for warning in config_warnings(cfg):
        log.warning("config: %s", warning)
    tune_gc()
    raise_file_limit()
    try:
        sidecar = build_sidecar(cfg, listen, clock=SteadyClock(), security=security)
        sidecar.shard = getattr(args, "shard", None)
        sidecar.web_config_file = args.web_config_file
        sidecar.poller.freeze_reads = True  # this process's collector is ours (tune_gc): a read's survivors are frozen
    except OSError as exc:
        log.error("cannot listen on %s: %s", listen, exc.strerror or exc)
        return EXIT_ERROR
    stop = stop_event()
    if hasattr(signal, "SIGHUP"):
        # one reload at a time; signals that come during one make one more, which reads the file as the last left it
        on_signals((signal.SIGHUP,), lambda: sidecar.reload(args.config_file), "reload")
    # no meaning here, and their default ends the process; Go exporters ignore them too
    ignore_signals(tuple(s for s in (getattr(signal, "SIGUSR1", None), getattr(signal, "SIGUSR2", None)) if s is not None))
    sidecar.start()
    pacer = gcpacer.CollectionPacer(sidecar.app.exposition.quiet_for)  # this process's collector is ours (tune_gc)
    if gcpacer.supported():
        pacer.start()
    trim = heaptrim.trim_function()
    trimmer = heaptrim.HeapTrimmer(sidecar.app.exposition.quiet_for, trim) if trim is not None else None
    if trimmer is not None:
        trimmer.start()
    log.info("listening on %s:%d, polling %d target(s) every %gs", listen.rpartition(":")[0] or "0.0.0.0",
             sidecar.server.port, len(sidecar.poller.current.targets), cfg.global_.poll_interval)
    stop.wait()
    log.info("shutting down")
    pacer.stop()
    if trimmer is not None:
        trimmer.stop()
    return leave(EXIT_OK, sidecar.stop(STOP_BUDGET))


# SIGTERM exits within 8 s whatever a peer does: a rollout waits on every pod's exit
STOP_BUDGET = 5.0


def leave(code: int, stopped: bool) -> int:
    """`code`, or, when a thread still waits on a peer past the stop's budget (a poll of
    a target that drips within its scrape deadline: interpreter exit would join the job
    pool's threads, daemons or not), exit now rather than wait for it."""
    waiting = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if stopped and not waiting:
        return code
    log.warning("exiting with work still waiting on a peer%s", f": {', '.join(sorted(waiting))[:500]}" if waiting else "")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def check_config(args) -> int:
    """`check-config FILE`: what `run` would start with, or every error at once (ConfigError, which main reports)."""
    cfg = load_file(args.file)
    for warning in config_warnings(cfg):
        print(f"warning: {one_line(warning)}", file=sys.stderr)
    sources = [name for name, on in (("prometheus", cfg.discovery.prometheus), ("file_sd", cfg.discovery.file_sd),
                                     ("read_prometheus", cfg.discovery.read_prometheus)) if on]
    print(f"{args.file}: OK, {len(cfg.targets)} target(s)" + (f", discovery: {', '.join(sources)}" if sources else ""))
    return EXIT_OK


def config_warnings(cfg: Config) -> list[str]:
    """Valid but probably not meant."""
    out = []
    if not cfg.targets and not cfg.discovery.enabled:
        out.append("no targets: the sidecar will poll nothing (add `targets:` or `discovery:`)")
    if cfg.deploys.api_open:
        out.append("deploys.api_open: POST /api/v1/deploys accepts deploy announcements from anyone who reaches the port")
    scraped, read = cfg.discovery.prometheus, cfg.discovery.read_prometheus
    if scraped and read and scraped.url.rstrip("/") == read.url.rstrip("/"):
        out.append(f"discovery.prometheus and discovery.read_prometheus both ask {redact_url(read.url)}: a pod both select is "
                   "polled twice, scraped and read, and its alerts come twice; read_prometheus alone reads every pod it scrapes")
    return out

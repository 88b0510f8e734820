"""The `record` command: scrapes appended to a recording (JSON lines) for `backtest`, from one URL or from every
target of a config, discovered ones included, until the duration ends or a signal comes."""
from __future__ import annotations

import math
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..config.discovery import ShardConfig
from ..config.load import load_file
from ..config.sections import Target
from ..discovery.sources import Discovery
from ..discovery.targets import polled
from ..exitcodes import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from ..monitor.recording import write_line
from ..monitor.targetview import SUCCESS
from ..peers.urls import redact_url
from ..poll.scrape import Scraper
from ..stopping import stop_event


def command(args) -> int:
    """`record`: scrapes of one target, or of every target a config has (discovered ones with their labels), appended to a recording."""
    if bool(args.target) == bool(args.config_file):
        print("error: give --target=URL, or --config.file=FILE to record every target it has (discovered ones with their labels)",
              file=sys.stderr)
        return EXIT_USAGE
    discovery = None
    if args.config_file:
        cfg = load_file(args.config_file)
        discovery = Discovery(cfg.discovery, time.time) if cfg.discovery.enabled else None
        static = cfg.targets
    else:
        static = (Target(args.name or redact_url(args.target), args.target),)
    deadline = time.monotonic() + args.duration

    def on_signal() -> None:
        if discovery is not None:  # a refresh in flight ends now; from a thread: the handler may interrupt one holding its lock
            threading.Thread(target=discovery.close, daemon=True).start()

    stop = stop_event(on_signal)
    try:
        out = open(args.out, "a", encoding="utf-8")
    except OSError as exc:
        print(f"error: cannot open {args.out}: {exc.strerror}", file=sys.stderr)
        return EXIT_ERROR
    scrapers: dict[Target, Scraper] = {}
    count = answered = 0
    refreshed, discovered = -math.inf, []
    failed: OSError | None = None
    try:
        with out, ThreadPoolExecutor(max_workers=16) as pool:
            while not stop.is_set() and time.monotonic() < deadline:
                if discovery is not None and time.monotonic() - refreshed >= cfg.discovery.refresh_interval:
                    discovered, refreshed = discovery.refresh(), time.monotonic()
                targets, _ = polled(static, discovered, cfg.discovery.shard if discovery is not None else ShardConfig())
                for gone in set(scrapers) - set(targets):
                    scrapers.pop(gone).close()
                for t in targets:
                    scrapers.setdefault(t, Scraper(t.url, 2.0, max(1.0, args.interval), 16 * 1024 * 1024))
                started = time.time()
                for t, res in zip(targets, pool.map(lambda t: scrapers[t].scrape(), targets)):
                    line = {"t": started, "target": t.name}
                    if discovery is not None:
                        line["labels"] = dict(t.labels)
                    if res.result == SUCCESS:
                        answered += 1
                        line["body"] = res.body
                    else:
                        line["error"] = res.error or res.result
                        print(f"warning: scrape of {t.name} failed: {line['error']}", file=sys.stderr)
                    write_line(out, line)
                    count += 1
                out.flush()
                stop.wait(max(0.0, min(args.interval - (time.time() - started), deadline - time.monotonic())))
    except OSError as exc:  # a full disk, a closed pipe: what was written stays, nothing more can be
        failed = exc
    finally:
        for scraper in scrapers.values():
            scraper.close()
    if failed is not None:
        print(f"error: cannot write {args.out}: {failed.strerror or failed}; recording stopped", file=sys.stderr)
        return EXIT_ERROR
    what = redact_url(args.target) if args.target else f"the targets of {args.config_file}"
    print(f"recorded {count} scrape(s) of {what} to {args.out}, {answered} answered", file=sys.stderr)
    if count and not answered:
        print(f"error: {what} never answered", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK

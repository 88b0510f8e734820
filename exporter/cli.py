"""Command line: parses the arguments, sets up logging and hands each subcommand to the module that owns it;
the one place a ConfigError is reported. The commands return exit codes; main returns them to the process."""
from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import Sequence

from . import __version__, healthcheck, logs, sidecar, stopping
from .config import sections as config_mod
from .config.sections import ConfigError
from .exitcodes import EXIT_USAGE
from .sim import demo, serve, simulator
from .tools import backtest, diagnose, lint_command, parse as parse_command, record, whatif_command
from .tools.cachemodel import POLICIES

log = logging.getLogger("exporter")


class _HelpWithDefaults(argparse.HelpFormatter):
    """Every option's help ends with its default, as `--help` should tell."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" not in text and action.default not in (None, argparse.SUPPRESS, False, []) and action.option_strings:
            text += " (default: %(default)s)"
        return text


LOG_LEVELS = list(logs.LEVELS)
LOG_FORMATS = list(logs.FORMATS)


def count(low: int, high: int):
    """An argparse type: a whole number in [low, high]. A count the tools size memory by is
    bounded, so `--replicas 1e9` is a usage error, not a MemoryError."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not between {low} and {high:,}")
        return value
    return parse


def seconds(low: float, positive: bool = False):
    """An argparse type: a finite number of seconds, at least `low` (above it with `positive`):
    `nan` or `inf` would print 0.0% or wait forever."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value != value or value in (float("inf"), float("-inf")) or value < low or (positive and value <= low):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number {'above' if positive else 'of at least'} {low:g}")
        return value
    return parse


def finite(text: str) -> float:
    """An argparse type: a finite number (`nan` compares false with everything: a window
    measured from it held nothing and printed 0.0%)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


MAX_BLOCK_SIZE = 1 << 20  # tokens: vLLM's blocks are 16 to 256
MAX_REPLICAS = 4096  # whatif keeps a cache model per replica
MAX_CACHE_BLOCKS = 10 ** 9


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-prefix-cache-exporter", description="Prometheus exporter and alerting sidecar for vLLM prefix caching.",
                                formatter_class=_HelpWithDefaults)
    p.add_argument("--version", action="version", version=__version__)
    p.add_argument("--log.level", dest="log_level", default=None, choices=LOG_LEVELS,
                   help="info for run, error for demo (its console table stays readable)")
    p.add_argument("--log.format", dest="log_format", default="logfmt", choices=LOG_FORMATS,
                   help="log line format: logfmt (ts, level, caller, msg, logger) or json with the same fields")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, formatter_class=_HelpWithDefaults)

    run = command("run", "run the sidecar")
    run.add_argument("--config.file", dest="config_file", default=None, help=f"YAML config (or ${config_mod.ENV_CONFIG_FILE})")
    run.add_argument("--web.listen-address", dest="listen_address", default=None, help="HOST:PORT, [::]:PORT for IPv6 (default :9464 or web.listen_address)")
    run.add_argument("--web.config.file", dest="web_config_file", default=None,
                     help="exporter-toolkit web config: tls_server_config, http_server_config, basic_auth_users (bcrypt); re-read on SIGHUP")
    run.add_argument("--log.level", dest="log_level", default=argparse.SUPPRESS, choices=LOG_LEVELS, help="log level (default: info)")
    run.add_argument("--log.format", dest="log_format", default=argparse.SUPPRESS, choices=LOG_FORMATS, help="logfmt or json (default: logfmt)")
    run.add_argument("--shard", default=None, metavar="I/N",
                     help="poll only the targets whose shard key hashes to I mod N, like Prometheus's hashmod (overrides discovery.shard)")
    run.set_defaults(func=sidecar.run)

    demo_cmd = command("demo", "play the incident on a simulated vLLM fleet")
    demo_cmd.add_argument("--duration", type=seconds(0, positive=True), default=120.0, help="seconds the story takes")
    demo_cmd.add_argument("--web.listen-address", dest="listen_address", default="127.0.0.1:9464", help="where the demo's exporter listens")
    demo_cmd.add_argument("--alertmanager.url", dest="alertmanager_urls", action="append", default=[],
                      help="also deliver the demo's alerts to this Alertmanager (repeatable)")
    demo_cmd.add_argument("--log.file", dest="log_file", default=None, help="write the sidecar's log lines here (default: only errors, to stderr)")
    demo_cmd.add_argument("--log.level", dest="log_level", default=argparse.SUPPRESS, choices=LOG_LEVELS, help="log level (default: error, or info with --log.file)")
    demo_cmd.add_argument("--log.format", dest="log_format", default=argparse.SUPPRESS, choices=LOG_FORMATS, help="logfmt or json (default: logfmt)")
    demo_cmd.set_defaults(func=demo.command)

    bt = command("backtest", "replay a recording through the rules; prints alert transitions as JSON lines")
    bt.add_argument("--config.file", dest="config_file", default=None, help="rules and windows (default: the built-in defaults)")
    bt.add_argument("recording", help="a recording (JSON lines), - for stdin")
    bt.set_defaults(func=backtest.command)

    hc = command("healthcheck", "ask /-/healthy of a running sidecar where it listens, with TLS where its web config has it "
                 "(the image's HEALTHCHECK; it reads the process's command line and config)")
    hc.add_argument("--pid", type=int, default=1, help="the sidecar's process (PID 1 in its container)")
    hc.add_argument("--timeout", type=float, default=2.0, help="seconds for the whole answer")
    hc.set_defaults(func=lambda args: healthcheck.command(args, lambda argv: build_parser().parse_args(argv)))

    check = command("check-config", "validate a config file")
    check.add_argument("file", help="the YAML config")
    check.set_defaults(func=sidecar.check_config)

    parse_cmd = command("parse", "print the normalized snapshot of one /metrics text as JSON")
    parse_cmd.add_argument("file", nargs="?", default="-", help="a /metrics text, - for stdin (default: -)")
    parse_cmd.set_defaults(func=parse_command.command)

    rec = command("record", "append scrapes of a target to a recording")
    rec.add_argument("--target", default=None, help="the /metrics URL")
    rec.add_argument("--config.file", dest="config_file", default=None,
                     help="record every target of this config instead: static and discovered (lines carry their labels)")
    rec.add_argument("--name", default=None, help="target name in the recording (default: the URL)")
    rec.add_argument("--out", required=True, help="the recording to append to")
    rec.add_argument("--interval", type=seconds(0, positive=True), default=5.0, help="seconds between scrapes")
    rec.add_argument("--duration", type=seconds(0), default=300.0, help="seconds to record")
    rec.set_defaults(func=record.command)

    diag = command("diagnose", "first divergent token of two chat requests and the cache blocks that survive")
    diag.add_argument("a", metavar="A.json", help="the earlier chat-completions request")
    diag.add_argument("b", metavar="B.json", help="the later one")
    diag.add_argument("--target", help="the vLLM server (http://host:8000): /tokenize, /detokenize, /metrics")
    diag.add_argument("--block-size", dest="block_size", type=count(1, MAX_BLOCK_SIZE), default=None, help="default: from vllm:cache_config_info, else 16")
    diag.add_argument("--offline", action="store_true", help="no server: an approximation on the rendered text")
    diag.add_argument("--json", action="store_true", help="print JSON instead of text")
    diag.set_defaults(func=diagnose.command)

    lint_cmd = command("lint", "flag volatile content before static content in prompt templates or request JSON")
    lint_cmd.add_argument("files", nargs="+", help="templates or request JSON files")
    lint_cmd.add_argument("--config.file", dest="config_file", default=None, help="for lint.allow")
    lint_cmd.set_defaults(func=lint_command.command)

    wi = command("whatif", "replay a request sample through vLLM's prefix-cache model: hit ratio by routing policy and where the missing points went")
    wi.add_argument("requests", metavar="REQUESTS", help="JSON lines (prompt_token_ids, body or prompt; t, session, replica optional) "
                    "or vLLM's request log; - for stdin")
    wi.add_argument("--replicas", type=count(1, MAX_REPLICAS), default=None, help="replicas to spread the sample over (default: those it names, else 1)")
    wi.add_argument("--routing", action="append", choices=POLICIES, default=None,
                    help="routing policy, repeatable (default: all; observed first when every request names its replica)")
    size = wi.add_mutually_exclusive_group()
    size.add_argument("--cache-blocks", dest="cache_blocks", type=count(1, MAX_CACHE_BLOCKS), default=None, help="KV-cache blocks per replica (default: unlimited)")
    size.add_argument("--cache-tokens", dest="cache_tokens", type=count(1, MAX_CACHE_BLOCKS * 16), default=None, help="KV-cache tokens per replica (default: unlimited)")
    wi.add_argument("--block-size", dest="block_size", type=count(1, MAX_BLOCK_SIZE), default=None,
                    help="tokens per block (default 16); a block-hash trace must say its tokens per hash id (Mooncake's: 512)")
    wi.add_argument("--capacity-curve", dest="capacity_curve", action="store_true",
                    help="the hit ratio at cache sizes per replica from 10^5 to 10^9 tokens and unlimited, per policy")
    wi.add_argument("--svg", default=None, metavar="FILE", help="draw the capacity curve into FILE (implies --capacity-curve)")
    group = wi.add_mutually_exclusive_group()
    group.add_argument("--target", help="a vLLM server whose /tokenize gives exact token ids for text")
    group.add_argument("--tokenizer", help="a tokenizer.json (needs the `whatif` extra: tokenizers)")
    wi.add_argument("--measure-from", dest="measure_from", type=finite, default=None,
                    help="requests before this t (Unix seconds) only warm the caches")
    wi.add_argument("--json", action="store_true", help="print one JSON object")
    whatif_command.add_arguments(wi)
    wi.set_defaults(func=whatif_command.command)

    sim = command("simulate", "serve simulated vLLM replicas on 127.0.0.1")
    sim.add_argument("--replicas", type=count(1, 256), default=2, help="how many replicas")
    sim.add_argument("--port", type=count(0, 65535), default=0, help="0 picks a free port")
    sim.add_argument("--generation", choices=simulator.GENERATIONS, default="current", help="which vLLM metric names to serve")
    sim.add_argument("--scenario", choices=sorted(serve.SCENARIOS), default="healthy", help="the story to play")
    sim.add_argument("--rate", type=seconds(0, positive=True), default=5.0, help="requests/s per replica")
    sim.add_argument("--event-at", dest="event_at", type=seconds(0), default=60.0, help="seconds until the scenario's event")
    sim.add_argument("--duration", type=seconds(0), default=0.0, help="seconds; 0 serves until stopped")
    sim.set_defaults(func=serve.command)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log_file = getattr(args, "log_file", None)
    level = args.log_level or ("error" if args.command == "demo" and not log_file else "info")
    logs.setup(level, args.log_format, log_file)
    if args.command != "run":  # only the sidecar reloads on SIGHUP and ignores SIGUSR1/2; the rest end on them as before
        stopping.release_startup_signals()
    try:
        return args.func(args)
    except ConfigError as exc:
        report_config_errors(args, exc)
        return EXIT_USAGE


def report_config_errors(args, exc: ConfigError) -> None:
    """`run` logs (its output is the log); the other commands print; check-config counts too."""
    for err in exc.errors:
        if args.command == "run":
            log.error("%s: %s", exc.source, err)
        else:
            print(f"error: {logs.one_line(err)}", file=sys.stderr)  # a key or name from the file: one line whatever it holds
    if args.command == "check-config":
        print(f"{args.file}: {len(exc.errors)} error(s)", file=sys.stderr)

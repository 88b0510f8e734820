"""The `whatif` command: reads a request sample (or a block-hash trace), picks the tokenizer (a vLLM server's,
a tokenizer.json, else an approximation), runs the what-if analysis and prints it, drawing the capacity curve on request."""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys

from ..exitcodes import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from ..peers import files
from ..peers.urls import redact_url
from . import divergence, hashtrace, whatif
from .cachemodel import OBSERVED, POLICIES, SESSION
from .capacitycurve import svg
from .vllm_client import VLLMClient, VLLMError


def _tokenizer(args) -> whatif.Tokenizer:
    if args.target:
        client = VLLMClient(args.target)
        return whatif.Tokenizer(lambda text: client.tokenize_text(text), client.tokenize_chat, True, f"exact via {redact_url(args.target)}/tokenize")
    if args.tokenizer:
        try:
            from tokenizers import Tokenizer as HFTokenizer  # the optional `whatif` extra
        except ImportError:
            raise ValueError("--tokenizer needs the `tokenizers` package: pip install 'vllm-prefix-cache-exporter[whatif]'") from None
        try:
            hf = HFTokenizer.from_file(args.tokenizer)
        except Exception as exc:  # noqa: BLE001 - the library raises its own types
            raise ValueError(f"cannot load {args.tokenizer}: {exc}") from None
        text = lambda s: hf.encode(s, add_special_tokens=False).ids
        # without the model's chat template, messages are joined by the neutral rendering
        return whatif.Tokenizer(text, lambda body: text(divergence.render(body)), True, f"{args.tokenizer} (chat rendered neutrally)")
    return whatif.approximate_tokenizer()


def prefill_rate(text: str) -> float:
    """`--prefill-tokens-per-s`: a positive number of tokens a second, or `inf` (blocks
    reusable on arrival, the replay without prefill time); argparse exits 2 on anything else."""
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of tokens a second (or inf)") from None
    if math.isnan(rate) or rate <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the prefill rate must be a positive number of tokens a second, or inf")
    return rate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags `whatif` owns beyond those exporter/cli.py declares; the parser there calls this."""
    parser.add_argument("--prefill-tokens-per-s", dest="prefill_tokens_per_s", type=prefill_rate,
                        default=whatif.DEFAULT_PREFILL_TOKENS_PER_S, metavar="R",
                        help="a request's computed blocks become reusable when its prefill ends, at its arrival plus its "
                             "uncached tokens / R (no queueing); inf: on arrival")


def command(args) -> int:
    """`whatif REQUESTS`: the sample through the cache model, per routing policy; bad lines are skipped and counted."""
    # a trace of 100,000 requests is some 12 million ints in lists, and more in the replay's
    # pools: the cycle collector would walk them again and again while they are built (a sixth
    # of the run), and they hold no cycle to collect
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _command(args)
    finally:
        if collecting:
            gc.enable()


def _command(args) -> int:
    try:
        # a file is regular (a FIFO is never waited on, /dev/zero never read into memory); lines are bounded
        source = sys.stdin.buffer if args.requests == "-" else files.open_regular(args.requests)
    except OSError as exc:
        print(f"error: cannot read {args.requests}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_ERROR
    requests_, bad, ids = [], 0, 0
    with source:
        for item in whatif.read_requests(source):
            if isinstance(item, whatif.SampleError):
                bad += 1
                print(f"warning: {item}; skipped", file=sys.stderr)
                continue
            # the whole sample is kept, at some 100 bytes an id: the file is bounded, not only its lines
            ids += len(item.hash_ids or ()) + len(item.tokens or ())
            if ids > hashtrace.MAX_IDS_PER_FILE:
                print(f"error: {args.requests} holds more than {hashtrace.MAX_IDS_PER_FILE:,} hash or token ids (line {item.line}): "
                      "whatif keeps the whole sample in memory; analyse a part of it (fewer requests, a shorter time)", file=sys.stderr)
                return EXIT_USAGE
            requests_.append(item)
    if not requests_:
        print(f"error: {args.requests} holds no request to analyse ({bad} bad line(s))", file=sys.stderr)
        return EXIT_USAGE
    try:
        tokenizer = _tokenizer(args) if any(r.is_text for r in requests_) else None
        policies = tuple(dict.fromkeys(args.routing)) if args.routing else default_policies(requests_)
        replicas = args.replicas or len({r.replica for r in requests_ if r.replica}) or 1
        # a parser that does not call add_arguments (yet) gets the flag's default
        rate = getattr(args, "prefill_tokens_per_s", whatif.DEFAULT_PREFILL_TOKENS_PER_S)
        analysis = whatif.analyze(requests_, replicas, policies, args.cache_blocks, args.block_size, tokenizer, args.measure_from,
                                  cache_tokens=args.cache_tokens, curve=args.capacity_curve or bool(args.svg), prefill_tokens_per_s=rate)
    except (whatif.SampleError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except VLLMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(analysis.to_json()) if args.json else whatif.report(analysis))
    if bad:
        print(f"whatif: {bad} bad line(s) skipped", file=sys.stderr)
    if args.svg:
        try:
            with open(args.svg, "w", encoding="utf-8") as out:
                out.write(svg(analysis.curve, f"whatif: {os.path.basename(args.requests)}"))
        except OSError as exc:
            print(f"error: cannot write {args.svg}: {exc.strerror}", file=sys.stderr)
            return EXIT_ERROR
    return EXIT_OK


def default_policies(requests_) -> tuple[str, ...]:
    """Every policy; `observed` first when the sample says which replica served each request."""
    # a Mooncake trace has no session key: session routing would be round robin by another name
    sessionless = any(r.is_hashes for r in requests_) and not all(r.has_session_key for r in requests_)
    rest = tuple(p for p in POLICIES if p != OBSERVED and not (p == SESSION and sessionless))
    return ((OBSERVED,) + rest) if all(r.replica for r in requests_) else rest

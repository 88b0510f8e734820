"""The `parse` command: one /metrics text through the sidecar's own parser, printed as JSON, with the same
size limit and UTF-8 rule the sidecar applies to a scrape."""
from __future__ import annotations

import errno
import json
import math
import sys

from ..config import sections as config_mod
from ..exitcodes import EXIT_ERROR, EXIT_OK
from ..parse.vllm_metrics import parse
from ..peers import files


def command(args) -> int:
    """`parse [FILE]`: the normalized snapshot of one /metrics text, as the sidecar reads it, in JSON."""
    # bytes as the sidecar gets them: lines end at \n only (text mode would also end them at
    # a bare \r), the body must be UTF-8, and no larger than the sidecar's default limit
    limit = config_mod.GlobalConfig.body_size_limit
    too_large = f"error: {args.file} is larger than {limit} bytes, which the sidecar refuses as too_large"
    try:
        # a file: regular, never waited on (a FIFO), bounded (/dev/zero); stdin is what the user pipes
        raw = sys.stdin.buffer.read(limit + 1) if args.file == "-" else files.read_bytes(args.file, limit)
    except OSError as exc:
        print(too_large if exc.errno == errno.EFBIG else f"error: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_ERROR
    if len(raw) > limit:
        print(too_large, file=sys.stderr)
        return EXIT_ERROR
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        print(f"error: {args.file} is not UTF-8 at byte {exc.start} (the sidecar counts such a body as decode_error)", file=sys.stderr)
        return EXIT_ERROR
    snap = parse(text)
    json.dump(strict_json(snap.to_json()), sys.stdout, indent=None, allow_nan=False)
    sys.stdout.write("\n")
    for w in snap.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if snap.warnings_dropped:
        print(f"warning: {snap.warnings_dropped} more warning(s) not shown", file=sys.stderr)
    if not snap.series:
        print("error: no vLLM prefix-cache series found", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def strict_json(value):
    """JSON has no NaN or Infinity: a gauge that reads NaN is printed as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value

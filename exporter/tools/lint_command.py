"""The `lint` command: prompt templates or request files through the lint, less what the config's lint.allow lets
pass; exit 1 when anything is found, 2 when a file cannot be read."""
from __future__ import annotations

import sys

from ..config.load import load_file
from ..exitcodes import EXIT_OK, EXIT_USAGE
from ..peers import files, jsonlines
from .lint import allowed, lint


def command(args) -> int:
    """`lint FILE...`: findings on stdout, exit 1 when there are any, 2 when a file cannot be read."""
    allow: tuple[str, ...] = ()
    if args.config_file:
        allow = load_file(args.config_file).lint_allow
    findings, broken = [], False
    for path in args.files:
        try:
            text = files.read_text(path, jsonlines.MAX_FILE_BYTES)  # a FIFO or a device is refused, never waited on
            findings += [f for f in lint(path, text) if not allowed(f, allow)]
        except OSError as exc:
            print(f"error: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
            broken = True
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            broken = True
    for f in findings:
        print(f)
    print(f"lint: {len(findings)} finding(s) in {len(args.files)} file(s)", file=sys.stderr)
    return EXIT_USAGE if broken else (1 if findings else EXIT_OK)

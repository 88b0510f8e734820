"""The `backtest` command: a recording replayed through the same engine and rules the sidecar runs, printing
the alert transitions it would have made; bad lines are counted and the first few shown."""
from __future__ import annotations

import sys

from ..config.load import load_file
from ..config.sections import Config
from ..exitcodes import EXIT_ERROR, EXIT_OK
from ..logs import one_line
from ..monitor.recording import write_line
from ..monitor.replay import backtest
from ..peers import files


def command(args) -> int:
    """`backtest RECORDING`: the recording through the rules, each alert transition a JSON line on stdout."""
    cfg = load_file(args.config_file) if args.config_file else Config()
    try:
        # bytes: a line that is not UTF-8 is one bad line, not the end of the replay; a file is
        # regular (a FIFO is never waited on, /dev/zero never read forever), stdin what the user pipes
        source = sys.stdin.buffer if args.recording == "-" else files.open_regular(args.recording)
    except OSError as exc:
        print(f"error: cannot read {args.recording}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_ERROR
    tally = {"bad": 0, "records": 0}

    def warn(msg: str) -> None:
        tally["bad"] += 1
        if tally["bad"] <= MAX_WARNED_LINES:
            print(f"warning: {one_line(msg)}", file=sys.stderr)  # a target's name is the recording's: one line whatever it holds

    def record_read() -> None:
        tally["records"] += 1

    def note(msg: str) -> None:  # what the replay read from the recording (its cadence): no bad line
        print(f"note: {one_line(msg)}", file=sys.stderr)

    count = 0
    try:
        with source:
            for transition in backtest(source, cfg, warn, on_record=record_read, note=note):
                write_line(sys.stdout, transition.to_json())
                count += 1
    except OSError as exc:
        print(f"error: cannot read {args.recording}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_ERROR
    bad = tally["bad"]
    if bad > MAX_WARNED_LINES:
        print(f"warning: {bad - MAX_WARNED_LINES} more bad line(s) not shown", file=sys.stderr)
    print(f"backtest: {count} transition(s); {bad} bad line(s) skipped", file=sys.stderr)
    if bad and not tally["records"]:
        print(f"error: {args.recording} holds no recording line ({bad} bad line(s)): is it a recording?", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


MAX_WARNED_LINES = 20  # a binary file is thousands of bad lines: the first few say what is wrong

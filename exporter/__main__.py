"""The entry point (`python -m exporter` and the installed command): it holds SIGHUP, SIGUSR1
and SIGUSR2 before anything else, since the imports alone take a third of a second and their
default action ends the process (see stopping)."""
import sys

from .stopping import hold_startup_signals

hold_startup_signals()

from .cli import main  # noqa: E402 - after the signals are held: these imports are the slow part


def entry() -> int:
    return main()


if __name__ == "__main__":
    sys.exit(entry())

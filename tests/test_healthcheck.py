"""exporter/healthcheck.py, the image's HEALTHCHECK: it asks /-/healthy where the running
sidecar listens (its flag, else its config's web.listen_address, else :9464), over TLS
where its web config has it, reading the process's command line and files. It was
hard-wired to plain HTTP on 127.0.0.1:9464."""
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from exporter import cli, healthcheck

from conftest import free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent


def parse(argv):
    return cli.build_parser().parse_args(argv)


def url_of(argv, files=None, environ=None):
    files = {k: yaml.safe_dump(v).encode() for k, v in (files or {}).items()}
    return healthcheck.probe_url(healthcheck.run_arguments(argv, parse), environ or {}, files.__getitem__)


def test_the_image_default_is_plain_http_on_9464():
    argv = ["/opt/venv/bin/python3.11", "/opt/venv/bin/vllm-prefix-cache-exporter", "run", "--config.file=/etc/c.yml"]
    assert url_of(argv, {"/etc/c.yml": {"targets": []}}) == "http://127.0.0.1:9464/-/healthy"


@pytest.mark.parametrize("argv, files, environ, url", [
    pytest.param(["python3", "-m", "exporter", "--log.level=debug", "run", "--web.listen-address=:9100"], {}, {},
                 "http://127.0.0.1:9100/-/healthy", id="the-flag-python-m"),
    pytest.param(["vllm-prefix-cache-exporter", "run", "--config.file=c.yml"], {"c.yml": {"web": {"listen_address": "10.1.2.3:9200"}}}, {},
                 "http://10.1.2.3:9200/-/healthy", id="the-configs-address"),
    pytest.param(["vllm-prefix-cache-exporter", "run"], {"/cfg/e.yml": {"web": {"listen_address": "[::]:9300"}}},
                 {"PREFIX_CACHE_EXPORTER_CONFIG": "/cfg/e.yml"}, "http://[::1]:9300/-/healthy", id="config-from-the-environment-ipv6"),
    pytest.param(["vllm-prefix-cache-exporter", "run", "--web.listen-address=0.0.0.0:9464", "--web.config.file=/w.yml"],
                 {"/w.yml": {"tls_server_config": {"cert_file": "c", "key_file": "k"}}}, {}, "https://127.0.0.1:9464/-/healthy", id="tls"),
    pytest.param(["vllm-prefix-cache-exporter", "run", "--web.config.file=/w.yml"],
                 {"/w.yml": {"basic_auth_users": {"p": "$2y$10$x"}}}, {}, "http://127.0.0.1:9464/-/healthy", id="basic-auth-only-is-http"),
])
def test_it_follows_the_listen_address_and_tls(argv, files, environ, url):
    assert url_of(argv, files, environ) == url


def test_a_process_that_is_not_the_sidecar_is_said_so():
    with pytest.raises(healthcheck.NotFound):
        healthcheck.run_arguments(["/bin/sh", "-c", "sleep 1"], parse)
    with pytest.raises(healthcheck.NotFound):
        healthcheck.run_arguments(["vllm-prefix-cache-exporter", "demo"], parse)


@pytest.mark.slow
def test_it_passes_a_sidecar_serving_tls_on_another_port_and_fails_once_it_stopped(tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=sidecar.llm.svc",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")], check=True, capture_output=True, timeout=60)
    (tmp_path / "web.yml").write_text(yaml.safe_dump({"tls_server_config": {"cert_file": "cert.pem", "key_file": "key.pem"}}))
    port = free_port()
    (tmp_path / "config.yml").write_text(yaml.safe_dump({"web": {"listen_address": f"127.0.0.1:{port}"}, "targets": []}))
    # relative paths, resolved in the process's own working directory
    sidecar = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--config.file=config.yml", "--web.config.file=web.yml"],
                               cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                               stdout=subprocess.DEVNULL, stderr=open(tmp_path / "sidecar.log", "w"))

    def check():
        return subprocess.run([sys.executable, "-m", "exporter", "healthcheck", f"--pid={sidecar.pid}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=30)
    try:
        assert wait_for(lambda: check().returncode == 0, 30), (check().stderr, (tmp_path / "sidecar.log").read_text()[-2000:])
        sidecar.terminate()
        sidecar.wait(timeout=20)
        started = time.monotonic()
        out = check()
        assert out.returncode == 1 and "healthcheck:" in out.stderr and time.monotonic() - started < 10
    finally:
        if sidecar.poll() is None:
            sidecar.kill()
            sidecar.wait(timeout=10)

"""`--web.config.file`: TLS and basic auth (exporter-toolkit format) on the real server,
with a real TLS client, a wrong password and a plain-HTTP client."""
import subprocess

import bcrypt
import pytest
import requests
from prometheus_client import CollectorRegistry

from exporter.collector import PrefixCacheCollector
from exporter.config import ConfigError
from exporter.http import App, Server
from exporter.webconfig import BasicAuth, load_web_config, parse_web_config

from helpers import simulated_state


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True, timeout=60)
    return d


def hashed(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


@pytest.fixture
def secure_server(cert, tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert / 'cert.pem'}\n  key_file: {cert / 'key.pem'}\n"
                   f"basic_auth_users:\n  prometheus: '{hashed('right')}'\n")
    security = load_web_config(str(web))
    state = simulated_state()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["1m", "5m"]))
    server = Server(App(state, registry, security=security), "127.0.0.1", 0, security).start()
    yield f"https://127.0.0.1:{server.port}", cert / "cert.pem"
    server.stop()


def test_tls_and_basic_auth_with_a_real_client(secure_server):
    base, ca = secure_server
    ok = requests.get(base + "/metrics", auth=("prometheus", "right"), verify=str(ca), timeout=10)
    assert ok.status_code == 200 and "prefixcache_target_up" in ok.text
    again = requests.get(base + "/api/v1/status", auth=("prometheus", "right"), verify=str(ca), timeout=10)
    assert again.status_code == 200  # the cached verification answers


@pytest.mark.parametrize("auth", [
    pytest.param(("prometheus", "wrong"), id="wrong-password"),
    pytest.param(("nobody", "right"), id="unknown-user"),
    pytest.param(None, id="no-credentials"),
])
def test_wrong_credentials_get_401(secure_server, auth):
    base, ca = secure_server
    resp = requests.get(base + "/metrics", auth=auth, verify=str(ca), timeout=10)
    assert resp.status_code == 401 and "Basic" in resp.headers["WWW-Authenticate"]


def test_plain_http_to_a_tls_port_fails(secure_server):
    base, _ = secure_server
    with pytest.raises(requests.RequestException):
        requests.get(base.replace("https://", "http://") + "/metrics", timeout=5).raise_for_status()


@pytest.mark.parametrize("data, error", [
    pytest.param({"tls_server_config": {"cert_file": "/nope.pem", "key_file": "/nope.key"}}, "does not exist", id="missing-cert"),
    pytest.param({"tls_server_config": {"cert_file": "/etc/hostname"}}, "key_file: required", id="no-key"),
    pytest.param({"basic_auth_users": {"u": "plaintext"}}, "bcrypt hash", id="plain-password"),
    pytest.param({"basic_auth_user": {}}, "unknown key", id="typo"),
])
def test_bad_web_config_is_rejected_with_its_key(data, error):
    with pytest.raises(ConfigError) as exc:
        parse_web_config(data)
    assert any(error in e for e in exc.value.errors), exc.value.errors


def test_basic_auth_header_forms():
    auth = BasicAuth((("u", hashed("p").encode()),))
    import base64
    good = "Basic " + base64.b64encode(b"u:p").decode()
    assert auth.check(good) and auth.check(good.replace("Basic", "basic"))
    for bad in ("", "Basic", "Basic !!!", "Bearer x", "Basic " + base64.b64encode(b"u-no-colon").decode()):
        assert not auth.check(bad)

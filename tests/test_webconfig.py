"""`--web.config.file`: TLS and basic auth (exporter-toolkit format) on the real server,
with a real TLS client, a wrong password and a plain-HTTP client."""
import subprocess
import time

import bcrypt
import pytest
import requests
from prometheus_client import CollectorRegistry

from exporter.serve.collector import PrefixCacheCollector
from exporter.config.reader import ConfigError
from exporter.serve.app import App
from exporter.serve.server import Server
from exporter.serve.webconfig import BasicAuth, load_web_config, parse_web_config

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


# 100 bytes: its bcrypt hash, made by htpasswd -B or bcrypt < 5, is of the first 72
LONG_PASSWORD = "correct horse battery staple " * 3 + "and then some more!!!!!!!!!!!!"


@pytest.fixture(scope="module")
def state():
    return simulated_state()


@pytest.fixture
def secure_server(cert, tmp_path, state):
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert / 'cert.pem'}\n  key_file: {cert / 'key.pem'}\n"
                   f"basic_auth_users:\n  prometheus: '{hashed('right')}'\n"
                   f"  longpass: '{bcrypt.hashpw(LONG_PASSWORD.encode()[:72], bcrypt.gensalt(rounds=4)).decode()}'\n")
    security = load_web_config(str(web))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["1m", "5m"]))
    # a short request deadline keeps the misbehaving-client tests fast
    server = Server(App(state, registry, security=security), "127.0.0.1", 0, security, read_deadline=1.0).start()
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
    pytest.param(("prometheus", "x" * 100), id="known-user-password-over-72-bytes"),
    pytest.param(("nobody", "x" * 100), id="unknown-user-password-over-72-bytes"),
    pytest.param(("longpass", LONG_PASSWORD[:71]), id="long-password-cut-short"),
])
def test_wrong_credentials_get_the_same_401(secure_server, auth):
    base, ca = secure_server
    resp = requests.get(base + "/metrics", auth=auth, verify=str(ca), timeout=10)
    assert resp.status_code == 401 and "Basic" in resp.headers["WWW-Authenticate"]
    assert resp.text == "Unauthorized\n"
    every_route_answers(base, ca)


def test_a_user_whose_password_is_over_72_bytes_logs_in(secure_server):
    base, ca = secure_server
    resp = requests.get(base + "/metrics", auth=("longpass", LONG_PASSWORD), verify=str(ca), timeout=10)
    assert resp.status_code == 200


def test_every_failure_naming_a_user_costs_one_bcrypt_check_at_the_users_cost():
    """Same timing for every failure: an unknown user, a wrong password, a password over
    72 bytes and a missing colon each run exactly one check, at the configured cost."""
    import base64
    checked = []

    def checkpw(password, hashed_password):
        checked.append((len(password), hashed_password[:7]))
        return bcrypt.checkpw(password, hashed_password)

    auth = BasicAuth((("u", bcrypt.hashpw(b"p", bcrypt.gensalt(rounds=5))),), checkpw=checkpw)
    for raw in (b"u:wrong", b"nobody:p", b"u:" + b"y" * 100, b"nobody:" + b"y" * 100, b"u", b"u:"):
        checked.clear()
        assert not auth.check("Basic " + base64.b64encode(raw).decode())
        assert len(checked) == 1 and checked[0][1] == b"$2b$05$" and checked[0][0] <= 72, (raw, checked)


def test_probes_answer_without_credentials_and_nothing_else_does(secure_server):
    """kubelet's probes carry no password: with basic auth on, /-/healthy and /-/ready
    still answer (else the liveness probe restarts the sidecar); every other route asks."""
    base, ca = secure_server
    assert requests.get(base + "/-/healthy", verify=str(ca), timeout=10).status_code == 200
    assert requests.get(base + "/-/ready", verify=str(ca), timeout=10).status_code in (200, 503)
    assert requests.head(base + "/-/healthy", verify=str(ca), timeout=10).status_code == 200
    for path in ("/metrics", "/", "/api/v1/status", "/-/healthy/../metrics"):
        assert requests.get(base + path, verify=str(ca), timeout=10).status_code == 401, path
    assert requests.post(base + "/-/healthy", verify=str(ca), timeout=10).status_code == 401


def every_route_answers(base, ca):
    for path in ("/metrics", "/", "/api/v1/status", "/-/healthy", "/-/ready"):
        resp = requests.get(base + path, auth=("prometheus", "right"), verify=str(ca), timeout=8)
        assert resp.status_code in (200, 503) if path == "/-/ready" else resp.status_code == 200, path


def test_silent_tls_connections_hold_nothing(secure_server):
    """300 connections that never start their handshake: a real HTTPS scrape still
    answers at once (the handshake once ran on the accept thread and waited 10 s on each)."""
    from slowclient import Silent
    base, ca = secure_server
    with Silent(int(base.rsplit(":", 1)[1]), 300):
        started = time.monotonic()
        resp = requests.get(base + "/metrics", auth=("prometheus", "right"), verify=str(ca), timeout=8)
        assert resp.status_code == 200 and time.monotonic() - started < 3
        # a kept-alive TLS connection shakes hands once and gets a fresh deadline per request
        with requests.Session() as session:
            for _ in range(3):
                assert session.get(base + "/-/healthy", verify=str(ca), timeout=5).status_code == 200
                time.sleep(0.6)
        every_route_answers(base, ca)


def test_a_handshake_that_drips_holds_a_worker_only_until_the_deadline(secure_server):
    """20 clients (more than the 16 workers) start a TLS record and then send a few
    bytes every 0.3 s: each is dropped at the request deadline, and a scrape answers."""
    from slowclient import Dripping
    base, ca = secure_server
    hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"  # a ClientHello record 512 bytes long, barely begun
    with Dripping(int(base.rsplit(":", 1)[1]), 20, 0.3, first=hello) as drip:
        started = time.monotonic()
        resp = requests.get(base + "/-/healthy", verify=str(ca), timeout=8)
        assert resp.status_code == 200 and time.monotonic() - started < 4
        deadline = time.monotonic() + 8
        while drip.dropped < 20 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert drip.dropped == 20 and max(drip.seconds_held) < 4, drip.seconds_held
    every_route_answers(base, ca)


def test_a_malformed_bcrypt_hash_is_a_config_error():
    with pytest.raises(ConfigError) as exc:
        parse_web_config({"basic_auth_users": {"u": "$2y$10$tooshort"}})
    assert "basic_auth_users.u" in exc.value.errors[0]


def test_plain_http_to_a_tls_port_gets_a_plain_400(secure_server):
    base, ca = secure_server
    resp = requests.get(base.replace("https://", "http://") + "/metrics", timeout=5)
    assert resp.status_code == 400 and "HTTPS" in resp.text
    every_route_answers(base, ca)


@pytest.mark.slow
def test_mutual_tls_on_the_workers_handshake(cert, tmp_path, state):
    """The handshake moved off the accept thread; a client certificate is still
    required and verified there: none, or one from another CA, is refused."""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    for name in ("ca", "rogue"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
                "-keyout", str(tmp_path / f"{name}.key"), "-out", str(tmp_path / f"{name}.pem"))
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=prometheus", "-keyout", str(tmp_path / f"{name}-client.key"),
                "-out", str(tmp_path / f"{name}-client.csr"))
        openssl("x509", "-req", "-in", str(tmp_path / f"{name}-client.csr"), "-CA", str(tmp_path / f"{name}.pem"),
                "-CAkey", str(tmp_path / f"{name}.key"), "-CAcreateserial", "-days", "2", "-out", str(tmp_path / f"{name}-client.pem"))
    security = parse_web_config({"tls_server_config": {"cert_file": str(cert / "cert.pem"), "key_file": str(cert / "key.pem"),
                                                       "client_ca_file": str(tmp_path / "ca.pem"),
                                                       "client_auth_type": "RequireAndVerifyClientCert"}})
    server = Server(App(state, CollectorRegistry(), security=security), "127.0.0.1", 0, security, read_deadline=1.0).start()
    base = f"https://127.0.0.1:{server.port}"
    try:
        good = (str(tmp_path / "ca-client.pem"), str(tmp_path / "ca-client.key"))
        rogue = (str(tmp_path / "rogue-client.pem"), str(tmp_path / "rogue-client.key"))
        assert requests.get(base + "/-/healthy", cert=good, verify=str(cert / "cert.pem"), timeout=5).status_code == 200
        for client_cert in (None, rogue):
            with pytest.raises(requests.exceptions.ConnectionError):
                requests.get(base + "/-/healthy", cert=client_cert, verify=str(cert / "cert.pem"), timeout=5)
        assert requests.get(base + "/metrics", cert=good, verify=str(cert / "cert.pem"), timeout=5).status_code == 200
    finally:
        server.stop()


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

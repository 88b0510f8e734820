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


def test_a_handshake_that_drips_is_dropped_at_the_deadline(secure_server):
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


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def ec_pair(directory, name, subject, signer=None):
    """An EC key (made in milliseconds, unlike RSA) and its certificate, self-signed or signed by `signer`."""
    key, crt = directory / f"{name}.key", directory / f"{name}.pem"
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-subj", subject]
    if signer is None:
        openssl("req", "-x509", *new_key, "-days", "2", "-addext", "subjectAltName=IP:127.0.0.1", "-out", str(crt))
    else:
        csr = directory / f"{name}.csr"
        openssl("req", *new_key, "-out", str(csr))
        openssl("x509", "-req", "-in", str(csr), "-CA", str(signer[1]), "-CAkey", str(signer[0]), "-CAcreateserial",
                "-days", "2", "-out", str(crt))
    return key, crt


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = ec_pair(d, "ca", "/CN=client-ca")
    return {"ca": ca, "trusted": ec_pair(d, "trusted", "/CN=prometheus", signer=ca),
            "self-signed": ec_pair(d, "self-signed", "/CN=anyone"), "dir": d}


# Go's crypto/tls, as exporter-toolkit configures it: who gets in with no certificate, one the
# client CA signed, and a self-signed one. RequireAnyClientCert is refused at load (below).
CLIENT_AUTH = {
    "NoClientCert": {None: True, "trusted": True, "self-signed": True},
    "RequestClientCert": {None: True, "trusted": True, "self-signed": True},  # asked, never checked
    "VerifyClientCertIfGiven": {None: True, "trusted": True, "self-signed": False},
    "RequireAndVerifyClientCert": {None: False, "trusted": True, "self-signed": False},
}


@pytest.mark.parametrize("client_auth", CLIENT_AUTH)
def test_client_auth_types_admit_whom_go_admits(cert, pki, state, client_auth):
    """The handshake, now on the selector's thread, admits the clients Go's would: with
    RequestClientCert a self-signed certificate gets in (Python's ssl refused it, checking
    what Go only asks for)."""
    tls = {"cert_file": str(cert / "cert.pem"), "key_file": str(cert / "key.pem"), "client_auth_type": client_auth}
    if client_auth != "NoClientCert":
        tls["client_ca_file"] = str(pki["ca"][1])
    security = parse_web_config({"tls_server_config": tls})
    server = Server(App(state, CollectorRegistry(), security=security), "127.0.0.1", 0, security, read_deadline=2.0).start()
    try:
        for presented, admitted in CLIENT_AUTH[client_auth].items():
            client_cert = None if presented is None else (str(pki[presented][1]), str(pki[presented][0]))
            try:
                got = requests.get(f"https://127.0.0.1:{server.port}/-/healthy", cert=client_cert, verify=str(cert / "cert.pem"),
                                   timeout=5).status_code
            except requests.exceptions.ConnectionError:
                got = None
            assert (got == 200) == admitted, (client_auth, presented, got)
    finally:
        server.stop()


@pytest.mark.parametrize("client_auth", ["RequireAnyClientCert", "RequireClientCert"])
def test_require_any_client_cert_is_refused_with_the_reason(cert, pki, client_auth):
    """Go requires a certificate and checks nothing; Python's ssl checks every certificate it
    receives, so the setting cannot be honoured: refused, naming why and what to use."""
    with pytest.raises(ConfigError) as exc:
        parse_web_config({"tls_server_config": {"cert_file": str(cert / "cert.pem"), "key_file": str(cert / "key.pem"),
                                                "client_auth_type": client_auth, "client_ca_file": str(pki["ca"][1])}})
    assert "Python's ssl" in exc.value.errors[0] and "RequireAndVerifyClientCert" in exc.value.errors[0], exc.value.errors


def test_client_cas_without_a_client_auth_type_are_an_error_as_in_go(cert, pki):
    with pytest.raises(ConfigError) as exc:
        parse_web_config({"tls_server_config": {"cert_file": str(cert / "cert.pem"), "key_file": str(cert / "key.pem"),
                                                "client_ca_file": str(pki["ca"][1])}})
    assert "without a client_auth_type" in exc.value.errors[0]


def test_an_inline_client_ca_verifies_like_the_file(cert, pki, state):
    security = parse_web_config({"tls_server_config": {
        "cert_file": str(cert / "cert.pem"), "key_file": str(cert / "key.pem"),
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca": pki["ca"][1].read_text()}})
    server = Server(App(state, CollectorRegistry(), security=security), "127.0.0.1", 0, security).start()
    try:
        base = f"https://127.0.0.1:{server.port}/-/healthy"
        trusted = (str(pki["trusted"][1]), str(pki["trusted"][0]))
        assert requests.get(base, cert=trusted, verify=str(cert / "cert.pem"), timeout=5).status_code == 200
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(base, verify=str(cert / "cert.pem"), timeout=5)
    finally:
        server.stop()


def served_certificate(port: int) -> bytes:
    import socket
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        return tls.getpeercert(binary_form=True)


def pem_der(path) -> bytes:
    import ssl
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def test_a_rotated_certificate_is_served_without_a_restart(tmp_path, state, caplog):
    """exporter-toolkit reads the certificate for every connection; here a changed file is
    loaded at the next connection (a stat each), so rotation needs no restart. A half-done
    rotation (the new certificate beside the old key) keeps the last good pair, says so
    once, and the finished one is served."""
    import os
    live = tmp_path / "live"
    live.mkdir()
    old, new, newer = (ec_pair(tmp_path, n, f"/CN={n}") for n in ("old", "new", "newer"))

    def install(pair, only=("tls.key", "tls.crt")):  # as a Secret's volume does: new files renamed over the old ones
        for src, dst in zip(pair, ("tls.key", "tls.crt")):
            if dst in only:
                (live / (dst + ".tmp")).write_bytes(src.read_bytes())
                os.replace(live / (dst + ".tmp"), live / dst)

    install(old)
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: live/tls.crt\n  key_file: live/tls.key\n")
    security = load_web_config(str(web))
    server = Server(App(state, CollectorRegistry(), security=security), "127.0.0.1", 0, security).start()
    try:
        assert served_certificate(server.port) == pem_der(old[1])
        install(new)
        assert served_certificate(server.port) == pem_der(new[1])
        install(newer, only=("tls.crt",))  # the certificate first, its key not yet
        with caplog.at_level("ERROR", logger="exporter.serve.webconfig"):
            assert served_certificate(server.port) == pem_der(new[1])
            assert served_certificate(server.port) == pem_der(new[1])
        assert len([r for r in caplog.records if "does not load" in r.getMessage()]) == 1
        install(newer, only=("tls.key",))
        assert served_certificate(server.port) == pem_der(newer[1])
        assert requests.get(f"https://127.0.0.1:{server.port}/-/healthy", verify=str(live / "tls.crt"), timeout=5).status_code == 200
    finally:
        server.stop()


def test_configured_headers_are_on_every_response(secure_server_with_headers):
    """http_server_config.headers, once accepted and ignored: on every answer, the probes'
    and a 401 too (exporter-toolkit sets them before its handler); the status page keeps
    its own Content-Security-Policy, as a Go handler that sets one does."""
    base, ca = secure_server_with_headers
    for path, auth, status in (("/-/healthy", None, 200), ("/metrics", None, 401), ("/metrics", ("prometheus", "right"), 200)):
        resp = requests.get(base + path, auth=auth, verify=str(ca), timeout=5)
        assert resp.status_code == status
        assert resp.headers["X-Frame-Options"] == "deny" and resp.headers["Strict-Transport-Security"] == "max-age=31536000"
        assert resp.headers["Content-Security-Policy"] == "default-src 'none'", path
    page = requests.get(base + "/", auth=("prometheus", "right"), verify=str(ca), timeout=5)
    from exporter.serve.statuspage import CONTENT_SECURITY_POLICY
    assert page.headers["X-Frame-Options"] == "deny" and page.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY


@pytest.fixture
def secure_server_with_headers(cert, tmp_path, state):
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert / 'cert.pem'}\n  key_file: {cert / 'key.pem'}\n"
                   f"http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n"
                   f"    Strict-Transport-Security: max-age=31536000\n    Content-Security-Policy: \"default-src 'none'\"\n"
                   f"    X-XSS-Protection: ''\n"
                   f"basic_auth_users:\n  prometheus: '{hashed('right')}'\n")
    security = load_web_config(str(web))
    server = Server(App(state, CollectorRegistry(), security=security), "127.0.0.1", 0, security).start()
    yield f"https://127.0.0.1:{server.port}", cert / "cert.pem"
    server.stop()


@pytest.mark.parametrize("data, error", [
    pytest.param({"http_server_config": {"http2": True}}, "HTTP/1.1 only", id="http2-on"),
    pytest.param({"http_server_config": {"headers": {"X-Powered-By": "us"}}}, "cannot be configured", id="header-not-allowed"),
    pytest.param({"http_server_config": {"headers": {"X-Frame-Options": "allow-from x"}}}, "one of deny, sameorigin", id="header-value"),
    pytest.param({"http_server_config": {"headers": {"Content-Security-Policy": "a\r\nSet-Cookie: x"}}}, "control characters", id="header-injection"),
    pytest.param({"http_server_config": {"http3": True}}, "unknown key", id="http-typo"),
    pytest.param({"rate_limit": {"interval": "1s", "burst": 5}}, "probes", id="rate-limit"),
    pytest.param({"tls_server_config": {"cert": "PEM", "key": "PEM"}}, "only from a file", id="inline-cert"),
    pytest.param({"tls_server_config": {"cert_file": "/etc/hostname", "key_file": "/etc/hostname",
                                        "cipher_suites": ["TLS_AES_128_GCM_SHA256"]}}, "OpenSSL's names", id="cipher-suites"),
    pytest.param({"tls_server_config": {"cert_file": "/etc/hostname", "key_file": "/etc/hostname",
                                        "client_allowed_sans": ["a"]}}, "not supported", id="allowed-sans"),
    pytest.param({"tls_server_config": {"cert_file": "/etc/hostname", "key_file": "/etc/hostname",
                                        "min_version": "TLS10"}}, "RFC 8996", id="tls10"),
    pytest.param({"tls_server_config": {"cert_file": "/etc/hostname", "key_file": "/etc/hostname",
                                        "client_auth_type": "RequireAndVerifyClientCert"}}, "client_ca_file: required", id="verify-without-ca"),
])
def test_what_cannot_be_honoured_is_refused_with_the_reason(data, error):
    """Never accepted and ignored: each exporter-toolkit setting we cannot honour is refused, saying why."""
    with pytest.raises(ConfigError) as exc:
        parse_web_config(data)
    assert any(error in e for e in exc.value.errors), exc.value.errors


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


def test_a_reload_rereads_the_web_config(tmp_path, cert):
    """SIGHUP's reload re-reads --web.config.file: a removed user is refused from the next
    request on (it kept access until a restart), new headers are sent; a bad file, or one
    that turns TLS on, keeps the old config, says so in one line and sets
    prefixcache_config_last_reload_successful to 0."""
    import logging
    import yaml
    from exporter.config.load import load_file
    from exporter.sidecar import build_sidecar

    cfg = tmp_path / "config.yml"
    cfg.write_text(yaml.safe_dump({"global": {"poll_interval": "1s", "connect_timeout": "200ms", "read_timeout": "200ms"},
                                   "targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/metrics"}]}))
    web = tmp_path / "web.yml"
    passwords = {"alice": hashed("pw-alice"), "bob": hashed("pw-bob")}

    def write_web(users, extra=None):
        web.write_text(yaml.safe_dump({"basic_auth_users": {u: passwords[u] for u in users}, **(extra or {})}))

    write_web(("alice", "bob"))
    sidecar = build_sidecar(load_file(str(cfg)), "127.0.0.1:0", security=load_web_config(str(web))).start()
    sidecar.web_config_file = str(web)
    base = f"http://127.0.0.1:{sidecar.server.port}"
    status = lambda user: requests.get(base + "/api/v1/status", auth=(user, f"pw-{user}"), timeout=5)  # noqa: E731
    try:
        assert status("alice").status_code == status("bob").status_code == 200
        write_web(("alice",), {"http_server_config": {"headers": {"X-Frame-Options": "deny"}}})
        assert sidecar.reload(str(cfg))
        assert status("bob").status_code == 401
        assert status("alice").status_code == 200 and status("alice").headers["X-Frame-Options"] == "deny"
        assert sidecar.state.published.config_reload_success

        for bad in ("basic_auth_users: [\n",
                    f"tls_server_config:\n  cert_file: {cert / 'cert.pem'}\n  key_file: {cert / 'key.pem'}\n"):
            web.write_text(bad)
            logger = logging.getLogger("exporter")
            records = []
            handler = logging.Handler()
            handler.emit = records.append
            logger.addHandler(handler)
            try:
                assert not sidecar.reload(str(cfg))
            finally:
                logger.removeHandler(handler)
            failures = [r.getMessage() for r in records if "keeping the old web config" in r.getMessage()]
            assert len(failures) == 1, [r.getMessage() for r in records]
            assert not sidecar.state.published.config_reload_success
            assert status("alice").status_code == 200 and status("alice").headers["X-Frame-Options"] == "deny"
            assert status("bob").status_code == 401
        assert "TLS on needs a restart" in failures[0]
    finally:
        sidecar.stop()


def test_a_reload_applies_tls_settings_from_the_next_connection(cert, pki, state):
    """Server.secure, what a reload calls: mutual TLS turned on is asked of the next connection."""
    plain_tls = {"cert_file": str(cert / "cert.pem"), "key_file": str(cert / "key.pem")}
    security = parse_web_config({"tls_server_config": plain_tls})
    server = Server(App(state, CollectorRegistry(), security=security), "127.0.0.1", 0, security).start()
    try:
        url = f"https://127.0.0.1:{server.port}/-/healthy"
        assert requests.get(url, verify=str(cert / "cert.pem"), timeout=5).status_code == 200
        server.secure(parse_web_config({"tls_server_config": {**plain_tls, "client_auth_type": "RequireAndVerifyClientCert",
                                                              "client_ca_file": str(pki["ca"][1])}}))
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(url, verify=str(cert / "cert.pem"), timeout=5)
        trusted = (str(pki["trusted"][1]), str(pki["trusted"][0]))
        assert requests.get(url, cert=trusted, verify=str(cert / "cert.pem"), timeout=5).status_code == 200
    finally:
        server.stop()

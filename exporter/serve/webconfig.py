"""`--web.config.file`: TLS, basic auth and response headers for our endpoints, in the
exporter-toolkit format every Prometheus exporter reads (tls_server_config,
http_server_config, basic_auth_users with bcrypt hashes), so one file serves the whole
fleet of exporters. Strict like the main config: a setting we cannot honour as
exporter-toolkit does is refused with the reason, never accepted and ignored.

Where Python's ssl module differs from Go's crypto/tls (docs/configuration.md has the table):
OpenSSL, as Python exposes it, has no verify callback, so every client certificate it asks
for is checked against the client CAs. Go's RequestClientCert asks, requires nothing and
checks nothing: here no certificate is asked for, which lets in exactly the clients Go lets
in. Go's RequireAnyClientCert requires a certificate and checks nothing: that cannot be
had here, so it is refused (RequireAndVerifyClientCert with client_ca_file is what
authenticates a client in either)."""
from __future__ import annotations

import base64
import binascii
import hmac
import logging
import os
import re
import ssl
import threading
from dataclasses import dataclass
from typing import Any, Callable

import bcrypt
import yaml

from ..config.reader import ConfigError
from ..peers import files, yamltext

log = logging.getLogger(__name__)

_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_ca", "client_auth_type", "min_version", "max_version",
             "prefer_server_cipher_suites"}
# exporter-toolkit's settings this server cannot honour, each with why: refused, not ignored
_TLS_REFUSED = {
    "cert": "an inline certificate is not supported: Python's ssl loads a certificate chain only from a file; use cert_file",
    "key": "an inline key is not supported: Python's ssl loads a key only from a file; use key_file",
    "cipher_suites": "not supported: Go names its TLS 1.2 suites, Python's ssl takes OpenSSL's names; Python's own "
                     "TLS 1.2 suites are used (forward-secret ECDHE and DHE with AES or ChaCha20, no SHA-1), and TLS 1.3's",
    "curve_preferences": "not supported: Python's ssl sets one curve, not an order; OpenSSL's default groups are used",
    "client_allowed_sans": "not supported: use RequireAndVerifyClientCert with a client_ca_file that signs only the allowed clients",
}
_TOP_REFUSED = {
    "rate_limit": "not supported: one global request limit would also refuse the kubelet's probes; "
                  "the server bounds what each connection can hold instead",
}
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE,
                # Go asks for a certificate and neither requires nor checks it; Python's ssl checks
                # whatever it asks for, so it does not ask: the same clients get in
                "RequestClientCert": ssl.CERT_NONE,
                "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_CLIENT_AUTH_REFUSED = (
    "cannot be honoured here: Go requires a client certificate and checks nothing, but Python's ssl "
    "checks every client certificate it receives against the client CAs, so it cannot accept one "
    "unchecked; use RequireAndVerifyClientCert with client_ca_file")
_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_OLD_VERSIONS = ("TLS10", "TLS11")  # Go's; deprecated by RFC 8996, and OpenSSL 3 has no cipher for them at its default level

# exporter-toolkit's http_server_config.headers: these names only, some with fixed values
EXTRA_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (), "X-Content-Type-Options": ("nosniff",), "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (), "Content-Security-Policy": (),
}
_HTTP_KEYS = {"headers", "http2"}
_HTTP2_REFUSED = ("http2: true cannot be honoured: this server speaks HTTP/1.1 only (TLS clients are offered "
                  "http/1.1 through ALPN); remove the key or set it to false")


@dataclass(frozen=True)
class TLSConfig:
    cert_file: str
    key_file: str
    client_ca_file: str = ""
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    client_ca: str = ""  # inline PEM, used when client_ca_file is not given
    prefer_server_cipher_suites: bool = True

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.cert_file, self.key_file, self.client_ca_file) if f)

    def context(self) -> ssl.SSLContext:
        """Reads the files now: raises ssl.SSLError or OSError when they do not load."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _VERSIONS[self.min_version]
        ctx.maximum_version = _VERSIONS[self.max_version]
        if not self.prefer_server_cipher_suites:
            ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
        ctx.set_alpn_protocols(["http/1.1"])  # what Go offers with http2 off
        ctx.load_cert_chain(self.cert_file, self.key_file)
        verify = _CLIENT_AUTH[self.client_auth_type]
        if verify != ssl.CERT_NONE:
            if self.client_ca_file:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            else:
                ctx.load_verify_locations(cadata=self.client_ca)
        ctx.verify_mode = verify
        return ctx


def _signature(paths: tuple[str, ...]) -> tuple:
    """What changes when a file is rewritten or a Kubernetes Secret's symlink swapped: a stat per file."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


class TLSContexts:
    """The SSLContext for the next connection. exporter-toolkit re-reads the certificate
    and key for every connection, so a rotated certificate is served without a restart;
    here each connection costs a stat of the (at most three) files, and a change loads
    them again. Files that do not load (a half-done rotation: the new certificate beside
    the old key) keep the last good context, with one log line, until they change again."""

    def __init__(self, config: TLSConfig):
        self.config = config
        self._signature = _signature(config.files)
        self._context = config.context()
        self._failed: tuple | None = None
        self._lock = threading.Lock()

    def current(self) -> ssl.SSLContext:
        signature = _signature(self.config.files)
        if signature == self._signature or signature == self._failed:
            return self._context
        with self._lock:
            if signature not in (self._signature, self._failed):
                try:
                    self._context = self.config.context()
                except (ssl.SSLError, OSError) as exc:
                    self._failed = signature
                    log.error("TLS: %s does not load (%s); serving the previous certificate until the files change",
                              ", ".join(self.config.files), exc)
                else:
                    self._signature, self._failed = signature, None
                    log.info("TLS: loaded the changed %s", ", ".join(self.config.files))
            return self._context


@dataclass(frozen=True)
class WebSecurity:
    tls: TLSConfig | None = None
    users: tuple[tuple[str, bytes], ...] = ()  # user -> bcrypt hash
    headers: tuple[tuple[str, str], ...] = ()  # http_server_config.headers, added to every response

    @property
    def basic_auth(self) -> bool:
        return bool(self.users)


MAX_WEB_CONFIG_BYTES = 1024 * 1024  # users and TLS settings: a few KiB


def load_web_config(path: str) -> WebSecurity:
    try:
        data = yamltext.load(files.read_text(path, MAX_WEB_CONFIG_BYTES), yaml.SafeLoader)
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None
    return parse_web_config(data, os.path.dirname(os.path.abspath(path)))


def parse_web_config(data: Any, base_dir: str = ".") -> WebSecurity:
    errors: list[str] = []
    if data is None:
        return WebSecurity()
    if not isinstance(data, dict):
        raise ConfigError(["<root>: must be a mapping"])
    for key in data:
        if key in _TOP_REFUSED:
            errors.append(f"{key}: {_TOP_REFUSED[key]}")
        elif key not in ("tls_server_config", "basic_auth_users", "http_server_config"):
            errors.append(f"{key}: unknown key (allowed: basic_auth_users, http_server_config, tls_server_config)")
    tls = None
    raw_tls = data.get("tls_server_config")
    if raw_tls is not None:
        if not isinstance(raw_tls, dict):
            errors.append("tls_server_config: must be a mapping")
        else:
            tls = _tls(raw_tls, base_dir, errors)
    headers = _http(data.get("http_server_config"), errors)
    users = []
    raw_users = data.get("basic_auth_users")
    if raw_users is not None:
        if not isinstance(raw_users, dict):
            errors.append("basic_auth_users: must be a mapping of user name to bcrypt hash")
        else:
            for user, hashed in raw_users.items():
                if not isinstance(hashed, str) or not _BCRYPT_HASH.fullmatch(hashed):
                    errors.append(f"basic_auth_users.{user}: must be a bcrypt hash ($2y$10$ and 53 characters of ./A-Za-z0-9)")
                    continue
                users.append((str(user), hashed.encode()))
    if errors:
        raise ConfigError(errors)
    return WebSecurity(tls, tuple(users), headers)


def _http(raw: Any, errors: list[str]) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        errors.append("http_server_config: must be a mapping")
        return ()
    for key in raw:
        if key not in _HTTP_KEYS:
            errors.append(f"http_server_config.{key}: unknown key (allowed: {', '.join(sorted(_HTTP_KEYS))})")
    http2 = raw.get("http2", False)
    if not isinstance(http2, bool):
        errors.append("http_server_config.http2: true or false")
    elif http2:
        errors.append(f"http_server_config.{_HTTP2_REFUSED}")
    headers = raw.get("headers") or {}
    if not isinstance(headers, dict):
        errors.append("http_server_config.headers: must be a mapping of header name to value")
        return ()
    out = []
    for name, value in headers.items():
        where = f"http_server_config.headers.{name}"
        if name not in EXTRA_HEADERS:
            errors.append(f"{where}: this header cannot be configured (allowed: {', '.join(sorted(EXTRA_HEADERS))})")
        elif not isinstance(value, str) or any(ord(c) < 32 or ord(c) == 127 for c in value):
            errors.append(f"{where}: must be a string without control characters")
        elif EXTRA_HEADERS[name] and value not in EXTRA_HEADERS[name]:
            errors.append(f"{where}: one of {', '.join(EXTRA_HEADERS[name])}, not {value!r}")
        elif value:  # blank: unset, as exporter-toolkit documents
            out.append((name, value))
    return tuple(out)


def _tls(raw: dict, base_dir: str, errors: list[str]) -> TLSConfig | None:
    for key in raw:
        if key in _TLS_REFUSED:
            errors.append(f"tls_server_config.{key}: {_TLS_REFUSED[key]}")
        elif key not in _TLS_KEYS:
            errors.append(f"tls_server_config.{key}: unknown key (allowed: {', '.join(sorted(_TLS_KEYS))})")
    values = {}
    for key in ("cert_file", "key_file", "client_ca_file"):
        value = raw.get(key)
        if value is None or value == "":
            continue
        path = value if os.path.isabs(str(value)) else os.path.join(base_dir, str(value))
        if not os.path.isfile(path):
            errors.append(f"tls_server_config.{key}: {value} does not exist")
        values[key] = path
    for key in ("cert_file", "key_file"):
        if key not in values and key[:-5] not in raw:
            errors.append(f"tls_server_config.{key}: required")
    client_ca = raw.get("client_ca") or ""
    if not isinstance(client_ca, str):
        errors.append("tls_server_config.client_ca: a PEM text")
        client_ca = ""
    auth = raw.get("client_auth_type") or "NoClientCert"
    if not isinstance(auth, str):
        errors.append(f"tls_server_config.client_auth_type: one of {', '.join(_CLIENT_AUTH)}")
        auth = "NoClientCert"
    elif auth in ("RequireAnyClientCert", "RequireClientCert"):
        errors.append(f"tls_server_config.client_auth_type: {auth} {_CLIENT_AUTH_REFUSED}")
    elif auth not in _CLIENT_AUTH:
        errors.append(f"tls_server_config.client_auth_type: one of {', '.join(_CLIENT_AUTH)}")
    has_ca = "client_ca_file" in values or bool(client_ca)
    if _CLIENT_AUTH.get(auth, ssl.CERT_NONE) != ssl.CERT_NONE and not has_ca:
        # Go would check against the system's roots: any certificate a public CA issued would pass
        errors.append(f"tls_server_config.client_ca_file: required with client_auth_type {auth}")
    if has_ca and auth == "NoClientCert":
        errors.append("tls_server_config.client_ca_file: client CAs are configured without a client_auth_type that asks for a certificate")
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        version = raw.get(key, default)
        if not isinstance(version, str):
            errors.append(f"tls_server_config.{key}: one of {', '.join(_VERSIONS)}")
        elif version in _OLD_VERSIONS:
            errors.append(f"tls_server_config.{key}: {version} is not supported (deprecated by RFC 8996; "
                          "OpenSSL 3 has no cipher for it at its default security level); one of TLS12, TLS13")
        elif version not in _VERSIONS:
            errors.append(f"tls_server_config.{key}: one of {', '.join(_VERSIONS)}")
    prefer = raw.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        errors.append("tls_server_config.prefer_server_cipher_suites: true or false")
    if errors or "cert_file" not in values or "key_file" not in values:
        return None
    if _VERSIONS[raw.get("min_version", "TLS12")] > _VERSIONS[raw.get("max_version", "TLS13")]:
        errors.append("tls_server_config.min_version: above max_version")
        return None
    cfg = TLSConfig(values["cert_file"], values["key_file"], values.get("client_ca_file", ""), auth,
                    raw.get("min_version", "TLS12"), raw.get("max_version", "TLS13"),
                    client_ca if "client_ca_file" not in values else "", prefer)
    try:
        cfg.context()
    except (ssl.SSLError, OSError) as exc:
        errors.append(f"tls_server_config: cannot load the certificate, key or client CAs: {exc}")
        return None
    return cfg


# bcrypt reads only the first 72 bytes of a password: the hash of a longer one was made
# from those (htpasswd -B, bcrypt < 5), and Go's bcrypt, which exporter-toolkit checks
# with, compares those alone. bcrypt 5 raises on a longer password instead, so we cut it.
BCRYPT_MAX_PASSWORD = 72


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes. Every failure that names a
    user costs one bcrypt check at the configured cost (an unknown user is checked
    against a dummy hash) and answers the same, so user names cannot be probed. A
    bcrypt check costs tens of milliseconds by design, so a verified (user, password)
    is remembered, keyed by a digest of both, as exporter-toolkit does."""

    def __init__(self, users: tuple[tuple[str, bytes], ...], checkpw: Callable[[bytes, bytes], bool] = bcrypt.checkpw):
        self.users = dict(users)
        self._checkpw = checkpw
        cost = max((bcrypt_cost(h) for h in self.users.values()), default=10)
        self.dummy = f"$2b${cost:02d}$".encode() + b"." * 53  # well formed; no password hashes to it
        self._verified: set[bytes] = set()
        self._lock = threading.Lock()

    def _candidate(self, header: str) -> tuple[bytes, bytes, bytes | None, bytes] | None:
        """(remembered key, password, the user's hash or None, the hash to check against)."""
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() != "basic" or not value:
            return None
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except binascii.Error:
            return None
        # the password stays bytes: Go compares bytes, whatever their encoding
        user_bytes, sep, password = decoded.partition(b":")
        hashed = self.users.get(user_bytes.decode("utf-8", "replace")) if sep else None
        candidate = hashed if hashed is not None else self.dummy
        return hmac.new(candidate, user_bytes + b"\0" + password, "sha256").digest(), password, hashed, candidate

    def remembered(self, header: str) -> bool:
        """Credentials verified before: checked without bcrypt."""
        found = self._candidate(header)
        if found is None or found[2] is None:
            return False
        with self._lock:
            return found[0] in self._verified

    def check(self, header: str) -> bool:
        found = self._candidate(header)
        if found is None:
            return False
        key, password, hashed, candidate = found
        if hashed is not None:
            with self._lock:
                if key in self._verified:
                    return True
        try:
            ok = self._checkpw(password[:BCRYPT_MAX_PASSWORD], candidate)
        except ValueError:  # a bcrypt that refuses what it is given is a failed check, never a 500
            ok = False
        if not ok or hashed is None:
            return False
        with self._lock:
            if len(self._verified) > 1000:
                self._verified.clear()
            self._verified.add(key)
        return True


_BCRYPT_HASH = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")


def bcrypt_cost(hashed: bytes) -> int:
    return int(hashed[4:6])

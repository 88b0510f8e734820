"""`--web.config.file`: TLS and basic auth for our endpoints, in the exporter-toolkit
format every Prometheus exporter reads (tls_server_config, basic_auth_users with bcrypt
hashes), so one file serves the whole fleet of exporters. Strict like the main config."""
from __future__ import annotations

import base64
import binascii
import hmac
import os
import ssl
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable

import bcrypt
import yaml

from ..config.reader import ConfigError

_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"}
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_OPTIONAL,
                "RequireAnyClientCert": ssl.CERT_REQUIRED, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


@dataclass(frozen=True)
class TLSConfig:
    cert_file: str
    key_file: str
    client_ca_file: str = ""
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str = "TLS13"

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _VERSIONS[self.min_version]
        ctx.maximum_version = _VERSIONS[self.max_version]
        ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            ctx.load_verify_locations(self.client_ca_file)
        ctx.verify_mode = _CLIENT_AUTH[self.client_auth_type]
        return ctx


@dataclass(frozen=True)
class WebSecurity:
    tls: TLSConfig | None = None
    users: tuple[tuple[str, bytes], ...] = ()  # user -> bcrypt hash

    @property
    def basic_auth(self) -> bool:
        return bool(self.users)


def load_web_config(path: str) -> WebSecurity:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh.read())
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
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
        if key not in ("tls_server_config", "basic_auth_users", "http_server_config"):
            errors.append(f"{key}: unknown key (allowed: basic_auth_users, http_server_config, tls_server_config)")
    tls = None
    raw_tls = data.get("tls_server_config")
    if raw_tls is not None:
        if not isinstance(raw_tls, dict):
            errors.append("tls_server_config: must be a mapping")
        else:
            tls = _tls(raw_tls, base_dir, errors)
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
    return WebSecurity(tls, tuple(users))


def _tls(raw: dict, base_dir: str, errors: list[str]) -> TLSConfig | None:
    for key in raw:
        if key not in _TLS_KEYS:
            errors.append(f"tls_server_config.{key}: unknown key (allowed: {', '.join(sorted(_TLS_KEYS))})")
    values = {}
    for key in ("cert_file", "key_file", "client_ca_file"):
        value = raw.get(key)
        if value is None:
            continue
        path = value if os.path.isabs(str(value)) else os.path.join(base_dir, str(value))
        if not os.path.isfile(path):
            errors.append(f"tls_server_config.{key}: {value} does not exist")
        values[key] = path
    for key in ("cert_file", "key_file"):
        if key not in values:
            errors.append(f"tls_server_config.{key}: required")
    auth = raw.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        errors.append(f"tls_server_config.client_auth_type: one of {', '.join(_CLIENT_AUTH)}")
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        if raw.get(key, default) not in _VERSIONS:
            errors.append(f"tls_server_config.{key}: one of {', '.join(_VERSIONS)}")
    if auth.startswith(("RequireAndVerify", "VerifyClient")) and "client_ca_file" not in values:
        errors.append(f"tls_server_config.client_ca_file: required with client_auth_type {auth}")
    if errors or "cert_file" not in values or "key_file" not in values:
        return None
    cfg = TLSConfig(values["cert_file"], values["key_file"], values.get("client_ca_file", ""), auth,
                    raw.get("min_version", "TLS12"), raw.get("max_version", "TLS13"))
    try:
        cfg.context()
    except (ssl.SSLError, OSError) as exc:
        errors.append(f"tls_server_config: cannot load the certificate and key: {exc}")
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

    def check(self, header: str) -> bool:
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() != "basic" or not value:
            return False
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except binascii.Error:
            return False
        # the password stays bytes: Go compares bytes, whatever their encoding
        user_bytes, sep, password = decoded.partition(b":")
        hashed = self.users.get(user_bytes.decode("utf-8", "replace")) if sep else None
        candidate = hashed if hashed is not None else self.dummy
        key = hmac.new(candidate, user_bytes + b"\0" + password, "sha256").digest()
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

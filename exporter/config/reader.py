"""How the config is read: the strict reader (unknown keys and bad values are recorded with their key path,
never raised one by one), the value parsers it applies (durations, sizes, URLs, ratios...) and secrets read
from files. Every config section (sections.py, discovery.py) reads through it."""
from __future__ import annotations

import errno
import re
from typing import Any, Callable
from urllib.parse import urlsplit


class ConfigError(Exception):
    """Every problem of a config at once, each with its key path; `source` says which file kind (the run log names it)."""

    def __init__(self, errors: list[str], source: str = "config"):
        super().__init__("\n".join(errors))
        self.errors = errors
        self.source = source


# --- value parsers: text -> value, or raise ValueError with a message ----------------
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB)?$")
_SIZE_UNITS = {None: 1, "B": 1, "KB": 1000, "KiB": 1024, "MB": 1000**2, "MiB": 1024**2, "GB": 1000**3, "GiB": 1024**3}
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def parse_duration(value: Any) -> float:
    """Prometheus durations (`5s`, `1m30s`, `500ms`); a bare number is seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 5s, 1m or 1h30m")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError("must be positive")
        return float(value)
    text = str(value).strip()
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            raise ValueError(f"{value!r} is not a duration like 5s, 1m or 1h30m")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if total <= 0:
        raise ValueError(f"{value!r} must be a positive duration")
    return total


def parse_size(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected a size like 16MiB")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("must be positive")
        return value
    m = _SIZE.match(str(value).strip())
    if m is None:
        raise ValueError(f"{value!r} is not a size like 16MiB")
    size = int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    if size <= 0:
        raise ValueError("must be positive")
    return size


def parse_listen_address(value: Any) -> tuple[str, int]:
    text = str(value)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def http_url(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string URL")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value


def base_url(value: Any) -> str:
    """An http(s) URL that an API's path is appended to (a Prometheus, an Alertmanager): a
    query or fragment would end up before that path (`/?x=1/api/v1/query`)."""
    value = http_url(value)
    parts = urlsplit(value)
    if parts.query or parts.fragment or value.endswith(("?", "#")):
        raise ValueError(f"{value!r}: the API's path is appended to it, so it takes no query or fragment")
    return value


def non_negative_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError("must be a non-negative number")
    return float(value)


def nonempty_string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string")
    return value


def no_files(path: str) -> str:
    """The file reader of a config given as text: it names no file of its own to read."""
    raise OSError(errno.EPERM, "the files a config names are read only from a config file (check-config, run)")


class Reader:
    """Walks a mapping, records errors with their path, never raises. Files the config
    names (its secrets) are read by `read_file`, given by whoever read the config itself
    (exporter/config/load.py), so the parse stays pure."""

    def __init__(self, errors: list[str], read_file: Callable[[str], str] = no_files):
        self.errors = errors
        self.read_file = read_file

    def mapping(self, value: Any, path: str, allowed: set[str]) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.errors.append(f"{path or '<root>'}: must be a mapping")
            return {}
        for key in value:
            if key not in allowed:
                self.errors.append(f"{join_path(path, str(key))}: unknown key (allowed: {', '.join(sorted(allowed))})")
        return value

    def value(self, data: dict, path: str, key: str, parse: Callable[[Any], Any], default: Any) -> Any:
        if key not in data:
            return default
        try:
            return parse(data[key])
        except (ValueError, TypeError) as exc:
            self.errors.append(f"{join_path(path, key)}: {exc}")
            return default


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def limit_or_zero(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("must be a whole number, 0 for no limit")
    return value


def positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError("must be a positive whole number")
    return value


def severity(value: Any) -> str:
    if value not in ("critical", "warning", "info"):
        raise ValueError("must be critical, warning or info")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def ratio(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError("must be a number from 0 to 1")
    return float(value)


def duration_or_zero(value: Any) -> float:
    return 0.0 if value in (0, "0", "0s") else parse_duration(value)


def label_name(value: Any) -> str:
    if not isinstance(value, str) or not LABEL_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid label name")
    return value


MAX_SECRET_FILE = 64 * 1024


def read_secret(r: Reader, data: dict, path: str, key: str, absent_ok: bool = False) -> str:
    """`key` inline or `key_file` (read now, so a missing file is a config error, or with
    `absent_ok` no secret: an optional Kubernetes Secret that was not created mounts nothing)."""
    if key in data and f"{key}_file" in data:
        r.errors.append(f"{path}.{key}: give {key} or {key}_file, not both")
    if f"{key}_file" in data:
        file_path = r.value(data, path, f"{key}_file", nonempty_string, "")
        try:
            secret = r.read_file(file_path).strip()
        except FileNotFoundError:
            if absent_ok:
                return ""
            r.errors.append(f"{path}.{key}_file: cannot read {file_path}: No such file or directory")
            return ""
        except OSError as exc:
            r.errors.append(f"{path}.{key}_file: cannot read {file_path}: {exc.strerror or exc}")
            return ""
        if not secret:
            # an empty token would turn authentication off: fail closed
            r.errors.append(f"{path}.{key}_file: {file_path} is empty")
        elif any(ord(c) < 32 or ord(c) == 127 for c in secret):
            r.errors.append(f"{path}.{key}_file: {file_path} holds control characters")
        return secret
    return r.value(data, path, key, nonempty_string, "")

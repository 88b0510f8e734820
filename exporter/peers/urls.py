"""URLs as we show them: never with a password, never a crash on a hostile one."""
from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """The URL without a password: for logs, labels and the status API. A URL that does
    not parse (a bad IPv6 host, a port out of range) is named as such, not raised: it
    comes from config files, discovery answers and webhook bodies."""
    try:
        parts = urlsplit(url)
        if parts.username is None and parts.password is None:
            return url
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparsable URL>"
    if ":" in host:
        host = f"[{host}]"
    if port is not None:
        host += f":{port}"
    return urlunsplit((parts.scheme, f"{parts.username or ''}:xxxxx@{host}", parts.path, parts.query, parts.fragment))

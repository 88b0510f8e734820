"""A whole simple request answered by the server's selector thread, without a worker.

Fifty scrapers that ask /metrics at the same instant waited 30x one scrape's time at the
p99 on 2 cores, where a C server sending the same bytes waited 1.6x: the cost was not the
bytes but the hops of each request between threads (the selector, a worker, the
interpreter lock handed back and forth, each hand-off a wait for a core). The answers
those scrapers and the kubelet's probes get are ready in memory, so the thread that read
the request writes them at once, into the socket's buffer without blocking. What is not
simple is left to the workers as before: TLS, HTTP/1.0, a body, a second request behind
the first, a percent-encoded path, an answer not ready (App.answer_now says None), and
what of an answer the socket's buffer did not take.

Pure functions: what a request head asks (`simple_request`) and the head of our answer
(`response_head`); `send_now` is the one non-blocking write.
"""
from __future__ import annotations

import email.utils
import os

# headers that announce a body or ask something of the connection a worker handles
_NOT_SIMPLE = {"HTTP_CONTENT_LENGTH", "HTTP_TRANSFER_ENCODING", "HTTP_EXPECT", "HTTP_UPGRADE"}


def simple_request(data: bytes) -> dict[str, str] | None:
    """The WSGI environ (method, path, query, HTTP_ headers) of `data` when it is exactly
    one GET or HEAD in HTTP/1.1, with no body and a plain path; None for anything else.
    Header fields are read as cheroot reads them: names case-insensitive, values trimmed,
    a repeated field's values joined with commas."""
    end = data.find(b"\r\n\r\n")
    if end < 0 or end + 4 != len(data):
        return None
    lines = data[:end].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD") or parts[2] != b"HTTP/1.1":
        return None
    path, _, query = parts[1].partition(b"?")
    if not path.startswith(b"/") or b"%" in path or b"#" in parts[1]:
        return None
    try:
        environ = {"REQUEST_METHOD": parts[0].decode("ascii"), "PATH_INFO": path.decode("ascii"),
                   "QUERY_STRING": query.decode("ascii"), "SERVER_PROTOCOL": "HTTP/1.1"}
    except UnicodeDecodeError:
        return None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip(b" \t"):  # no field, or obsolete line folding
            return None
        key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
        if key in _NOT_SIMPLE:
            return None
        text = value.strip(b" \t").decode("latin-1")
        environ[key] = f"{environ[key]}, {text}" if key in environ else text
    return environ


def wants_close(environ: dict[str, str]) -> bool:
    return any(token.strip().lower() == "close" for token in environ.get("HTTP_CONNECTION", "").split(","))


def response_head(status: str, headers: list[tuple[str, str]], close: bool, server_name: str) -> bytes:
    """The status line and header fields, as cheroot writes them for the same answer."""
    lines = [f"HTTP/1.1 {status}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers]
    if close:
        lines.append("Connection: close\r\n")
    lines.append(f"Date: {email.utils.formatdate(usegmt=True)}\r\nServer: {server_name}\r\n\r\n")
    return "".join(lines).encode("latin-1")


def send_now(fd: int, chunks: list[bytes]) -> list[memoryview]:
    """Writes what the socket's buffer takes of `chunks` without waiting (the socket is
    non-blocking: Python keeps a socket with a timeout so); returns what is left."""
    try:
        sent = os.writev(fd, chunks)
    except BlockingIOError:
        sent = 0
    left = []
    for chunk in chunks:
        if sent >= len(chunk):
            sent -= len(chunk)
            continue
        left.append(memoryview(chunk)[sent:])
        sent = 0
    return left

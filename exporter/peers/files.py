"""Files users hand us (the config, the web config, file_sd files, the deploy annotations,
request samples): read whole, bounded, never blocking.

A path can name a FIFO nobody writes to, /dev/zero, a 2 GB file or bytes that are not
UTF-8. Opening does not block, anything but a regular file is refused, at most
`max_bytes` + 1 bytes are ever read whatever the file claims its size is, and every
refusal is an OSError whose strerror says why, for the caller's one clear error.
"""
from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_READ_CHUNK = 1024 * 1024


def open_regular(path: str) -> BinaryIO:
    """`path` opened for reading as a stream, if it is a regular file: the way to read a
    file too large to hold (a recording), where read_text reads a bounded one whole."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        # checked once open: a FIFO swapped in after a stat must not hang us
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO or a device is never read)")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file `path`, of at most `max_bytes`."""
    with open_regular(path) as fh:
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = fh.read(min(_READ_CHUNK, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    if size > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes")
    return b"".join(chunks)


def read_text(path: str, max_bytes: int) -> str:
    """The UTF-8 text of the regular file `path`, of at most `max_bytes` bytes."""
    data = read_bytes(path, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OSError(errno.EILSEQ, f"not UTF-8 text (byte {exc.start})") from None

"""One gzip member of a text-format answer whose lines arrive target by target but must
be sent family by family (a family's lines are one group: the text format).

Each family's lines are compressed as they arrive, each piece ending with a full flush:
its compressed bytes then depend on nothing before them, so the pieces, laid end to end
family by family, are one deflate stream (RFC 1951: blocks that end on a byte
boundary, none of them final, then one empty final block). The gzip trailer's CRC-32 of
the whole text is combined from each family's (below), so no text of the answer is ever
held whole: at 10,000 pods it was 150 MB, kept between renders only to be joined and
compressed at the next one.
"""
from __future__ import annotations

import struct
import zlib

# CRC-32 (the gzip one) as polynomial arithmetic over GF(2), bits reflected: the CRC of
# A then B is the CRC of A times x^(8 len B), plus the CRC of B (mod the polynomial).
_POLY = 0xEDB88320
_ONE = 1 << 31  # x^0, reflected


def _times(a: int, b: int) -> int:
    """a times b modulo the CRC polynomial."""
    product, bit = 0, _ONE
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


def _powers() -> tuple[int, ...]:
    """x^(2^k) modulo the polynomial, k = 0..63: x^(8n) is a product of some of them."""
    out = [_ONE >> 1]  # x^1
    for _ in range(63):
        out.append(_times(out[-1], out[-1]))
    return tuple(out)


_X_TO_2_TO = _powers()


def _x_to_8(n: int) -> int:
    """x^(8n) modulo the polynomial: n bytes of shift."""
    power, k = _ONE, 3
    while n:
        if n & 1:
            power = _times(_X_TO_2_TO[k % 64], power)
        n >>= 1
        k += 1
    return power


def crc32_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """zlib.crc32(a + b) from zlib.crc32(a), zlib.crc32(b) and len(b)."""
    return _times(_x_to_8(length_b), crc_a) ^ crc_b if length_b else crc_a


# RFC 1952: magic, deflate, no flags, no time, no extra flags, unknown OS
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
_LAST_BLOCK = b"\x03\x00"  # an empty final block with fixed codes


BATCH = 256  # parts whose lines are compressed together (some 4 MB at 10,000 pods): a call a part and family was a fifth of a render


class _Family:
    __slots__ = ("out", "crc", "size")

    def __init__(self):
        self.out: list[bytes] = []
        self.crc = 0
        self.size = 0


class FamilyGzip:
    """Feed it parts (family name -> that part's lines of the family) in any order of
    parts; `finish` gives the gzip member of the text in which each family is its
    `header` bytes, then its lines from every part in the order the parts came, the
    families in the order they first came (and sets `size`, the text's bytes).

    The lines of BATCH parts are compressed a family at a time, each ending with a full
    flush, by one compressor: every family's pieces are then its own, to be laid end to
    end in the family's order (a compressor a family held 60 deflate states, 16 MB, on
    every render of even one target)."""

    def __init__(self, header):
        self.header = header  # family name -> the bytes before its first line (HELP and TYPE)
        self._families: dict[str, _Family] = {}
        self._pending: dict[str, list[bytes]] = {}  # family -> lines not compressed yet
        self._parts = 0
        self._deflate = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS)  # level 1, as the whole answer had
        self.size = 0

    def add(self, part: dict[str, bytes]) -> None:
        pending = self._pending
        for name, lines in part.items():
            waiting = pending.get(name)
            if waiting is None:
                pending[name] = waiting = [] if name in self._families else [self.header(name)]
            waiting.append(lines)
        self._parts += 1
        if self._parts % BATCH == 0:
            self._compress()

    def _compress(self) -> None:
        families, deflate = self._families, self._deflate
        for name, waiting in self._pending.items():
            family = families.get(name)
            if family is None:
                family = families[name] = _Family()
            text = b"".join(waiting)
            family.crc = zlib.crc32(text, family.crc)
            family.size += len(text)
            family.out.append(deflate.compress(text) + deflate.flush(zlib.Z_FULL_FLUSH))
        self._pending = {}

    def finish(self) -> bytes:
        self._compress()
        chunks, crc, size = [_GZIP_HEADER], 0, 0
        for family in self._families.values():
            chunks.extend(family.out)
            crc = crc32_combine(crc, family.crc, family.size)
            size += family.size
        self._families = {}
        self.size = size
        chunks.append(_LAST_BLOCK)
        chunks.append(struct.pack("<II", crc, size & 0xFFFFFFFF))
        return b"".join(chunks)

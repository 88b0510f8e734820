"""What reading an answer of Prometheus's query API costs in memory, told from its bytes before
it is decoded, and the budget a read's answer gets (discovery.read_prometheus.max_answer times
DECODED_PER_BYTE): an answer over it is refused with the partitions that would bring each
answer under it, before it costs anything. Pure."""
from __future__ import annotations

from ..peers.promapi import DECODED_PER_BYTE, WHOLE_COST
from .targets import DiscoveryError

# the start of every answer in the layout Prometheus writes (promseries reads it from its text)
PROLOGUE = b'{"status":"success","data":{"resultType":"matrix","result":['

# What reading an answer costs at its peak, in bytes of Python objects beside the answer's own
# bytes (tracemalloc; measured shapes in tests/test_promread.py): upper bounds, each from the
# costliest shape measured. Read from its ASCII text in Prometheus's layout: a series costs
# up to 2.6 KB (every series its own label set), a sample up to 430 B (one series of 200,000
# samples), the text itself its size again; the same answer with non-ASCII characters holds
# its texts at up to 4 bytes a character. Decoded whole (any other layout): up to 25 bytes a
# byte (an answer of `{}` or `[]`). A fleet's answer (45 series a pod, 3 samples each)
# measures 3.7-6.0 bytes a byte read from its text (1-12 samples a series) and is estimated at
# 12.7-18.7: every estimate is 1.1 to 9 times what was measured, never under it.
# (WHOLE_COST is peers/promapi.py's, which decodes answers whole)
SERIES_COST, SAMPLE_COST, WIDE_COST = 2_700, 450, 8
# DECODED_PER_BYTE (peers/promapi.py): the estimated cost an answer may have, per byte of
# max_answer (64 MiB: 1.25 GiB): at least what a fleet's answer of up to 12 samples a series
# is estimated at (a regular read's slice holds 2-4), so that such an answer is refused only
# over max_answer; one of 40 samples a series (estimated at 23, measured 9.2) is refused from
# 87% of it, its error naming the partitions that read it
__all__ = ["DECODED_PER_BYTE", "WHOLE_COST", "decoded_budget", "decoded_cost", "too_costly", "AnswerTooCostly"]


def decoded_budget(max_answer: int) -> int:
    return DECODED_PER_BYTE * max_answer


def decoded_cost(body: bytes) -> int:
    """An upper bound of what reading `body` costs (promseries.pods_of_answer), counted
    on the bytes, before a str or an object of them is made. The text's series are counted by
    their `{"metric":`, their samples by the `],[` between two (with no backslash in the text no
    string holds a quote, so neither is counted low)."""
    if not body.startswith(PROLOGUE) or b"\\" in body:
        return WHOLE_COST * len(body)
    series = body.count(b'{"metric":')
    cost = len(body) + SERIES_COST * series + SAMPLE_COST * (body.count(b"],[") + series)
    return cost + (0 if body.isascii() else WIDE_COST * len(body))


class AnswerTooCostly(DiscoveryError):
    """An answer whose reading would cost more than its budget: refused before it is decoded."""


def too_costly(body: bytes, where: str, cost: int, budget: int, partitions: int) -> AnswerTooCostly:
    need = partitions * -(-cost // budget)
    return AnswerTooCostly(
        f"{where}: answer of {len(body)} bytes would cost up to {cost >> 20} MiB read (estimated before decoding it), over "
        f"the {budget >> 20} MiB allowed ({DECODED_PER_BYTE} times read_prometheus.max_answer); refused: split the read "
        f"(read_prometheus.partitions: {need} or more) or raise max_answer")

"""Memory freed inside the C heap given back to the system (exporter/serve/heaptrim.py):
against this machine's glibc, what a process freed below the top of its heap stays in
its RSS until malloc_trim; the trimmer waits for a pause in the scrapes, and trims anyway
after an interval without one."""
import sys
import threading

import pytest

from exporter.serve.heaptrim import HeapTrimmer, trim_function

from conftest import wait_for


def rss_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux") or trim_function() is None, reason="glibc's malloc_trim")
def test_what_was_freed_below_the_heaps_top_leaves_the_rss_only_with_a_trim():
    trim = trim_function()
    trim()
    # 64 MiB in 28 KiB blocks (a target's history arrays are about that size), every other one
    # freed, the last kept: the holes sit below the heap's top, which glibc alone never gives back
    blocks = [bytearray(28 * 1024) for _ in range(64 * 1024 // 28)]
    keep = blocks[1::2]
    del blocks
    before = rss_kib()
    trim()
    after = rss_kib()
    assert before - after > 16 * 1024, (before, after)  # of the 32 MiB freed in holes
    assert all(len(b) == 28 * 1024 and not any(b[:64]) for b in keep)  # what is kept stays, intact


def test_a_trim_waits_for_a_pause_in_the_scrapes():
    trims = []
    quiet = [0.0]
    trimmer = HeapTrimmer(lambda: quiet[0], lambda: trims.append(1) or 1)
    assert trimmer.step() is False and trims == []  # a scrape under way
    quiet[0] = 0.5
    assert trimmer.step() is True and trims == [1] and trimmer.trims == 1


def test_the_trimmer_trims_every_interval_and_anyway_after_one_without_a_pause_and_stops():
    trims = []
    scraping = threading.Event()
    trimmer = HeapTrimmer(lambda: 0.0 if scraping.is_set() else 1.0, lambda: trims.append(1) or 1, every=0.05, look=0.01)
    trimmer.start()
    try:
        assert wait_for(lambda: len(trims) >= 2, timeout=5.0)
        scraping.set()  # scrapes that never pause: one trim an interval and a wait, still
        count = len(trims)
        assert wait_for(lambda: len(trims) >= count + 2, timeout=5.0)
    finally:
        trimmer.stop()
    trimmer._thread.join(timeout=5.0)
    assert not trimmer._thread.is_alive()


def test_a_trim_that_fails_is_logged_and_the_trimmer_stops(caplog):
    def broken():
        raise OSError("no heap")

    trimmer = HeapTrimmer(lambda: 1.0, broken, every=0.01)
    trimmer.start()
    trimmer._thread.join(timeout=5.0)
    assert not trimmer._thread.is_alive() and "heap trim failed" in caplog.text

"""exporter/peers/files.py: a file users hand us is read whole, bounded, never blocking."""
import errno
import os

import pytest

from exporter.peers import files


def test_a_fifo_or_device_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero", "/dev/null"):
        with pytest.raises(OSError) as exc:
            files.read_text(str(path), 100)
        assert exc.value.errno == errno.EINVAL and "not a regular file" in exc.value.strerror


def test_a_file_over_the_cap_is_refused_having_read_one_byte_past_it(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("x" * 101)
    with pytest.raises(OSError, match="larger than 100 bytes"):
        files.read_text(str(big), 100)
    assert files.read_text(str(big), 101) == "x" * 101


def test_a_sparse_2_gb_file_costs_only_the_cap(tmp_path):
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as fh:
        fh.truncate(2 * 1024 ** 3)  # no disk used: the read must stop at the cap, not allocate 2 GB
    with pytest.raises(OSError) as exc:
        files.read_text(str(sparse), 1024 * 1024)
    assert exc.value.errno == errno.EFBIG


def test_bytes_that_are_not_utf8_are_named_by_their_offset(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_bytes(b"key: caf\xe9\n")
    with pytest.raises(OSError) as exc:
        files.read_text(str(bad), 100)
    assert exc.value.errno == errno.EILSEQ and exc.value.strerror == "not UTF-8 text (byte 8)"


def test_a_missing_file_is_the_systems_own_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        files.read_text(str(tmp_path / "nope"), 100)

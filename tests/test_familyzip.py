"""The answer's gzip assembled family by family (exporter/serve/familyzip.py): one gzip
member, as the readers Prometheus and Python use check it (CRC-32 and size included), of
each family's header and lines in the order they came, whatever order the parts mix
them in."""
import gzip
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.serve import familyzip
from exporter.serve.familyzip import FamilyGzip, crc32_combine

texts = st.binary(max_size=3000)


@given(texts, texts)
def test_crc32_combine_is_the_crc_of_the_two_joined(a, b):
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_crc32_combine_across_lengths_of_a_large_render():
    """The shift is by the powers of two of the length, one a bit: to 2 MiB here."""
    a = b"prefixcache_hit_ratio 0.5\n"
    for length in (1, 7, 4096, 2**20 + 3, 2**21):
        assert crc32_combine(zlib.crc32(a), zlib.crc32(bytes(length)), length) == zlib.crc32(a + bytes(length))


parts = st.lists(st.dictionaries(st.sampled_from(["a", "b", "c", "d_bucket"]), st.binary(max_size=400), max_size=4), max_size=30)


@settings(max_examples=200)
@given(parts, st.sampled_from([1, 3, familyzip.BATCH]))
def test_the_member_is_each_family_grouped_in_the_order_it_first_came(chunks, batch):
    header = lambda name: f"# TYPE {name} gauge\n".encode()  # noqa: E731
    answer = FamilyGzip(header)
    grouped: dict[str, list[bytes]] = {}
    default, familyzip.BATCH = familyzip.BATCH, batch  # compressed a part at a time, or a few, or all at the end
    try:
        for part in chunks:
            answer.add(part)
            for name, lines in part.items():
                grouped.setdefault(name, [header(name)]).append(lines)
        zipped = answer.finish()
    finally:
        familyzip.BATCH = default
    expected = b"".join(b"".join(lines) for lines in grouped.values())
    assert answer.size == len(expected)
    assert gzip.decompress(zipped) == expected  # checks the trailer's CRC-32 and size
    one_member = zlib.decompressobj(16 + zlib.MAX_WBITS)  # a reader that stops after the first member gets it all
    assert one_member.decompress(zipped) == expected and one_member.eof and not one_member.unused_data


def test_lines_that_repeat_across_parts_compress_as_one_stream_per_family():
    """A family's lines from 1,000 targets share one deflate stream: the answer compresses
    as the whole text did, not as 1,000 fragments compressed apart."""
    answer = FamilyGzip(lambda name: b"")
    text = []
    for i in range(1000):
        part = {f"family_{k}": f'prefixcache_family_{k}{{namespace="llm",target="vllm-{i}",window="5m"}} {i * 0.37}\n'.encode()
                for k in range(20)}
        answer.add(part)
        text.append(part)
    whole = b"".join(part[f"family_{k}"] for k in range(20) for part in text)
    zipped = answer.finish()
    assert gzip.decompress(zipped) == whole
    assert len(zipped) < 1.5 * len(gzip.compress(whole, compresslevel=1))


def test_no_part_at_all_is_an_empty_member():
    assert gzip.decompress(FamilyGzip(lambda name: b"# x\n").finish()) == b""

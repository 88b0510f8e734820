"""The capacity curve (hit ratio against cache size per replica) and its drawing."""
import json
import random
import xml.etree.ElementTree as ET

import pytest

from exporter.tools import cachemodel, capacitycurve, hashtrace

from conftest import FIXTURES

SVG = "{http://www.w3.org/2000/svg}"


def mooncake(lines=400):
    rows = [json.loads(line) for line in (FIXTURES / "mooncake" / "conversation_trace_head400.jsonl").read_text().splitlines()[:lines]]
    return [(hashtrace.full_blocks(r["hash_ids"], r["input_length"], 512), r["input_length"], None, None) for r in rows]


def test_the_sizes_are_log_spaced_from_a_hundred_thousand_to_a_billion_tokens():
    sizes = capacitycurve.SIZES_TOKENS
    assert sizes[0] == 10 ** 5 and sizes[-1] == 10 ** 9 and len(sizes) == 17
    assert all(b > a for a, b in zip(sizes, sizes[1:]))
    assert [capacitycurve.human(s) for s in (10 ** 5, 177_828, 999_936, 10 ** 9, None)] == ["100k", "178k", "1M", "1G", "unlimited"]


def test_the_curve_rises_with_size_and_ends_at_the_unlimited_ratio():
    requests = mooncake()
    curve = capacitycurve.sweep(requests, 512, ["round_robin", "prefix_hash"], 4, configured_blocks=2000)
    for policy, ratios in curve["policies"].items():
        assert ratios == sorted(ratios) and ratios[0] < ratios[-1]
        hits, total = cachemodel.replay(requests, 512, policy, 4, None)
        assert ratios[-1] == hits / total
    assert curve["configured_tokens"] == 2000 * 512


def test_hash_ids_that_do_not_chain_replay_each_size():
    """A trace whose ids are not chained prefix hashes cannot use the one-pass stack:
    every size is replayed, and the curve still rises."""
    rng = random.Random(3)
    requests = [([rng.randrange(40) for _ in range(rng.randrange(1, 6))], 512 * 6, None, None) for _ in range(300)]
    assert not cachemodel.chained(requests)
    sizes = (512, 1024, 2048, 4096, 8192)
    curve = capacitycurve.sweep(requests, 512, ["round_robin"], 2, sizes_tokens=sizes)
    expected = [cachemodel.replay(requests, 512, "round_robin", 2, c)[0] / (512 * 6 * 300) for c in (1, 2, 4, 8, 16, None)]
    assert curve["policies"]["round_robin"] == expected
    assert expected == sorted(expected)


@pytest.mark.parametrize("configured", [None, 1_000_000, 10 ** 12], ids=["unlimited", "one-million", "beyond-the-axis"])
def test_the_drawing_is_well_formed_svg_with_one_line_per_policy(configured):
    policies = ["round_robin", "random", "prefix_hash"]
    curve = capacitycurve.sweep(mooncake(150), 512, policies, 4, configured_blocks=None if configured is None else configured // 512)
    root = ET.fromstring(capacitycurve.svg(curve, 'a <title> & "quotes"'))
    assert root.tag == SVG + "svg"
    lines = root.findall(SVG + "polyline")
    assert [l.get("data-policy") for l in lines] == policies
    width, height = float(root.get("width")), float(root.get("height"))
    for line in lines:
        points = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
        assert len(points) == len(capacitycurve.SIZES_TOKENS)
        assert all(0 <= x <= width and 0 <= y <= height for x, y in points)
        assert [x for x, _ in points] == sorted(x for x, _ in points)
        ys = [y for _, y in points]
        assert ys == sorted(ys, reverse=True)  # a higher ratio is drawn higher: smaller y
    (marker,) = root.findall(f"{SVG}line[@class='configured']")
    texts = "".join(t.text or "" for t in root.iter(SVG + "text"))
    assert 'a <title> & "quotes"' in texts and "configured: " + capacitycurve.human(curve["configured_tokens"]) in texts

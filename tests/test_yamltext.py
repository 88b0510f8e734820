"""exporter/peers/yamltext.py: YAML bounded in depth and in what its aliases expand to."""
import time

import pytest
import yaml

from exporter.peers import yamltext


def alias_bomb(levels: int = 9, fan: int = 10) -> str:
    """The "billion laughs": each level a list of `fan` aliases of the one before."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * fan) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_it_is_built():
    start = time.monotonic()
    with pytest.raises(yamltext.YAMLBoundsError, match="more than 1,000,000 nodes once its aliases are expanded"):
        yamltext.load(alias_bomb())
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize("text", [
    pytest.param("[" * 5000 + "]" * 5000, id="flow"),
    pytest.param("".join("  " * i + "- \n" for i in range(200)) + "  " * 200 + "x\n", id="block"),
    pytest.param("".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "x\n", id="mapping"),
])
def test_deep_nesting_is_refused_without_recursion(text):
    start = time.monotonic()
    with pytest.raises(yamltext.YAMLBoundsError, match="deeper than 64 levels"):
        yamltext.load(text)
    assert time.monotonic() - start < 1.0


def test_a_document_that_contains_itself_is_refused():
    with pytest.raises(yamltext.YAMLBoundsError, match=r"alias \*a refers to a node that contains it"):
        yamltext.load("a: &a [1, *a]\n")


def test_ordinary_anchors_and_aliases_load_as_pyyaml_loads_them():
    text = ("defaults: &d {poll_interval: 5s, read_timeout: 2s}\n"
            "a: *d\nb: {<<: *d, read_timeout: 3s}\nlist: [&x 1, *x, *x]\n")
    assert yamltext.load(text, yaml.SafeLoader) == yaml.safe_load(text)


def test_the_count_expands_aliases_exactly():
    # the root, key a, the anchored list (itself and 3 items), key b and the alias (4 again): 11 nodes
    text = "a: &a [1, 2, 3]\nb: *a\n"
    yamltext.check_bounds(text, max_nodes=11)
    with pytest.raises(yamltext.YAMLBoundsError):
        yamltext.check_bounds(text, max_nodes=10)


def test_what_is_not_yaml_is_the_parsers_own_error():
    with pytest.raises(yaml.YAMLError):
        yamltext.load("targets: [\n")

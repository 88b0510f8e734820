"""YAML from files users hand us, with bounds PyYAML does not have.

PyYAML builds an alias as a reference to its anchor's object, so 336 KB of nested
aliases (a "billion laughs") load in an instant and then expand to 20 million targets in
whoever walks them; and its composer recurses once per nesting level, so a 5,000-deep
document is a RecursionError. One streaming pass over the parser's events (C-speed where
libyaml is there) measures both before anything is built: the nesting depth, and the
number of nodes the document stands for with every alias expanded. Pure.
"""
from __future__ import annotations

import re
from itertools import accumulate

import yaml

MAX_DEPTH = 64  # far deeper than any config, far under the composer's recursion
MAX_NODES = 1_000_000  # scalars, mappings and sequences, aliases expanded

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPENS = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSES = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class YAMLBoundsError(yaml.YAMLError):
    """A document too deep or too large once its aliases are expanded."""


def _flow_depth(text: str, max_depth: int) -> int:
    """How deep `[` and `{` nest (quotes ignored: an over-estimate at worst). PyYAML's
    Python scanner takes time quadratic in that depth before any event comes out (3,000
    brackets: 7 s), so a file of brackets is refused before it is parsed."""
    if text.count("[") + text.count("{") <= max_depth:
        return 0
    return max(accumulate(map(_BRACKET_STEP.__getitem__, _NOT_BRACKET.sub("", text))), default=0)


def check_bounds(text: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """Raises YAMLBoundsError (or the parser's own YAMLError) before `text` is built."""
    if _flow_depth(text, max_depth) > max_depth:
        raise YAMLBoundsError(f"[ and {{ nested deeper than {max_depth} levels")
    sizes: dict[str, int] = {}  # anchor -> the nodes it stands for
    open_nodes: list[list] = [[None, 0]]  # per open collection: [its anchor, nodes so far]
    total = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, _OPENS):
            if len(open_nodes) > max_depth:
                raise YAMLBoundsError(f"nested deeper than {max_depth} levels")
            open_nodes.append([event.anchor, 1])
        elif isinstance(event, _CLOSES):
            anchor, size = open_nodes.pop()
            if anchor is not None:
                sizes[anchor] = size
            open_nodes[-1][1] += size
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor not in sizes:  # an anchor still open: a document that contains itself
                raise YAMLBoundsError(f"the alias *{event.anchor} refers to a node that contains it")
            open_nodes[-1][1] += sizes[event.anchor]
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                sizes[event.anchor] = 1
            open_nodes[-1][1] += 1
        else:
            continue
        total = sum(n for _, n in open_nodes)
        if total > max_nodes:
            raise YAMLBoundsError(f"stands for more than {max_nodes:,} nodes once its aliases are expanded")


def load(text: str, loader: type = _LOADER, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES):
    """`yaml.load(text, loader)` within the bounds above: a YAMLError says what is wrong."""
    check_bounds(text, max_depth, max_nodes)
    return yaml.load(text, Loader=loader)

"""What a log line is about, as keys of their own: the call sites' half of exporter/logs.py.

`log.info("alert firing", extra=fields(alert=..., target=..., cause=...))`: the formatter
writes each after `msg`, so a log pipeline filters on them (Loki's `| logfmt |
cause="prompt_prefix_change"`) instead of parsing the message. Below every layer, so that
any module may say what its lines are about.
"""
from __future__ import annotations

# the keys a line may carry about what it concerns, in the order they are written
FIELD_KEYS = ("alert", "state", "target", "namespace", "model", "cause", "source", "version", "error")


def fields(**about) -> dict:
    """`extra=` for a log call: what the line is about, each a key of its own (FIELD_KEYS;
    empty ones left out): `fields(target=name, namespace=ns)`."""
    unknown = about.keys() - set(FIELD_KEYS)
    if unknown:
        raise ValueError(f"log fields {sorted(unknown)}: one of {', '.join(FIELD_KEYS)}")
    return {"fields": {key: str(value) for key, value in about.items() if value not in (None, "")}}


def namespace_of(target) -> str | None:
    """A target's `namespace` label, where it has one (config.sections.Target)."""
    return dict(target.labels).get("namespace")

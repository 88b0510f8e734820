"""Targets from service discovery, and which of them this shard polls. Pure.

Two sources feed the central mode besides the static list: the active targets of one
job in a Prometheus (`GET /api/v1/targets`), so that whatever Prometheus discovers and
relabels (kubernetes_sd, consul, EC2, ...) is ours without re-implementing it, and
Prometheus `file_sd` files (JSON or YAML, the same format and semantics). A target's
name is its `pod` label where it has one, else its `instance`, else its address; its
labels come with it (a version label set by relabelling drives the rollout analysis).

`settle` is the keep-the-last-good-list rule every source follows: a failed refresh
keeps the previous targets, and an empty answer from a source that had targets is held
for a while, because "every replica vanished at once" is far more often a Prometheus
restart or a broken relabelling than a real scale to zero.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence
from urllib.parse import urlsplit

import yaml

from .config import RESERVED_LABELS, ShardConfig, Target

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# a Deployment's pod: <deployment>-<pod-template-hash>-<5 chars>; a StatefulSet's: <name>-<ordinal>
_POD_SUFFIX = re.compile(r"(-[a-z0-9]{6,10}-[a-z0-9]{5}|-\d+)$")


class DiscoveryError(ValueError):
    """A source answered something that is not a target list; the message says what."""


# --- Prometheus file_sd ---------------------------------------------------------------------
def from_file_sd(text: str, path: str) -> list[Target]:
    """A file_sd file: a list of `{targets: [host:port, ...], labels: {...}}` groups,
    JSON for `.json`, YAML otherwise (as Prometheus reads them)."""
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise DiscoveryError(f"{path}: not valid {'JSON' if path.endswith('.json') else 'YAML'}: {_first_line(exc)}") from None
    if data is None:
        return []
    if not isinstance(data, list):
        raise DiscoveryError(f"{path}: must be a list of target groups ({{targets: [...], labels: {{...}}}})")
    out = []
    for i, group in enumerate(data):
        where = f"{path}: group {i}"
        if not isinstance(group, dict) or set(group) - {"targets", "labels"}:
            raise DiscoveryError(f"{where}: a target group has only `targets` and `labels`")
        addresses, labels = group.get("targets") or [], group.get("labels") or {}
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise DiscoveryError(f"{where}: `targets` must be a list of host:port strings")
        if not isinstance(labels, dict):
            raise DiscoveryError(f"{where}: `labels` must be a mapping")
        for name in labels:
            if not isinstance(name, str) or not _LABEL_NAME.match(name):
                raise DiscoveryError(f"{where}: {name!r} is not a valid label name")
        for j, address in enumerate(addresses):
            if not address.strip():
                raise DiscoveryError(f"{where}: target {j} has no address")
            out.append(_target({**{k: str(v) for k, v in labels.items()}, "__address__": address.strip()}, where))
    return out


def _target(labels: dict[str, str], where: str) -> Target:
    """Prometheus's rules for a target without relabelling: the URL from `__scheme__`,
    `__address__` and `__metrics_path__`; `instance` defaults to the address."""
    address = labels.get("__address__", "")
    if not address or "/" in address:
        raise DiscoveryError(f"{where}: {address!r} is not a host:port address")
    scheme = labels.get("__scheme__", "http")
    path = labels.get("__metrics_path__", "/metrics")
    if scheme not in ("http", "https"):
        raise DiscoveryError(f"{where}: __scheme__ {scheme!r} is not http or https")
    url = f"{scheme}://{address}{path if path.startswith('/') else '/' + path}"
    kept = {k: v for k, v in labels.items() if not k.startswith("__")}
    kept.setdefault("instance", address)
    return Target(name=_name(kept, address), url=url, labels=_own_labels(kept))


def _name(labels: dict[str, str], address: str) -> str:
    return labels.get("pod") or labels.get("instance") or address


def _own_labels(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """A discovered label that one of our labels already uses keeps its value under
    `exported_<name>`, as Prometheus does with clashing target labels."""
    return tuple(sorted(((f"exported_{k}" if k in RESERVED_LABELS else k), v) for k, v in labels.items()))


# --- Prometheus's targets API ------------------------------------------------------------------
def from_targets_api(payload: Any, job: str, source: str) -> list[Target]:
    """The active targets of `job` from `GET /api/v1/targets`: their scrape URL and
    their labels after relabelling. Targets Prometheus dropped are not ours either."""
    if not isinstance(payload, dict) or payload.get("status") != "success" or not isinstance(payload.get("data"), dict):
        raise DiscoveryError(f"{source}: not a Prometheus targets API answer (want status=success and data)")
    active = payload["data"].get("activeTargets")
    if not isinstance(active, list):
        raise DiscoveryError(f"{source}: data.activeTargets is missing")
    out = []
    for i, item in enumerate(active):
        if not isinstance(item, dict) or not isinstance(item.get("labels"), dict):
            raise DiscoveryError(f"{source}: activeTargets[{i}] has no labels")
        labels = {str(k): str(v) for k, v in item["labels"].items()}
        if item.get("scrapePool", labels.get("job")) != job and labels.get("job") != job:
            continue
        url = item.get("scrapeUrl")
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise DiscoveryError(f"{source}: activeTargets[{i}] ({labels.get('instance', '?')}) has no usable scrapeUrl")
        out.append(Target(name=_name(labels, parts.netloc), url=url, labels=_own_labels(labels)))
    return out


# --- merging and sharding ----------------------------------------------------------------------
def merge(static: Sequence[Target], discovered: Iterable[Target]) -> tuple[list[Target], list[str]]:
    """Static targets first; a discovered target whose name is taken gets its address
    appended, so that two pods never share one history. -> (targets, warnings)"""
    out, names, warnings = list(static), {t.name for t in static}, []
    for t in discovered:
        if t.name in names:
            renamed = replace(t, name=f"{t.name}@{urlsplit(t.url).netloc}")
            if renamed.name in names:
                warnings.append(f"discovered target {t.name} ({t.url}) is listed twice; the second is ignored")
                continue
            t = renamed
        names.add(t.name)
        out.append(t)
    return out, warnings


def polled(static: Sequence[Target], discovered: Iterable[Target], shard: ShardConfig) -> tuple[list[Target], list[str]]:
    """What one process polls: the static and discovered targets merged, those of its
    shard. -> (targets, merge warnings)"""
    merged, warnings = merge(static, discovered)
    return [t for t in merged if in_shard(t, shard.index, shard.count, shard.key_label)], warnings


def shard_key(target: Target, key_label: str) -> str:
    """All replicas of one model must land in one shard: the key label where the target
    has it, else the pod name without its replica suffix (a Deployment's hash, a
    StatefulSet's ordinal)."""
    value = dict(target.labels).get(key_label)
    return value if value else _POD_SUFFIX.sub("", target.name)


def shard_of(key: str, count: int) -> int:
    """Prometheus's hashmod: the low 8 bytes of the key's MD5, big-endian, mod count."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[8:], "big") % count


def in_shard(target: Target, index: int, count: int, key_label: str) -> bool:
    return count <= 1 or shard_of(shard_key(target, key_label), count) == index


# --- the last good list ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceState:
    """What one discovery source last gave, and how its refreshes are going."""

    name: str
    targets: tuple[Target, ...] = ()
    ok: bool = False  # the last refresh succeeded
    refreshed: bool = False  # it ever succeeded
    last_success: float | None = None
    failures: int = 0
    error: str = ""
    empty_since: float | None = None  # an empty answer held since then


def settle(old: SourceState, now: float, found: Sequence[Target] | None, error: str, accept_empty_after: float) -> SourceState:
    """The state after one refresh: `found` on success, None with `error` on failure."""
    if found is None:
        return replace(old, ok=False, failures=old.failures + 1, error=error)
    if not found and old.targets:
        since = old.empty_since if old.empty_since is not None else now
        if now - since < accept_empty_after:
            return replace(old, ok=True, refreshed=True, last_success=now, empty_since=since,
                           error=f"answered no targets; keeping the last {len(old.targets)} until it does for {accept_empty_after:g}s")
    return replace(old, targets=tuple(found), ok=True, refreshed=True, last_success=now, error="", empty_since=None)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

"""Targets from service discovery, and which of them this shard polls. Pure.

Two sources feed the central mode besides the static list: the active targets of a
Prometheus whose labels a selector matches (`GET /api/v1/targets`), so that whatever
Prometheus discovers and relabels (kubernetes_sd, consul, EC2, ...) is ours without
re-implementing it, and Prometheus `file_sd` files (JSON or YAML, the same format and
semantics). A target's name is its `pod` label where it has one, else its `instance`,
else its address (never with credentials); its valid labels come with it (a version
label set by relabelling drives the rollout analysis), within Prometheus-like limits.

`settle` is the keep-the-last-good-list rule every source follows: a failed refresh
keeps the previous targets, and an empty answer from a source that had targets is held
for a while, because "every replica vanished at once" is far more often a Prometheus
restart or a broken relabelling than a real scale to zero.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence
from urllib.parse import urlsplit

import yaml

from ..config.discovery import KVPorts, ShardConfig
from ..config.kvevents import KVEndpoint
from ..config.sections import RESERVED_LABELS, Target
from ..peers import yamltext
from ..peers.urls import redact_url

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_MAX_LABEL_NAME = 1024
MAX_URL_LENGTH = 4096  # a target may be named by its address: a name is a label value, everywhere
_IDENTITY_LABELS = ("pod", "instance", "namespace", "job")  # kept first under label_limit: they name the target
_STRINGS_ONLY = getattr(yaml, "CBaseLoader", yaml.BaseLoader)
_MAX_UNMATCHED = 10  # pools named in the hint about a selector that matches nothing
# a Deployment's pod: <deployment>-<pod-template-hash>-<5 chars>; a StatefulSet's: <name>-<ordinal>
_POD_SUFFIX = re.compile(r"(-[a-z0-9]{6,10}-[a-z0-9]{5}|-\d+)$")


class DiscoveryError(ValueError):
    """A source answered something that is not a target list; the message says what."""


@dataclass(frozen=True)
class Limits:
    """Prometheus's scrape-config limits, for what one source may bring; 0: none."""

    target_limit: int = 2000
    label_limit: int = 64
    label_value_length_limit: int = 1024


@dataclass(frozen=True)
class Selector:
    """Which targets of a Prometheus are ours: every label of `labels` equal (after
    relabelling), and the scrape pool only where one is named."""

    labels: tuple[tuple[str, str], ...] = ()
    scrape_pool: str = ""

    def matches(self, pool: Any, labels: dict[str, str]) -> bool:
        return (not self.scrape_pool or pool == self.scrape_pool) and all(labels.get(k) == v for k, v in self.labels)

    def __str__(self) -> str:
        parts = [f"{k}={v!r}" for k, v in self.labels] + ([f"scrape_pool={self.scrape_pool!r}"] if self.scrape_pool else [])
        return ", ".join(parts) or "every target"


@dataclass
class Found:
    """One source's answer after selection and limits: its targets, what was dropped
    (reason -> how many targets or labels), and for a selector that matched nothing,
    what the answer did hold (`pool (job)` summaries)."""

    targets: list[Target] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    unmatched: tuple[str, ...] = ()

    def add(self, other: "Found") -> None:
        self.targets.extend(other.targets)
        self.dropped.update(other.dropped)


# --- Prometheus file_sd ---------------------------------------------------------------------
def from_file_sd(text: str, path: str, limits: Limits = Limits()) -> Found:
    """A file_sd file: a list of `{targets: [host:port, ...], labels: {...}}` groups,
    JSON for `.json`, YAML otherwise (as Prometheus reads them)."""
    kind = "JSON" if path.endswith(".json") else "YAML"
    try:
        # every YAML scalar as its text, as Go's yaml gives a label value: `version: 1.10` is "1.10", not 1.1;
        # bounded in depth and in what its aliases expand to (exporter/peers/yamltext.py)
        data = json.loads(text) if kind == "JSON" else yamltext.load(text, _STRINGS_ONLY)  # builds str, list, dict only
    except (ValueError, yaml.YAMLError) as exc:
        raise DiscoveryError(f"{path}: not valid {kind}: {_first_line(exc)}") from None
    except RecursionError:
        raise DiscoveryError(f"{path}: not valid {kind}: nested too deeply") from None
    found = Found()
    if data is None:
        return found
    if not isinstance(data, list):
        raise DiscoveryError(f"{path}: must be a list of target groups ({{targets: [...], labels: {{...}}}})")
    for i, group in enumerate(data):
        where = f"{path}: group {i}"
        if not isinstance(group, dict) or set(group) - {"targets", "labels"}:
            raise DiscoveryError(f"{where}: a target group has only `targets` and `labels`")
        addresses, labels = group.get("targets") or [], group.get("labels") or {}
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise DiscoveryError(f"{where}: `targets` must be a list of host:port strings")
        if not isinstance(labels, dict):
            raise DiscoveryError(f"{where}: `labels` must be a mapping")
        for name in labels:  # Prometheus refuses the whole file for one bad name
            if not isinstance(name, str) or not _LABEL_NAME.match(name):
                raise DiscoveryError(f"{where}: {_cut(name)!r} is not a valid label name")
            if not isinstance(labels[name], str):  # as Prometheus: a JSON number is no label value
                raise DiscoveryError(f"{where}: label {name} must have a string value")
        for j, address in enumerate(addresses):
            if not address.strip():
                raise DiscoveryError(f"{where}: target {j} has no address")
            raw = {**labels, "__address__": address.strip()}
            target = _target(raw, where, limits, found.dropped)
            if target is not None:
                found.targets.append(target)
    return found


def _target(labels: dict[str, str], where: str, limits: Limits, dropped: Counter) -> Target | None:
    """Prometheus's rules for a target without relabelling: the URL from `__scheme__`,
    `__address__` and `__metrics_path__`; `instance` defaults to the address."""
    address = labels.get("__address__", "")
    if not address or "/" in address:
        raise DiscoveryError(f"{where}: {_cut(address)!r} is not a host:port address")
    scheme = labels.get("__scheme__", "http")
    path = labels.get("__metrics_path__", "/metrics")
    if scheme not in ("http", "https"):
        raise DiscoveryError(f"{where}: __scheme__ {_cut(scheme)!r} is not http or https")
    url = f"{scheme}://{address}{path if path.startswith('/') else '/' + path}"
    if len(url) > MAX_URL_LENGTH:
        dropped["url_length_limit"] += 1
        return None
    kept = {k: v for k, v in labels.items() if not k.startswith("__")}
    kept.setdefault("instance", address)
    kept = _bounded_labels(_without_userinfo(kept), limits, dropped)
    return Target(name=_name(kept, address), url=url, labels=_own_labels(kept))


def _name(labels: dict[str, str], address: str) -> str:
    """A target's name shows in labels, logs and pages: never with credentials."""
    return (labels.get("pod") or labels.get("instance") or address).rpartition("@")[2]


def _without_userinfo(labels: dict[str, str]) -> dict[str, str]:
    """`instance` is the address, which may carry `user:pass@` (as Prometheus keeps it):
    a label is shown everywhere, so it never does."""
    if "@" in labels.get("instance", ""):
        return {**labels, "instance": labels["instance"].rpartition("@")[2]}
    return labels


def _bounded_labels(labels: dict[str, str], limits: Limits, dropped: Counter) -> dict[str, str]:
    """The labels we can expose: a valid name, not Prometheus-internal (`__*`), a value
    within label_value_length_limit, at most label_limit of them (those that name the
    target first, then by name). What is dropped is counted by reason; the target stays."""
    out = {}
    for name in sorted(labels, key=lambda n: (n not in _IDENTITY_LABELS, n)):
        value = labels[name]
        if name.startswith("__") or not _LABEL_NAME.match(name) or len(name) > _MAX_LABEL_NAME:
            dropped["invalid_label_name"] += 1
        elif limits.label_value_length_limit and len(value) > limits.label_value_length_limit:
            dropped["label_value_length_limit"] += 1
        elif limits.label_limit and len(out) >= limits.label_limit:
            dropped["label_limit"] += 1
        else:
            out[name] = value
    return out


def _own_labels(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """A discovered label that one of our labels already uses keeps its value under
    `exported_<name>`, prefixed again while that is taken too, as Prometheus does with
    clashing target labels: never two labels of one name."""
    out: dict[str, str] = {k: v for k, v in labels.items() if k not in RESERVED_LABELS}
    for k in sorted(set(labels) & RESERVED_LABELS):
        name = f"exported_{k}"
        while name in out or name in RESERVED_LABELS:
            name = f"exported_{name}"
        out[name] = labels[k]
    return tuple(sorted(out.items()))


# --- Prometheus's targets API ------------------------------------------------------------------
def from_targets_api(payload: Any, selector: Selector, source: str, limits: Limits = Limits()) -> Found:
    """The active targets `selector` matches in `GET /api/v1/targets`: their scrape URL
    and their labels after relabelling. Targets Prometheus dropped are not ours either."""
    if not isinstance(payload, dict) or payload.get("status") != "success" or not isinstance(payload.get("data"), dict):
        raise DiscoveryError(f"{source}: not a Prometheus targets API answer (want status=success and data)")
    active = payload["data"].get("activeTargets")
    if not isinstance(active, list):
        raise DiscoveryError(f"{source}: data.activeTargets is missing")
    found, others = Found(), Counter()
    for i, item in enumerate(active):
        if not isinstance(item, dict) or not isinstance(item.get("labels"), dict):
            raise DiscoveryError(f"{source}: activeTargets[{i}] has no labels")
        labels = item["labels"]
        if not all(isinstance(v, str) for v in labels.values()):
            raise DiscoveryError(f"{source}: activeTargets[{i}] has a label whose value is not a string")
        pool = item.get("scrapePool")
        if not selector.matches(pool, labels):
            others[f"{_cut(_text(pool), 80)} (job={_cut(labels.get('job', ''), 80)!r})"] += 1
            continue
        url = item.get("scrapeUrl")
        try:
            parts = urlsplit(url) if isinstance(url, str) else None
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise DiscoveryError(f"{source}: activeTargets[{i}] ({_cut(redact_url(labels.get('instance', '?')))}) has no usable scrapeUrl")
        if len(url) > MAX_URL_LENGTH:
            found.dropped["url_length_limit"] += 1
            continue
        kept = _bounded_labels(_without_userinfo(labels), limits, found.dropped)
        found.targets.append(Target(name=_name(kept, parts.netloc), url=url, labels=_own_labels(kept)))
    if not found.targets:
        found.unmatched = tuple(f"{what} x{n}" if n > 1 else what for what, n in sorted(others.items())[:_MAX_UNMATCHED])
        if len(others) > _MAX_UNMATCHED:
            found.unmatched += (f"and {len(others) - _MAX_UNMATCHED} more",)
    return found


def limit_targets(targets: Sequence[Target], limit: int, dropped: Counter) -> list[Target]:
    """At most `limit` targets (0: all), the first by name, so that the same ones stay
    polled from one refresh to the next; the rest are counted as dropped."""
    if not limit or len(targets) <= limit:
        return list(targets)
    dropped["target_limit"] += len(targets) - limit
    return sorted(targets, key=lambda t: (t.name, t.url))[:limit]


# --- merging and sharding ----------------------------------------------------------------------
def merge(static: Sequence[Target], discovered: Iterable[Target]) -> tuple[list[Target], list[str]]:
    """Static targets first; a discovered target whose name is taken gets its address
    appended, so that two pods never share one history (or two ports of one pod both
    scraped). -> (targets, warnings). A pod read from a Prometheus (its URL names it
    after `#`) whose name and namespace a scraped target has too is one pod two sources
    found (discovery.prometheus and read_prometheus on one Prometheus), polled twice:
    said in one warning."""
    out, warnings = list(static), []
    known = {t.name: _identity(t) for t in static}
    twice: list[str] = []
    for t in discovered:
        identity = _identity(t)
        if t.name in known:
            (namespace, read), (other_namespace, other_read) = identity, known[t.name]
            if namespace and namespace == other_namespace and read != other_read:
                twice.append(f"{t.name} in {namespace}")
            renamed = replace(t, name=f"{t.name}@{urlsplit(t.url).netloc.rpartition('@')[2]}")
            if renamed.name in known:
                warnings.append(f"discovered target {t.name} ({redact_url(t.url)}) is listed twice; the second is ignored")
                continue
            t = renamed
        known[t.name] = identity
        out.append(t)
    if twice:
        warnings.append(f"{len(twice)} discovered target(s) share name and namespace with another ({', '.join(twice[:3])}"
                        f"{', ...' if len(twice) > 3 else ''}): one pod that two sources found, polled twice under name and "
                        "name@address, its alerts twice; let one source find it (read_prometheus reads what Prometheus scrapes)")
    return out, warnings


def _identity(t: Target) -> tuple[str | None, bool]:
    """(its namespace, whether it is read from a Prometheus rather than scraped)."""
    return dict(t.labels).get("namespace"), bool(urlsplit(t.url).fragment)


def polled(static: Sequence[Target], discovered: Iterable[Target], shard: ShardConfig,
           kv: KVPorts | None = None) -> tuple[list[Target], list[str]]:
    """What one process polls: the static and discovered targets merged, those of its
    shard, each discovered pod with its KV events where `kv` says. -> (targets, merge warnings)"""
    merged, warnings = merge(static, [with_kv_events(t, kv) for t in discovered] if kv is not None else discovered)
    return [t for t in merged if in_shard(t, shard.index, shard.count, shard.key_label)], warnings


def with_kv_events(target: Target, kv: KVPorts) -> Target:
    """The pod at the address it is scraped at, with its KV event ports; a pod read from a
    Prometheus has no address of its own here and is left as it is."""
    try:
        host = urlsplit(target.url).hostname
    except ValueError:
        host = None
    if target.kv_events is not None or not host or urlsplit(target.url).fragment:
        return target
    at = f"[{host}]" if ":" in host else host
    replay = f"tcp://{at}:{kv.replay_port}" if kv.replay_port else None
    return replace(target, kv_events=KVEndpoint(f"tcp://{at}:{kv.port}", topic=kv.topic, replay=replay))


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
    # a refresh of what it selects now succeeded (a reload to a wrong URL has not): only then
    # can "it matches nothing" be said
    answered: bool = False
    last_success: float | None = None
    failures: int = 0
    error: str = ""
    empty_since: float | None = None  # an empty answer held since then
    matched_ever: bool = False  # some answer since start held a target: if never, suspect the selector
    dropped: tuple[tuple[str, int], ...] = ()  # what the last answer had over the limits, by reason
    found: int = 0  # targets the last answer held before target_limit
    over_limits: str = ""  # what the limits dropped from the last answer, with the numbers and the keys (over_limits())


def over_limits(dropped: Sequence[tuple[str, int]], found: int, kept: int, limits: Limits) -> str:
    """What a source's limits dropped from its answer, in one sentence with the numbers
    and the key that raises each limit; "" when they dropped nothing."""
    raise_it = "raise it, or 0 for no limit"
    said = {"target_limit": lambda n: f"{found} target(s) found, {kept} kept: {n} over discovery.target_limit="
                                      f"{limits.target_limit} ({raise_it})",
            "url_length_limit": lambda n: f"{n} target(s) whose URL is over {MAX_URL_LENGTH} characters",
            "label_limit": lambda n: f"{n} label(s) over discovery.label_limit={limits.label_limit} ({raise_it})",
            "label_value_length_limit": lambda n: f"{n} label value(s) over discovery.label_value_length_limit="
                                                  f"{limits.label_value_length_limit} ({raise_it})",
            "invalid_label_name": lambda n: f"{n} label(s) whose name Prometheus would not take"}
    return "; ".join(said[reason](n) if reason in said else f"{n} for {reason}" for reason, n in dropped if n)


def limits_log(old: SourceState, new: SourceState) -> tuple[str, str]:
    """(level, line) to log once a refresh settled: when a limit starts dropping (or another
    one joins), with the numbers; when they all stop; else ("", ""): a count that moves
    while the same limits drop is on the status page and in prefixcache_discovery_dropped,
    not in a line every refresh."""
    before, after = {r for r, n in old.dropped if n}, {r for r, n in new.dropped if n}
    if after - before:
        return "warning", f"over its limits, dropping {new.over_limits}"
    if before and not after:
        return "info", f"no longer over its limits ({new.found} target(s) found, {len(new.targets)} kept; it was: {old.over_limits})"
    return "", ""


def settle(old: SourceState, now: float, found: Sequence[Target] | None, error: str, accept_empty_after: float) -> SourceState:
    """The state after one refresh: `found` on success, None with `error` on failure."""
    if found is None:
        return replace(old, ok=False, failures=old.failures + 1, error=error)
    old = replace(old, matched_ever=old.matched_ever or bool(found))
    if not found and old.targets:
        since = old.empty_since if old.empty_since is not None else now
        if now - since < accept_empty_after:
            return replace(old, ok=True, refreshed=True, answered=True, last_success=now, empty_since=since,
                           error=f"answered no targets; keeping the last {len(old.targets)} until it does for {accept_empty_after:g}s")
    return replace(old, targets=tuple(found), ok=True, refreshed=True, answered=True, last_success=now, error="", empty_since=None)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "<no scrapePool>" if value is None else f"<{type(value).__name__}>"


def _cut(value: Any, size: int = 200) -> str:
    """Enough of a hostile value to recognise it in a log line."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= size else text[:size] + "..."


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

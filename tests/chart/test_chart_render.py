"""`helm lint --strict` and `helm template` of charts/eagle3-operator: what each scenario renders is what the
operator needs (its real CLI flags, exactly rbac.py's rules, a hardened pod) and carries the committed CRD,
dashboard and rules unchanged."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_cli.main import parser as cli_parser
from eagle3_contract.api.crd import build_crd
from eagle3_contract.api.spec import DEFAULT_PIPELINE_IMAGE
from eagle3_operator import rbac
from eagle3_operator.observability.alerts import build_prometheus_rule
from tests.chart.helm import (
    CHART,
    NAMESPACE,
    RELEASE,
    ROOT,
    SCENARIOS,
    aggregated,
    of_kind,
    only,
    operator_cluster_role,
    operator_container,
    run,
    template,
    values_args,
)
from tests.chart.test_chart_files import canonical

Rendered = dict[str, list[dict[str, Any]]]
CRD_NAME = "eagle3runs.eagle3.dev"


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return operator_container(docs)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint_strict(helm: Path, scenario: str) -> None:
    result = run(helm, "lint", "--strict", str(CHART), *values_args(SCENARIOS[scenario]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_the_operator_deployment(rendered: Rendered) -> None:
    deployment = only(rendered["default"], "Deployment")
    assert deployment["metadata"]["namespace"] == NAMESPACE
    spec = deployment["spec"]
    assert spec["replicas"] == 2 and spec["strategy"]["type"] == "RollingUpdate"  # test_chart_ha
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    c = container(rendered["default"])
    assert c["image"] == "eagle3-operator:0.1.0" and c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == ["eagle3"]
    pipeline = "--pipeline-image=eagle3-operator/pipeline:0.1.0"  # the chart's appVersion, as the operator's
    cpu = "--pipeline-cpu-image=eagle3-operator/pipeline:0.1.0-cpu"
    vllm = "--vllm-image=vllm/vllm-openai:v0.32.0"  # the vLLM release the pipeline is tested with
    loops = ["--resync-seconds=60", "--api-timeout-seconds=30"]
    floor = "--pod-security-minimum-level=restricted"  # issue 42: below it a run is refused
    assert c["args"] == [
        "operator", "--health-port=8080", "--metrics-port=9090", *loops, pipeline, cpu, vllm, floor
    ]  # fmt: skip
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    probe = c["livenessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "health"} and probe["failureThreshold"] >= 1
    assert c["resources"]["requests"].keys() == {"cpu", "memory"} and "memory" in c["resources"]["limits"]
    sa = only(rendered["default"], "ServiceAccount")["metadata"]
    assert pod["serviceAccountName"] == sa["name"] and sa["namespace"] == NAMESPACE


def test_the_args_are_the_cli_flags_the_operator_reads(rendered: Rendered) -> None:
    """The container's args parse with `eagle3`'s own parser into the ports and namespaces the chart set."""
    args = cli_parser().parse_args(container(rendered["default"])["args"])
    assert (args.command, args.health_port, args.metrics_port, args.namespace) == ("operator", 8080, 9090, [])
    assert args.pipeline_image == DEFAULT_PIPELINE_IMAGE, "the chart's default is the spec's documented one"
    assert (args.resync_seconds, args.api_timeout_seconds) == (60.0, 30.0)
    assert args.pod_security_minimum_level == "restricted"
    args = cli_parser().parse_args(container(rendered["watch-namespaces"])["args"])
    assert args.namespace == ["team-a", "team-b"]
    assert (args.resync_seconds, args.api_timeout_seconds) == (120.0, 45.5)
    assert args.pipeline_image == "registry.example.com/ml/eagle3-pipeline:1.2.3"


def test_the_log_format_value_sets_the_operators_environment(helm: Path, rendered: Rendered) -> None:
    """operator.logFormat: text by default; json makes every line (kopf's too) one JSON object."""

    def log_format(docs: list[dict[str, Any]]) -> str:
        env = {e["name"]: e.get("value") for e in container(docs)["env"]}
        return str(env["EAGLE3_LOG_FORMAT"])

    assert log_format(rendered["default"]) == "text"
    assert log_format(template(helm, sets=["operator.logFormat=json"])) == "json"


def test_the_pod_is_hardened(rendered: Rendered) -> None:
    for docs in rendered.values():
        pod = only(docs, "Deployment")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["securityContext"]["runAsUser"] != 0
        sc = container(docs)["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        # the read-only root filesystem keeps a writable /tmp
        assert {"name": "tmp", "mountPath": "/tmp"} in container(docs)["volumeMounts"]
        assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == "tmp")


def test_cluster_wide_rbac_is_exactly_rbac_py(rendered: Rendered) -> None:
    docs = rendered["default"]
    role = operator_cluster_role(docs)
    assert canonical(role["rules"]) == canonical(rbac.RULES)
    assert of_kind(docs, "Role") == [] and of_kind(docs, "RoleBinding") == []
    binding = only(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    sa = only(docs, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": NAMESPACE}]


def test_namespaced_rbac_is_exactly_rbac_py_split_by_scope(rendered: Rendered) -> None:
    """A Role per watched namespace; the cluster-scoped reads in a ClusterRole; together exactly rbac.py."""
    docs = rendered["watch-namespaces"]
    cluster_rules = operator_cluster_role(docs)["rules"]
    sa = only(docs, "ServiceAccount")["metadata"]
    for namespace in ("team-a", "team-b"):
        role = only(docs, "Role", namespace)
        assert canonical(role["rules"] + cluster_rules) == canonical(rbac.RULES)
        binding = only(docs, "RoleBinding", namespace)
        assert binding["roleRef"]["kind"] == "Role" and binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": NAMESPACE}]
    cluster_scoped = {"customresourcedefinitions", "namespaces", "clusterkopfpeerings"}
    assert {r["resources"][0] for r in cluster_rules} == cluster_scoped
    assert len(of_kind(docs, "Role")) == 2


def test_rbac_and_service_account_can_be_left_out(helm: Path) -> None:
    """rbac.create false leaves out the operator's RBAC, not the users' aggregated roles (rbac.aggregatedRoles
    false does)."""
    sets = ["rbac.create=false", "serviceAccount.create=false", "serviceAccount.name=ops"]
    docs = template(helm, sets=sets)
    assert {d["kind"] for d in docs} & {
        "Role",
        "RoleBinding",
        "ClusterRoleBinding",
        "ServiceAccount",
    } == set()
    assert all(aggregated(role) for role in of_kind(docs, "ClusterRole"))
    assert len(of_kind(docs, "ClusterRole")) == 2
    assert only(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    docs = template(helm, sets=[*sets, "rbac.aggregatedRoles=false"])
    assert {d["kind"] for d in docs} & {"ClusterRole", "ClusterRoleBinding", "ServiceAccount"} == set()


def test_metrics_service_and_service_monitor(rendered: Rendered) -> None:
    assert of_kind(rendered["default"], "ServiceMonitor") == []
    docs = rendered["monitoring"]
    service = only(docs, "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pod_labels = only(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = only(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    # the operator's series carry each run's namespace (docs/metrics.md)
    assert endpoint["honorLabels"] is True
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"


def test_dashboard_configmap_holds_the_committed_dashboard(rendered: Rendered) -> None:
    committed = (ROOT / "observability" / "grafana" / "eagle3-dashboard.json").read_text()
    for name, docs in rendered.items():
        cm = only(docs, "ConfigMap")
        assert cm["data"] == {"eagle3-dashboard.json": committed}, f"{name}: the dashboard differs"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        json.loads(cm["data"]["eagle3-dashboard.json"])
    cm = only(rendered["monitoring"], "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "EAGLE-3"}


def test_dashboard_label_is_configurable_and_optional(helm: Path) -> None:
    docs = template(helm, sets=["grafanaDashboard.label=dashboards", "grafanaDashboard.labelValue=eagle3"])
    assert only(docs, "ConfigMap")["metadata"]["labels"]["dashboards"] == "eagle3"
    assert of_kind(template(helm, sets=["grafanaDashboard.enabled=false"]), "ConfigMap") == []


def test_prometheus_rule_holds_the_committed_rules(rendered: Rendered) -> None:
    assert of_kind(rendered["default"], "PrometheusRule") == []
    rule = only(rendered["monitoring"], "PrometheusRule")
    committed = yaml.safe_load((ROOT / "observability" / "prometheus" / "eagle3-rules.yaml").read_text())
    assert rule["spec"] == committed
    assert rule["spec"] == build_prometheus_rule(NAMESPACE, {})["spec"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["namespace"] == NAMESPACE


def eagle3_crd(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [crd] = [d for d in of_kind(docs, "CustomResourceDefinition") if d["metadata"]["name"] == CRD_NAME]
    return crd


def committed_crds() -> dict[str, dict[str, Any]]:
    """Every CRD of the repository's crds/ (the Eagle3Run CRD, kopf's two peering CRDs): name -> CRD."""
    documents = [d for f in sorted((ROOT / "crds").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    return {d["metadata"]["name"]: d for d in documents if d}


def test_the_crds_are_the_committed_ones(rendered: Rendered) -> None:
    """Templates (so `helm upgrade` upgrades them) holding exactly crds/, each with the release's labels and,
    with crds.keep (the default), the annotation that keeps it (and every run) through `helm uninstall`."""
    committed = committed_crds()
    assert set(committed) == {CRD_NAME, "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    for name, docs in rendered.items():
        if name == "single-replica":  # crds.install false: test_the_crds_are_templates_not_in_crds
            continue
        crds = {d["metadata"]["name"]: copy.deepcopy(d) for d in of_kind(docs, "CustomResourceDefinition")}
        assert set(crds) == set(committed), name
        for crd in crds.values():
            labels = crd["metadata"].pop("labels")
            assert labels["app.kubernetes.io/managed-by"] == "Helm", name
            assert labels["app.kubernetes.io/instance"] == RELEASE, name
            annotations = crd["metadata"].pop("annotations", {})
            keep = name != "extras"  # extras.yaml sets crds.keep false
            assert annotations == ({"helm.sh/resource-policy": "keep"} if keep else {}), name
            assert crd == committed[crd["metadata"]["name"]], name


def test_the_crds_are_templates_not_in_crds(helm: Path, rendered: Rendered) -> None:
    """Helm never upgrades a chart's crds/: every CRD renders without --include-crds, and crds.install=false
    leaves them all out (for CRDs managed elsewhere: GitOps, or another release of the chart)."""
    names = {
        d["metadata"]["name"] for d in of_kind(template(helm, include_crds=False), "CustomResourceDefinition")
    }
    assert names == set(committed_crds())
    assert eagle3_crd(template(helm, include_crds=False))["spec"]["group"] == "eagle3.dev"
    assert not (CHART / "crds").exists()
    for docs in (rendered["single-replica"], template(helm, sets=["crds.install=false"])):
        assert of_kind(docs, "CustomResourceDefinition") == []


def test_kubernetes_older_than_1_20_is_refused(helm: Path) -> None:
    result = run(helm, "template", RELEASE, str(CHART), "--kube-version", "1.19.16")
    assert result.returncode != 0 and "chart requires kubeVersion: >=1.20.0-0" in result.stderr


def test_older_clusters_get_the_crd_without_cel_and_a_v1beta1_budget(helm: Path) -> None:
    """1.20 refuses x-kubernetes-validations and serves no policy/v1: the chart renders the CRD without its
    CEL rules (the operator checks them itself there) and a policy/v1beta1 PodDisruptionBudget."""
    committed = committed_crds()[CRD_NAME]
    for version, cel, budget in (("1.20.2", False, "policy/v1beta1"), ("1.24.0", False, "policy/v1"),
                                 ("1.25.0", True, "policy/v1"), ("1.31.0", True, "policy/v1")):  # fmt: skip
        docs = template(helm, kube_version=version)
        crd = eagle3_crd(docs)
        assert ("x-kubernetes-validations" in json.dumps(crd)) is cel, version
        if cel:
            assert crd["spec"] == committed["spec"], version
        else:
            assert crd["spec"] == json.loads(json.dumps(build_crd(cel=False)["spec"])), version
        assert only(docs, "PodDisruptionBudget")["apiVersion"] == budget, version


def test_notes_name_the_watched_namespaces(helm: Path) -> None:
    args = ["install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE]
    result = run(helm, *args, *values_args(SCENARIOS["watch-namespaces"]))
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "It watches Eagle3Runs in: team-a, team-b" in notes
    assert f"kubectl -n {NAMESPACE} rollout status deployment/eagle3-operator" in notes

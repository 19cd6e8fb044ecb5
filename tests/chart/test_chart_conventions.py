"""The usual chart extras do what their names say (commonLabels, extraArgs, extraEnv, securityContext,
serviceMonitor relabelings, podMonitor labels), and the release name gives sane object names."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

from eagle3_cli.main import parser as cli_parser
from tests.chart.helm import CHART, NAMESPACE, of_kind, only, operator_container, run, template, values_args

Rendered = dict[str, list[dict[str, Any]]]


def test_common_labels_are_on_every_object(rendered: Rendered) -> None:
    """Every object, the CRDs included (kopf's peering CRDs too: they are templates)."""
    docs = rendered["extras"]
    assert len(docs) >= 8
    assert len(of_kind(docs, "CustomResourceDefinition")) == 3
    for doc in docs:
        labels = doc["metadata"].get("labels") or {}
        assert labels.get("team") == "ml-platform", f"{doc['kind']}/{doc['metadata']['name']}"
        assert labels.get("cost-center") == "4711"
    pod_labels = only(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["team"] == "ml-platform"
    selector = only(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert "team" not in selector, "a label change must not change the Deployment's immutable selector"


def test_extra_args_and_env_reach_the_operator(rendered: Rendered) -> None:
    c = operator_container(rendered["extras"])
    assert c["args"][-1] == "--image-pull-secret=mirror-creds"
    args = cli_parser().parse_args(c["args"])
    assert args.image_pull_secret == ["mirror-creds"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HTTPS_PROXY"] == "http://proxy.example.internal:3128"
    assert env["EAGLE3_LOG_FORMAT"] == "text", "the chart's own variables stay"


def test_security_context_values_merge_over_the_hardened_defaults(rendered: Rendered) -> None:
    sc = operator_container(rendered["extras"])["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"]) == (10001, 10001)
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}


def test_pod_monitor_labels_become_operator_flags(helm: Path, rendered: Rendered) -> None:
    """The label kube-prometheus-stack selects PodMonitors by reaches every run's PodMonitor
    (`eagle3 operator --pod-monitor-label`)."""
    args = cli_parser().parse_args(operator_container(rendered["extras"])["args"])
    assert dict(args.pod_monitor_label) == {"release": "kube-prometheus-stack"}
    docs = template(helm, sets=["podMonitor.labels.release=prom", "podMonitor.labels.team=ml"])
    args = cli_parser().parse_args(operator_container(docs)["args"])
    assert dict(args.pod_monitor_label) == {"release": "prom", "team": "ml"}


def test_service_monitor_relabelings(rendered: Rendered) -> None:
    [endpoint] = only(rendered["extras"], "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    ]
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    [plain] = only(rendered["monitoring"], "ServiceMonitor")["spec"]["endpoints"]
    assert "relabelings" not in plain and "metricRelabelings" not in plain


@pytest.mark.parametrize(
    ("release", "sets", "name"),
    [
        ("eagle3-operator", [], "eagle3-operator"),  # the recommended `helm install eagle3-operator ...`
        ("prod-eagle3-operator", [], "prod-eagle3-operator"),
        ("eagle3", [], "eagle3-eagle3-operator"),
        ("eagle3", ["fullnameOverride=eagle3"], "eagle3"),
        ("ml", ["nameOverride=e3"], "ml-e3"),
    ],
)
def test_object_names_follow_the_release(helm: Path, release: str, sets: list[str], name: str) -> None:
    docs = template(helm, sets=sets, release=release, include_crds=False)
    assert only(docs, "Deployment")["metadata"]["name"] == name
    assert only(docs, "ServiceAccount")["metadata"]["name"] == name
    cluster_roles = {d["metadata"]["name"] for d in of_kind(docs, "ClusterRole")}
    assert cluster_roles == {name, f"{name}-edit", f"{name}-view"}
    assert only(docs, "Service")["metadata"]["name"] == f"{name}-metrics"


def test_notes_say_how_the_crd_and_the_replicas_behave(helm: Path) -> None:
    args = ["install", "eagle3-operator", str(CHART), "--dry-run=client", "--namespace", NAMESPACE]
    notes = run(helm, *args).stdout.split("NOTES:", 1)[1]
    assert "2 replicas: one is active, the others stand by" in notes
    assert "`helm upgrade` upgrades it" in notes and "`helm uninstall` leaves it" in notes
    assert "kubectl apply -f examples/tiny/eagle3run.yaml" in notes
    result = run(
        helm, *args, *values_args(sets=["crds.install=false", "runImagePullSecrets[0].name=regcred"])
    )
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "crds.install is false" in notes
    assert "pull with: regcred" in notes and "must exist in every namespace" in notes
    assert (
        of_kind(template(helm, sets=["crds.install=false"], include_crds=False), "CustomResourceDefinition")
        == []
    )


def _operator_options() -> set[str]:
    """Every option `eagle3 operator` (and `eagle3` before it) knows."""
    root = cli_parser()
    options = {o for action in root._actions for o in action.option_strings}
    subparsers = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    operator = subparsers.choices["operator"]
    return options | {o for action in operator._actions for o in action.option_strings}


def test_the_flags_the_chart_passes_and_its_readme_lists_are_the_operators() -> None:
    """Issue 29: the chart README's list of the operator's flags lacked four the template passes; every flag
    the template passes is one `eagle3 operator` knows, and the README lists exactly those."""
    template_text = (CHART / "templates" / "deployment.yaml").read_text()
    passed = set(re.findall(r"^\s+- (--[a-z][a-z-]*)", template_text, re.M))
    assert {"--health-port", "--vllm-image", "--api-timeout-seconds", "--prometheus-url"} <= passed
    assert passed <= _operator_options(), passed - _operator_options()
    readme = (CHART / "README.md").read_text()
    [row] = [line for line in readme.splitlines() if line.startswith("| Deployment |")]
    listed = set(re.findall(r"(--[a-z][a-z-]*)", row))
    assert listed == passed, f"README lists {sorted(listed - passed)} extra, misses {sorted(passed - listed)}"


def test_every_operator_flag_the_docs_name_is_one_it_knows() -> None:
    root = Path(__file__).resolve().parents[2]
    docs = [root / "README.md", CHART / "README.md", *sorted((root / "docs").glob("*.md"))]
    named = {
        (doc.name, flag)
        for doc in docs
        for span in re.findall(r"`eagle3 (?:\[?--verbose\]? )?operator([^`]*)`", doc.read_text())
        for flag in re.findall(r"(--[a-z][a-z-]*)", span)
    }
    assert len(named) >= 10, named
    unknown = sorted((doc, flag) for doc, flag in named if flag not in _operator_options())
    assert not unknown, unknown

"""High availability in the chart: two replicas by default (kopf's peering keeps one active), a rolling update
that never drops below the running replicas, a readiness probe, a PodDisruptionBudget, a soft spread over
nodes, the peering CRDs, and `--priority`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from eagle3_cli.main import parser as cli_parser
from eagle3_operator.peering import PEERING_NAME
from tests.chart.helm import ROOT, of_kind, only, operator_cluster_role, operator_container, template

Rendered = dict[str, list[dict[str, Any]]]


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(only(docs, "Deployment")["spec"]["template"]["spec"])


def pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    return dict(only(docs, "Deployment")["spec"]["template"]["metadata"]["labels"])


def test_two_replicas_rolling_one_at_a_time(rendered: Rendered) -> None:
    spec = only(rendered["default"], "Deployment")["spec"]
    assert spec["replicas"] == 2
    # the new pod starts (and waits as standby) before an old one stops: never fewer than `replicas` running
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }


def test_readiness_probe_is_kopfs_health_endpoint(rendered: Rendered) -> None:
    """The operator's own decision (eagle3_operator.handlers): ready = running, active or standby."""
    c = operator_container(rendered["default"])
    probe = c["readinessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "health"}
    assert probe["periodSeconds"] >= 1 and probe["failureThreshold"] >= 1
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in c["ports"]


def test_a_disruption_budget_keeps_one_operator(rendered: Rendered) -> None:
    docs = rendered["default"]
    pdb = only(docs, "PodDisruptionBudget")
    assert pdb["metadata"]["namespace"] == only(docs, "Deployment")["metadata"]["namespace"]
    assert pdb["spec"]["minAvailable"] == 1 and "maxUnavailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(docs).items()
    extras = only(rendered["extras"], "PodDisruptionBudget")["spec"]
    assert extras["maxUnavailable"] == 1 and "minAvailable" not in extras


def test_no_disruption_budget_for_one_replica_or_when_disabled(helm: Path, rendered: Rendered) -> None:
    """minAvailable 1 of one replica would block every node drain."""
    assert of_kind(rendered["single-replica"], "PodDisruptionBudget") == []
    assert of_kind(template(helm, sets=["podDisruptionBudget.enabled=false"]), "PodDisruptionBudget") == []
    assert of_kind(template(helm, sets=["replicas=0"]), "PodDisruptionBudget") == []


def test_replicas_spread_over_nodes_softly_by_default(rendered: Rendered) -> None:
    docs = rendered["default"]
    [constraint] = pod_spec(docs)["topologySpreadConstraints"]
    assert constraint["topologyKey"] == "kubernetes.io/hostname"
    assert constraint["whenUnsatisfiable"] == "ScheduleAnyway" and constraint["maxSkew"] == 1
    assert constraint["labelSelector"]["matchLabels"].items() <= pod_labels(docs).items()
    assert "topologySpreadConstraints" not in pod_spec(rendered["single-replica"])


def test_own_spread_constraints_replace_the_default_and_select_the_pods(
    helm: Path, rendered: Rendered
) -> None:
    docs = rendered["extras"]
    [constraint] = pod_spec(docs)["topologySpreadConstraints"]
    assert constraint["topologyKey"] == "topology.kubernetes.io/zone"
    assert constraint["whenUnsatisfiable"] == "DoNotSchedule"
    assert constraint["labelSelector"]["matchLabels"].items() <= pod_labels(docs).items()
    assert "topologySpreadConstraints" not in pod_spec(template(helm, sets=["spreadOverNodes=false"]))


def test_priority_flag_only_when_set(rendered: Rendered) -> None:
    parse = cli_parser().parse_args
    assert parse(operator_container(rendered["default"])["args"]).priority is None
    assert parse(operator_container(rendered["extras"])["args"]).priority == 100


def test_the_peering_crds_come_with_the_chart(rendered: Rendered) -> None:
    """kopf's CRDs of crds/kopf-peering.yaml (the operator creates its peering object in them), templates like
    the Eagle3Run CRD: with the release's labels and crds.keep's annotation, and left out with crds.install
    false (single-replica.yaml)."""
    committed = [d for d in yaml.safe_load_all((ROOT / "crds" / "kopf-peering.yaml").read_text()) if d]
    names = {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    assert {d["metadata"]["name"] for d in committed} == names
    for name, docs in rendered.items():
        crds = [d for d in of_kind(docs, "CustomResourceDefinition") if d["metadata"]["name"] in names]
        if name == "single-replica":
            assert crds == []
            continue
        for crd in crds:
            assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
            keep = crd["metadata"].get("annotations", {}).get("helm.sh/resource-policy")
            assert keep == (None if name == "extras" else "keep"), name
        stripped = [d | {"metadata": {"name": d["metadata"]["name"]}} for d in crds]
        assert stripped == committed, name
    assert PEERING_NAME == "eagle3-operator", "the chart's NOTES and values name the peering object"


def test_the_operator_may_use_its_peering_objects(rendered: Rendered) -> None:
    """Cluster-wide: the ClusterRole grants both peering kinds; namespaced: each Role grants kopfpeerings."""
    rules = operator_cluster_role(rendered["default"])["rules"]
    granted = {(r["resources"][0], v) for r in rules if r["apiGroups"] == ["kopf.dev"] for v in r["verbs"]}
    for kind in ("clusterkopfpeerings", "kopfpeerings"):
        assert {(kind, "get"), (kind, "watch"), (kind, "patch"), (kind, "create")} <= granted
    role = only(rendered["watch-namespaces"], "Role", "team-a")
    assert any(r["resources"] == ["kopfpeerings"] and "patch" in r["verbs"] for r in role["rules"])

"""The declared RBAC rules allow every write the planner can plan, and nothing broader than needed."""

from __future__ import annotations

from eagle3_operator import rbac
from eagle3_operator.k8s import CUSTOM_PLURALS, TYPED

PLURALS = {"Job": "jobs", "ConfigMap": "configmaps", "PersistentVolumeClaim": "persistentvolumeclaims",
           "Service": "services", "Deployment": "deployments",
           "PodDisruptionBudget": "poddisruptionbudgets"} | CUSTOM_PLURALS  # fmt: skip


def allowed(group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rbac.RULES
    )


def test_every_child_kind_the_client_writes_can_be_created_watched_and_deleted():
    kinds = {(api.split("/")[0] if "/" in api else "", kind) for api, kind in TYPED}
    kinds.add(("monitoring.coreos.com", "PodMonitor"))
    for group, kind in kinds:
        for verb in ("create", "delete", "get", "list", "watch"):
            assert allowed(group, PLURALS[kind], verb), f"{verb} {kind}"
    assert allowed("apps", "deployments", "patch")


def test_runs_are_read_and_only_their_status_is_written():
    assert allowed("eagle3.dev", "eagle3runs", "watch")
    assert not allowed("eagle3.dev", "eagle3runs", "patch")
    assert allowed("eagle3.dev", "eagle3runs/status", "patch")


def test_no_wildcards_and_no_secrets():
    for rule in rbac.RULES:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert "secrets" not in rule["resources"]


def test_the_role_and_binding_name_each_other():
    role = rbac.build_cluster_role()
    binding = rbac.build_cluster_role_binding({"kind": "ServiceAccount", "name": "op", "namespace": "x"})
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert role["rules"] == [dict(r) for r in rbac.RULES]

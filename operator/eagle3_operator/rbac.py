"""The operator's RBAC rules, declared once: the Helm chart renders them, the API-server tests run with them.

Least privilege: the operator writes only status of Eagle3Runs (kopf keeps its bookkeeping in status too),
and creates, patches and deletes only the kinds of children it builds.
"""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.base import GROUP, PLURAL

READ = ["get", "list", "watch"]

RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": READ},
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch", "update"]},
    # patch: a stage Job failed for good on a server without podFailurePolicy is stopped (parallelism 0)
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": [*READ, "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": READ},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": [*READ, "create", "patch", "delete"]},
    {
        "apiGroups": [""],
        "resources": ["configmaps"],  # patched: serving.capture's package, when an upgrade changes it
        "verbs": [*READ, "create", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": [*READ, "create", "delete"]},
    {
        "apiGroups": [""],
        "resources": ["services"],  # patched when the builder changes (an operator upgrade)
        "verbs": [*READ, "create", "patch", "delete"],
    },
    {
        "apiGroups": ["monitoring.coreos.com"],
        "resources": ["podmonitors"],
        "verbs": [*READ, "create", "patch", "delete"],
    },
    {
        "apiGroups": ["policy"],
        "resources": ["poddisruptionbudgets"],  # the serving PodDisruptionBudget
        "verbs": [*READ, "create", "patch", "delete"],
    },
    # kopf's peering: the operators' keep-alives, so that one is active and the others stand by; the operator
    # creates its peering object (eagle3_operator.peering) where it is missing
    {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings"], "verbs": [*READ, "create", "patch"]},
    {"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"], "verbs": [*READ, "create", "patch"]},
    # the Lease that fences kopf's peering (eagle3_operator.lease): taken and renewed by compare-and-swap
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    # kopf follows CRDs and namespaces to know what it can watch.
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": READ},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": READ},
)


def build_cluster_role(name: str = "eagle3-operator") -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "eagle3-operator"}},
        "rules": [dict(rule) for rule in RULES],
    }


def build_cluster_role_binding(subject: dict[str, Any], name: str = "eagle3-operator") -> dict[str, Any]:
    """Bind the role to `subject` (a ServiceAccount in a chart, a plain user in tests)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "eagle3-operator"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [subject],
    }

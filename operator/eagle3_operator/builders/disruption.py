"""The PodDisruptionBudget of a run's vLLM pods (serving.disruptionBudget)."""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.serving import hashed_child, serving_selector

PDB_API = "policy/v1"
PDB_KIND = "PodDisruptionBudget"


def build_pod_disruption_budget(run: RunRef, spec: Eagle3RunSpec) -> dict[str, Any]:
    """A policy/v1 PodDisruptionBudget over the vLLM pods: a drain or a cluster upgrade evicts at most
    serving.disruptionBudget.maxUnavailable of them at once (a count or a percentage). Named as the
    Deployment; `eagle3.dev/spec-hash` lets the planner patch it when the budget changes."""
    body = {
        "selector": {"matchLabels": serving_selector(run)},
        "maxUnavailable": spec.serving.disruption_budget.max_unavailable,
    }
    return hashed_child(run, PDB_API, PDB_KIND, body)

"""Serving: roll the vLLM Deployment to the current draft, or keep the previous one serving."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from eagle3_contract.api.spec import DraftMethod, Eagle3RunSpec, SpeculationLength
from eagle3_contract.api.speculation import SpeculationRange, SpeculationTable
from eagle3_contract.api.status import Checkpoint, ServingStatus, StageStatus
from eagle3_contract.stages import Stage
from eagle3_operator.builders import names
from eagle3_operator.builders.capture import build_capture_configmap
from eagle3_operator.builders.disruption import PDB_API, PDB_KIND, build_pod_disruption_budget
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.serving import build_deployment, build_pod_monitor, build_service, serving_url
from eagle3_operator.reconcile.actions import Action, object_ref
from eagle3_operator.reconcile.observe import Observed

POD_MONITOR_API = "monitoring.coreos.com/v1"
# Pod-spec keys the builder leaves out when unset; a merge patch keeps what it omits, so it clears them.
OPTIONAL_POD_KEYS = (
    "nodeSelector",
    "tolerations",
    "affinity",
    "initContainers",
    "serviceAccountName",
    "imagePullSecrets",
    "priorityClassName",
)


def _merge_patch(desired: dict[str, Any]) -> dict[str, Any]:
    """The desired Deployment as a merge patch: an omitted optional pod-spec key becomes null (removed)."""
    patch = copy.deepcopy(desired)
    pod = patch["spec"]["template"]["spec"]
    for key in OPTIONAL_POD_KEYS:
        pod.setdefault(key, None)
    return patch


def schedule_of(spec: Eagle3RunSpec, checkpoint: Checkpoint | None) -> list[SpeculationRange]:
    """serving.speculationLength tuned: the draft's measured k per batch-size range (its sweep), if any."""
    if spec.serving.speculation_length != SpeculationLength.TUNED or checkpoint is None:
        return []
    return list(checkpoint.speculation.schedule) if checkpoint.speculation is not None else []


def served_spec(spec: Eagle3RunSpec, checkpoint: Checkpoint | None) -> Eagle3RunSpec:
    """The spec as vLLM serves `checkpoint`: draft.method is the checkpoint's own (export's or verify's
    reading of its config; with draft.candidates, the one evaluate chose), so a draft is never served with
    the method of another (a pinned draft of an earlier method, after draft.method changed)."""
    method = checkpoint.method if checkpoint is not None else None
    if method is None or method == spec.draft.method:
        return spec
    return spec.model_copy(update={"draft": spec.draft.model_copy(update={"method": method})})


def pinned_speculation(
    spec: Eagle3RunSpec, stages: Mapping[str, StageStatus], checkpoint: Checkpoint | None
) -> Checkpoint | None:
    """A pinned draft's method and sweep table from the verify stage's result (its config's and its export
    manifest's), where the checkpoint does not carry them already; what this operator cannot read is left
    out."""
    verify, pin = stages.get(Stage.VERIFY.value), spec.serving.pinned_checkpoint
    if checkpoint is None or verify is None or pin is None or checkpoint.path != pin.path:
        return checkpoint
    result = verify.result or {}
    method = result.get("method")
    if checkpoint.method is None and method in {m.value for m in DraftMethod}:
        checkpoint = checkpoint.model_copy(update={"method": DraftMethod(method)})
    table = result.get("speculation")
    if checkpoint.speculation is not None or not isinstance(table, dict):
        return checkpoint
    try:
        return checkpoint.model_copy(update={"speculation": SpeculationTable.model_validate(table)})
    except ValidationError:
        return checkpoint


def tuned_note(spec: Eagle3RunSpec, checkpoint: Checkpoint | None) -> str:
    """The Ready condition's note when serving.speculationLength is tuned but the draft has no schedule."""
    if spec.serving.speculation_length != SpeculationLength.TUNED or checkpoint is None:
        return ""
    if schedule_of(spec, checkpoint):
        return ""
    return (
        f"; serving.speculationLength is tuned but draft {checkpoint.path} has no measured schedule "
        f"(evaluate's sweep, evaluation.sweep): it serves serving.numSpeculativeTokens "
        f"({spec.serving.num_speculative_tokens}) at every batch size"
    )


def _teardown(ref: RunRef, observed: Observed) -> list[Action]:
    name = names.serving_name(ref.name)
    actions = []
    if observed.deployment is not None:
        actions.append(Action("delete", object_ref("apps/v1", "Deployment", name, ref)))
    if ("Service", name) in observed.objects:
        actions.append(Action("delete", object_ref("v1", "Service", name, ref)))
    if ("PodMonitor", name) in observed.objects:
        actions.append(Action("delete", object_ref(POD_MONITOR_API, "PodMonitor", name, ref)))
    if (PDB_KIND, name) in observed.objects:
        actions.append(Action("delete", object_ref(PDB_API, PDB_KIND, name, ref)))
    capture = names.capture_configmap_name(ref.name)
    if ("ConfigMap", capture) in observed.objects:
        actions.append(Action("delete", object_ref("v1", "ConfigMap", capture, ref)))
    return actions


def plan_disruption_budget(ref: RunRef, spec: Eagle3RunSpec, observed: Observed) -> list[Action]:
    """The vLLM pods' PodDisruptionBudget: converged while enabled, deleted once disabled; nothing where
    the cluster does not serve policy/v1 (before Kubernetes 1.21)."""
    if not observed.disruption_budgets_served:
        return []
    if spec.serving.disruption_budget.enabled:
        return converge(observed, build_pod_disruption_budget(ref, spec))
    name = names.serving_name(ref.name)
    if (PDB_KIND, name) in observed.objects:
        return [Action("delete", object_ref(PDB_API, PDB_KIND, name, ref))]
    return []


def plan_capture(ref: RunRef, spec: Eagle3RunSpec, observed: Observed) -> list[Action]:
    """serving.capture's ConfigMap (the package vLLM loads): converged while capture is on, deleted once
    it is off."""
    if spec.serving.capture is not None:
        return converge(observed, build_capture_configmap(ref))
    name = names.capture_configmap_name(ref.name)
    if ("ConfigMap", name) in observed.objects:
        return [Action("delete", object_ref("v1", "ConfigMap", name, ref))]
    return []


def converge(observed: Observed, desired: dict[str, Any]) -> list[Action]:
    """Create a missing child; merge-patch one whose spec hash differs (made by an older operator)."""
    key = (desired["kind"], desired["metadata"]["name"])
    if key not in observed.objects:
        return [Action("create", desired)]
    if observed.spec_hashes.get(key) != desired["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH]:
        return [Action("patch", desired)]
    return []


def plan_serving(
    ref: RunRef,
    spec: Eagle3RunSpec,
    observed: Observed,
    draft: str | None,
    sha256: str | None = None,
    schedule: Sequence[SpeculationRange] = (),
) -> tuple[list[Action], ServingStatus | None]:
    """Actions for the Deployment, Service, PodMonitor and PodDisruptionBudget, and the serving status.

    `draft` is the directory of a draft that may serve now (exported and past the gate, or pinned and
    verified); None keeps whatever Deployment exists untouched, so a draft that fails its gate or its checksum
    never replaces the one serving. `sha256`, when known, is checked again by the pods before vLLM starts;
    `schedule` is the draft's k per batch-size range (serving.speculationLength tuned, schedule_of).
    """
    if not spec.serving.enabled:
        return _teardown(ref, observed), None
    name = names.serving_name(ref.name)
    current = observed.deployment
    actions: list[Action] = []
    if draft is not None:
        # the capture ConfigMap before the Deployment that mounts it; deleted after the one that stops
        capture = plan_capture(ref, spec, observed)
        actions += [a for a in capture if a.verb != "delete"]
        desired = build_deployment(ref, spec, draft, sha256, schedule)
        wanted = desired["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH]
        if current is None:
            actions.append(Action("create", desired))
        elif current.spec_hash != wanted:
            actions.append(Action("patch", _merge_patch(desired)))
        actions += [a for a in capture if a.verb == "delete"]
        actions += converge(observed, build_service(ref))
        if observed.pod_monitors_served:
            actions += converge(observed, build_pod_monitor(ref, spec))
        actions += plan_disruption_budget(ref, spec, observed)
    if current is None and draft is None:
        return actions, None
    return actions, ServingStatus(
        deployment=name,
        service=name,
        replicas=spec.serving.replicas,
        ready_replicas=current.ready_replicas if current is not None else 0,
        url=serving_url(ref),
        draft=draft if draft is not None else (current.draft if current is not None else None),
        blocked_by=observed.serving_blocked_by,
    )

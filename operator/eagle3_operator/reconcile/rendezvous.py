"""The headless Service of a multi-node train Job: created with the Job, deleted with it.

It has the Job's name, so the Job's pods (`subdomain`) resolve as `<job>-<index>.<job>`. It is created just
before the Job (in the same plan: pod 0's name must resolve when the other nodes start) and deleted once that
Job is no longer pending or running (finished, or deleted as stale), or gone. Every Service of a run that is
not one of its fixed ones (serving, producers, Mooncake master) is such a rendezvous Service.
"""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.status import StagePhase
from eagle3_contract.stages import Stage
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.training import build_rendezvous_service
from eagle3_operator.reconcile.actions import Action, object_ref
from eagle3_operator.reconcile.observe import Observed
from eagle3_operator.reconcile.stage_walk import Progress


def _fixed(ref: RunRef) -> set[str]:
    return {names.serving_name(ref.name), names.producers_name(ref.name), names.mooncake_name(ref.name)}


def _indexed(action: Action) -> bool:
    body = action.body
    indexed = body.get("spec", {}).get("completionMode") == "Indexed"
    return action.verb == "create" and body["kind"] == "Job" and indexed


def _service_for(ref: RunRef, job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    labels = meta["labels"]
    return build_rendezvous_service(
        ref, meta["name"], labels[names.LABEL_HASH], int(labels[names.LABEL_ATTEMPT])
    )


def plan_rendezvous(
    ref: RunRef, spec: Eagle3RunSpec, progress: Progress, observed: Observed
) -> tuple[Action, ...]:
    """The walk's actions with the rendezvous Services in place: the Service's create before each Indexed
    train Job's create, a create for a live multi-node train Job that lacks it, and the deletes of the
    Services of train Jobs that ended or went."""
    if spec.training.nodes <= 1 and not any(k == "Service" for k, _ in observed.objects):
        return tuple(progress.actions)
    actions: list[Action] = []
    live: set[str] = set()
    for action in progress.actions:
        if _indexed(action):
            name = action.body["metadata"]["name"]
            live.add(name)
            if ("Service", name) not in observed.objects:
                actions.append(Action("create", _service_for(ref, action.body)))
        actions.append(action)
    deleted = {a.body["metadata"]["name"] for a in progress.actions if a.verb == "delete"}
    for job in observed.jobs:
        if job.stage != Stage.TRAIN.value or job.phase not in (StagePhase.PENDING, StagePhase.RUNNING):
            continue
        if job.name in deleted:
            continue
        live.add(job.name)
        if spec.training.nodes > 1 and ("Service", job.name) not in observed.objects:
            actions.append(Action("create", build_rendezvous_service(ref, job.name, job.hash, job.attempt)))
    fixed = _fixed(ref)
    for kind, name in sorted(observed.objects):
        if kind == "Service" and name not in fixed and name not in live:
            actions.append(Action("delete", object_ref("v1", "Service", name, ref)))
    return tuple(actions)

"""A run's conditions from its progress: SpecValid, PodSecurity, Progressing, GatePassed, Ready (with
serving.canary's Canary after it) and Failed, each kept with its lastTransitionTime while its status holds."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.status import Checkpoint, Condition, ConditionType, ServingStatus
from eagle3_contract.reasons import AWAITING_PROMOTION
from eagle3_operator.builders.names import RunRef
from eagle3_operator.reconcile.conditions import set_condition
from eagle3_operator.reconcile.review import awaiting_message, reviewed, waiting_note
from eagle3_operator.reconcile.stage_walk import Progress


def run_conditions(
    ref: RunRef,
    spec: Eagle3RunSpec,
    progress: Progress,
    serving: ServingStatus | None,
    waiting: Checkpoint | None,
    previous: list[Condition],
    now: str,
    generation: int | None,
    pod_security: Sequence[str] = (),
) -> list[Condition]:
    def cond(kind: ConditionType, ok: bool, reason: str, message: str = "") -> Condition:
        return set_condition(previous, kind, ok, reason, message, now, generation)

    out = [
        cond(ConditionType.SPEC_VALID, True, "Valid", "the spec passed validation"),
        pod_security_condition(pod_security, cond),
    ]
    if progress.failed:
        out.append(cond(ConditionType.PROGRESSING, False, "Failed", progress.failed[1]))
    elif progress.suspended:
        out.append(cond(ConditionType.PROGRESSING, False, "Suspended", "spec.suspend is true"))
    elif progress.blocked_at and progress.stalled:
        message = f"stage {progress.blocked_at}: {progress.stalled.message}"
        out.append(cond(ConditionType.PROGRESSING, True, "PodNotRunning", message))
    elif progress.blocked_at:
        out.append(cond(ConditionType.PROGRESSING, True, "StageRunning", f"stage {progress.blocked_at}"))
    else:
        out.append(cond(ConditionType.PROGRESSING, False, "StagesComplete", "every stage has finished"))
    if (verdict := progress.gate) is not None and (
        spec.evaluation.min_acceptance_length is not None or not verdict.passed
    ):
        out.append(cond(ConditionType.GATE_PASSED, verdict.passed, verdict.reason, verdict.message))
    out.append(ready_condition(ref, spec, progress, serving, waiting, cond))
    if progress.failed:
        out.append(cond(ConditionType.FAILED, True, *progress.failed))
    else:
        out.append(cond(ConditionType.FAILED, False, "NoFailure", "no stage has failed"))
    return out


# How many findings the PodSecurity condition names (the rest are counted), and its reasons.
SHOWN_FINDINGS = 5
POD_SECURITY_RESTRICTED = "Restricted"
POD_SECURITY_BELOW_RESTRICTED = "BelowRestricted"


def pod_security_condition(
    findings: Sequence[str], cond: Callable[[ConditionType, bool, str, str], Condition]
) -> Condition:
    """PodSecurity: the run's pods meet the Pod Security "restricted" level, or the spec.pod fields that take
    them below it (or keep them from starting)."""
    if not findings:
        return cond(
            ConditionType.POD_SECURITY, True, POD_SECURITY_RESTRICTED, "the pods meet the 'restricted' level"
        )
    shown = "; ".join(findings[:SHOWN_FINDINGS])
    more = f"; and {len(findings) - SHOWN_FINDINGS} more" if len(findings) > SHOWN_FINDINGS else ""
    return cond(
        ConditionType.POD_SECURITY,
        False,
        POD_SECURITY_BELOW_RESTRICTED,
        f"the pods are below the Pod Security 'restricted' level: {shown}{more}",
    )


def ready_condition(
    ref: RunRef,
    spec: Eagle3RunSpec,
    progress: Progress,
    serving: ServingStatus | None,
    waiting: Checkpoint | None,
    cond: Callable[[ConditionType, bool, str, str], Condition],
) -> Condition:
    """Ready: replicas serve (a failure after them, such as a refused draft, leaves the previous draft
    serving and says so; a candidate waiting for review is named), or why none do."""
    if serving is not None and serving.ready_replicas > 0:
        message = f"{serving.ready_replicas} replica(s) serve draft {serving.draft}"
        if progress.failed:
            message += f"; the new draft is not rolled out ({progress.failed[0]}: see the Failed condition)"
        if waiting is not None:
            message += waiting_note(ref, waiting)
        return cond(ConditionType.READY, True, "DeploymentReady", message)
    if progress.failed:
        return cond(ConditionType.READY, False, progress.failed[0], progress.failed[1])
    if serving is not None and serving.blocked_by:
        return cond(ConditionType.READY, False, "PodNotRunning", serving.blocked_by.message)
    if waiting is not None and spec.serving.enabled and spec.serving.pinned_checkpoint is None:
        return cond(ConditionType.READY, False, AWAITING_PROMOTION, awaiting_message(ref, waiting))
    if reviewed(spec) and spec.serving.enabled and spec.serving.pinned_checkpoint is None:
        why = (
            "serving.promotion is reviewed and nothing is pinned yet: the draft this run exports past its "
            "gate waits in status.candidate for `eagle3 promote`"
        )
        return cond(ConditionType.READY, False, "NotServing", why)
    why = "the draft is not ready yet" if spec.serving.enabled else "serving.enabled is false"
    return cond(ConditionType.READY, False, "NotServing", why)


def with_canary(conditions: list[Condition], canary: Condition | None, note: str) -> list[Condition]:
    """The Canary condition (serving.canary) after Ready, whose message gets `note` while it is True."""
    out = [
        c.model_copy(update={"message": c.message + note})
        if note and c.type == ConditionType.READY.value and c.status == "True"
        else c
        for c in conditions
    ]
    if canary is not None:
        index = next(i for i, c in enumerate(out) if c.type == ConditionType.READY.value)
        out.insert(index + 1, canary)
    return out

"""The planner: (run, observed children) -> actions + new status. Pure: no I/O, no clock, no randomness."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.status import (
    Checkpoint,
    Condition,
    ConditionType,
    Eagle3RunStatus,
    RunPhase,
    RunPlan,
    ServingStatus,
    StagePhase,
)
from eagle3_contract.api.validation import InvalidSpecError, parse_spec, spec_document
from eagle3_contract.estimates import estimates_from_stages
from eagle3_contract.progress import eta_text, summary
from eagle3_contract.results import EvaluateResult, ExportResult
from eagle3_contract.stages import Stage, StagePlan, content_hash, plan_stages
from eagle3_operator.builders import names
from eagle3_operator.builders.claim import build_artifacts_claim
from eagle3_operator.builders.configmap import build_spec_configmap
from eagle3_operator.builders.monitoring import build_stage_pod_monitor
from eagle3_operator.builders.names import RunRef
from eagle3_operator.reconcile.actions import Action
from eagle3_operator.reconcile.conditions import set_condition
from eagle3_operator.reconcile.observe import Observed
from eagle3_operator.reconcile.producers import plan_producers
from eagle3_operator.reconcile.progress import Progress, walk_stages
from eagle3_operator.reconcile.rendezvous import plan_rendezvous
from eagle3_operator.reconcile.serving import converge, plan_serving


@dataclass(frozen=True)
class Plan:
    """What to write: `actions` in order, then `status` (a camelCase document) if it changed."""

    actions: tuple[Action, ...]
    status: dict[str, Any]
    phase: RunPhase
    finished: tuple[tuple[str, float | None], ...] = ()
    problems: tuple[str, ...] = ()
    spec: Eagle3RunSpec | None = None  # the validated spec (None when invalid)


def previous_status(document: dict[str, Any] | None) -> Eagle3RunStatus:
    """The status as last written; a document this operator cannot read counts as empty."""
    try:
        return Eagle3RunStatus.model_validate(document or {})
    except ValidationError:
        return Eagle3RunStatus()


def _dump(status: Eagle3RunStatus) -> dict[str, Any]:
    out: dict[str, Any] = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    return out


def plan_invalid(
    generation: int | None, error: InvalidSpecError, previous: Eagle3RunStatus, now: str
) -> Plan:
    """An invalid spec creates nothing; the SpecValid condition says what is wrong and where."""
    message = "; ".join(error.problems) + ". Fix the spec and apply it again."
    cond = set_condition(
        previous.conditions, ConditionType.SPEC_VALID, False, "InvalidSpec", message, now, generation
    )
    others = [c for c in previous.conditions if c.type != cond.type]
    status = previous.model_copy(
        update={"phase": RunPhase.INVALID, "observed_generation": generation, "conditions": [cond, *others]}
    )
    return Plan(actions=(), status=_dump(status), phase=RunPhase.INVALID, problems=tuple(error.problems))


def _mounts_spec(action: Action) -> bool:
    """A create of an object whose pods read the spec ConfigMap: a stage Job, the producers."""
    body = action.body
    stage = body["metadata"].get("labels", {}).get(names.LABEL_STAGE)
    return action.verb == "create" and (body["kind"] == "Job" or stage == names.PRODUCERS_STAGE)


def _storage_actions(
    ref: RunRef, spec: Eagle3RunSpec, observed: Observed, spec_hash: str, changes: list[Action]
) -> list[Action]:
    """The artifacts claim before any Job or Deployment mounts it; the spec ConfigMap before any Job (or
    producer) reads it."""
    actions = []
    creates = {a.body["kind"] for a in changes if a.verb == "create"}
    if spec.storage.artifacts.claim_name is None and creates & {"Job", "Deployment"}:
        claim = build_artifacts_claim(ref, spec)
        if ("PersistentVolumeClaim", claim["metadata"]["name"]) not in observed.objects:
            actions.append(Action("create", claim))
    if (
        any(_mounts_spec(a) for a in changes)
        and ("ConfigMap", names.spec_configmap_name(ref.name, spec_hash)) not in observed.objects
    ):
        actions.append(Action("create", build_spec_configmap(ref, spec, spec_hash)))
    return actions


def _stale_configmaps(ref: RunRef, observed: Observed, current: str) -> list[Action]:
    """Spec ConfigMaps of older generations that no remaining Job (or producer Deployment) mounts."""
    in_use = {current} | {j.spec_configmap for j in observed.jobs if j.spec_configmap}
    in_use |= {w.spec_configmap for w in observed.workloads.values() if w.spec_configmap}
    return [
        Action(
            "delete",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n, "namespace": ref.namespace}},
        )
        for kind, n in sorted(observed.objects)
        if kind == "ConfigMap" and n not in in_use
    ]


def _checkpoint(spec: Eagle3RunSpec, progress: Progress, previous: Eagle3RunStatus) -> Checkpoint | None:
    pinned = spec.serving.pinned_checkpoint
    if pinned is not None:
        return Checkpoint(path=pinned.path, sha256=pinned.sha256)
    export = progress.stages.get(Stage.EXPORT.value)
    if (
        progress.complete
        and export is not None
        and export.phase == StagePhase.SUCCEEDED
        and export.output_dir
    ):
        exported = ExportResult.parse(export.result) or ExportResult()
        figures = _evaluated(progress) or EvaluateResult()
        return Checkpoint(
            path=export.output_dir,
            sha256=exported.sha256,
            bytes=exported.bytes,
            acceptance_length=figures.acceptance_length,
            acceptance_rate=figures.acceptance_rate,
        )
    return previous.checkpoint


def _evaluated(progress: Progress) -> EvaluateResult | None:
    """evaluate's result in this walk's status, if it has one."""
    evaluate = progress.stages.get(Stage.EVALUATE.value)
    return EvaluateResult.parse(evaluate.result) if evaluate is not None else None


def _phase(spec: Eagle3RunSpec, progress: Progress, serving: ServingStatus | None) -> RunPhase:
    if progress.failed:
        return RunPhase.FAILED
    if progress.suspended:
        return RunPhase.SUSPENDED
    if not progress.complete:
        started = any(s.job_name for s in progress.stages.values())
        return RunPhase.RUNNING if started else RunPhase.PENDING
    if not spec.serving.enabled:
        return RunPhase.SUCCEEDED
    return RunPhase.SERVING if serving is not None and serving.ready_replicas > 0 else RunPhase.RUNNING


def _conditions(
    spec: Eagle3RunSpec,
    progress: Progress,
    serving: ServingStatus | None,
    previous: list[Condition],
    now: str,
    generation: int | None,
) -> list[Condition]:
    def cond(kind: ConditionType, ok: bool, reason: str, message: str = "") -> Condition:
        return set_condition(previous, kind, ok, reason, message, now, generation)

    out = [cond(ConditionType.SPEC_VALID, True, "Valid", "the spec passed validation")]
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
    out.append(_ready(spec, progress, serving, cond))
    if progress.failed:
        out.append(cond(ConditionType.FAILED, True, *progress.failed))
    else:
        out.append(cond(ConditionType.FAILED, False, "NoFailure", "no stage has failed"))
    return out


def _ready(
    spec: Eagle3RunSpec,
    progress: Progress,
    serving: ServingStatus | None,
    cond: Callable[[ConditionType, bool, str, str], Condition],
) -> Condition:
    """Ready: replicas serve (a failure after them, such as a refused draft, leaves the previous draft
    serving and says so), or why none do."""
    if serving is not None and serving.ready_replicas > 0:
        message = f"{serving.ready_replicas} replica(s) serve draft {serving.draft}"
        if progress.failed:
            message += f"; the new draft is not rolled out ({progress.failed[0]}: see the Failed condition)"
        return cond(ConditionType.READY, True, "DeploymentReady", message)
    if progress.failed:
        return cond(ConditionType.READY, False, progress.failed[0], progress.failed[1])
    if serving is not None and serving.blocked_by:
        return cond(ConditionType.READY, False, "PodNotRunning", serving.blocked_by.message)
    why = "the draft is not ready yet" if spec.serving.enabled else "serving.enabled is false"
    return cond(ConditionType.READY, False, "NotServing", why)


def _headline(progress: Progress, serving: ServingStatus | None, phase: RunPhase) -> tuple[str, str | None]:
    """kubectl's Progress and ETA columns: the current stage and how far it is (`train 6/10 ep`, `extract
    1200/5000 samples`), and its time left at the recent rate; or what the run does once its stages ended."""
    stage = progress.blocked_at
    if stage is not None:
        status = progress.stages[stage]
        if phase in (RunPhase.FAILED, RunPhase.SUSPENDED):
            return f"{stage} {phase.value.lower()}", None
        if status.phase == StagePhase.PENDING:
            return f"{stage} pending", None
        live = status.progress
        return summary(stage, live), eta_text(live.eta_seconds) if live is not None else None
    if serving is not None:
        return f"{names.SERVE_STAGE} {serving.ready_replicas}/{serving.replicas}", None
    return ("done" if phase == RunPhase.SUCCEEDED else phase.value.lower()), None


@functools.lru_cache(maxsize=1024)
def resolve(spec_json: str) -> tuple[Eagle3RunSpec, tuple[StagePlan, ...], str]:
    """The validated spec, its stage plans and its hash: memoised, as every reconcile of a run needs them
    and validation is the costliest step of planning (the models are frozen, so sharing them is safe)."""
    spec = parse_spec(json.loads(spec_json))
    return spec, tuple(plan_stages(spec)), content_hash(spec_document(spec))


def plan_run(
    ref: RunRef,
    generation: int | None,
    spec_doc: Any,
    status_doc: dict[str, Any] | None,
    observed: Observed,
    now: str,
) -> Plan:
    """Decide the next writes and the new status of one run from its spec and its observed children."""
    previous = previous_status(status_doc)
    try:
        spec, stage_plans, spec_hash = resolve(json.dumps(spec_doc, sort_keys=True, default=str))
    except InvalidSpecError as error:
        return plan_invalid(generation, error, previous, now)
    configmap = names.spec_configmap_name(ref.name, spec_hash)
    progress = walk_stages(
        ref, spec, list(stage_plans), previous.stages, observed.jobs, configmap, observed.progress
    )
    # online: the producers first (they may hold the train Job back), then the Services of multi-node Jobs
    online_actions, producers = plan_producers(
        ref, spec, list(stage_plans), progress, observed, configmap, previous.producers
    )
    plan_rendezvous(ref, spec, progress, observed)
    checkpoint = _checkpoint(spec, progress, previous)
    rollout = checkpoint if progress.complete else None  # exported past the gate, or pinned and verified
    serving_actions, serving = plan_serving(
        ref, spec, observed, rollout.path if rollout else None, rollout.sha256 if rollout else None
    )
    # the stage pods' PodMonitor lives as long as the run (its pods come and go stage by stage)
    monitor = converge(observed, build_stage_pod_monitor(ref)) if observed.pod_monitors_served else []
    changes = monitor + online_actions + progress.actions + serving_actions
    actions = _storage_actions(ref, spec, observed, spec_hash, changes) + changes
    actions += _stale_configmaps(ref, observed, configmap)
    evaluated = _evaluated(progress)
    phase = _phase(spec, progress, serving)
    headline, eta = _headline(progress, serving, phase)
    status = Eagle3RunStatus(
        phase=phase,
        current_stage=progress.blocked_at or (names.SERVE_STAGE if spec.serving.enabled else None),
        progress=headline,
        eta=eta,
        observed_generation=generation,
        acceptance_length=evaluated.acceptance_length if evaluated is not None else None,
        conditions=_conditions(spec, progress, serving, previous.conditions, now, generation),
        stages=progress.stages,
        checkpoint=checkpoint,
        serving=serving,
        producers=producers,
        plan=RunPlan(estimates=estimates_from_stages(spec, progress.stages, stage_plans)),
    )
    return Plan(
        actions=tuple(actions),
        status=_dump(status),
        phase=phase,
        finished=tuple(progress.finished),
        spec=spec,
    )

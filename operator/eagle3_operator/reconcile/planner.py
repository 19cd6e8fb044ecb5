"""The planner: (run, observed children) -> actions + new status. Pure: no I/O, no clock, no randomness."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from eagle3_contract.api.spec import DraftMethod, Eagle3RunSpec
from eagle3_contract.api.status import (
    Checkpoint,
    ConditionType,
    Eagle3RunStatus,
    RunPhase,
    RunPlan,
    ServingStatus,
    StagePhase,
)
from eagle3_contract.api.validation import InvalidSpecError, parse_spec, spec_document
from eagle3_contract.estimates import estimates_from_stages
from eagle3_contract.reasons import INVALID_SPEC
from eagle3_contract.results import EvaluateResult, ExportResult
from eagle3_contract.stage_metrics import eta_text, summary
from eagle3_contract.stages import Stage, StagePlan, content_hash, plan_stages
from eagle3_operator.builders import names
from eagle3_operator.builders.claim import build_artifacts_claim
from eagle3_operator.builders.configmap import build_spec_configmap
from eagle3_operator.builders.monitoring import build_stage_pod_monitor
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.pod_security import RESTRICTED, PodSecurity, pod_security
from eagle3_operator.reconcile.actions import Action
from eagle3_operator.reconcile.canary import plan_canary
from eagle3_operator.reconcile.conditions import set_condition
from eagle3_operator.reconcile.observe import Observed
from eagle3_operator.reconcile.prediction import plan_prediction
from eagle3_operator.reconcile.producers import plan_producers
from eagle3_operator.reconcile.rendezvous import plan_rendezvous
from eagle3_operator.reconcile.review import (
    candidate,
    pinned_checkpoint,
    reviewed,
    verified_pin,
    walk_reviewed,
    with_check,
)
from eagle3_operator.reconcile.run_conditions import run_conditions, with_canary
from eagle3_operator.reconcile.serving import (
    converge,
    pinned_speculation,
    plan_serving,
    schedule_of,
    served_spec,
    tuned_note,
)
from eagle3_operator.reconcile.stage_walk import Progress, walk_stages


@dataclass(frozen=True)
class Plan:
    """What to write: `actions` in order, then `status` if it changed (its document is the status patch)."""

    actions: tuple[Action, ...]
    status: Eagle3RunStatus
    phase: RunPhase
    finished: tuple[tuple[str, float | None], ...] = ()
    problems: tuple[str, ...] = ()
    spec: Eagle3RunSpec | None = None  # the validated spec (None when invalid)
    previous: Eagle3RunStatus = field(default_factory=Eagle3RunStatus)  # the status planned from, as read
    # completed Jobs the watch shows no pod of: their pods are to be listed from the server, then re-planned
    unconfirmed: tuple[str, ...] = ()
    # Jobs this plan fails (and deletes) itself, where the server ignores their podFailurePolicy
    failed_here: tuple[str, ...] = ()


def previous_status(document: dict[str, Any] | None) -> Eagle3RunStatus:
    """The status as last written; a document this operator cannot read counts as empty."""
    try:
        return Eagle3RunStatus.model_validate(document or {})
    except ValidationError:
        return Eagle3RunStatus()


def plan_invalid(
    generation: int | None,
    error: InvalidSpecError,
    previous: Eagle3RunStatus,
    now: str,
    reason: str = INVALID_SPEC,
) -> Plan:
    """An invalid spec creates nothing; the SpecValid condition says what is wrong and where (`reason`:
    InvalidSpec, or Rejected where the API server refused an object made from the spec)."""
    message = "; ".join(error.problems) + ". Fix the spec and apply it again."
    cond = set_condition(
        previous.conditions, ConditionType.SPEC_VALID, False, reason, message, now, generation
    )
    others = [c for c in previous.conditions if c.type != cond.type]
    status = previous.model_copy(
        update={"phase": RunPhase.INVALID, "observed_generation": generation, "conditions": [cond, *others]}
    )
    return Plan(
        actions=(), status=status, phase=RunPhase.INVALID, problems=tuple(error.problems), previous=previous
    )


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
    """Spec ConfigMaps of older generations that no remaining Job (or producer Deployment) mounts (serving's
    capture ConfigMap is serving's to keep or delete)."""
    in_use = {current, names.capture_configmap_name(ref.name)}
    in_use |= {j.spec_configmap for j in observed.jobs if j.spec_configmap}
    in_use |= {w.spec_configmap for w in observed.workloads.values() if w.spec_configmap}
    return [
        Action(
            "delete",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n, "namespace": ref.namespace}},
        )
        for kind, n in sorted(observed.objects)
        if kind == "ConfigMap" and n not in in_use
    ]


def _exported(progress: Progress) -> Checkpoint | None:
    """The draft the current spec exported, once its stages have all finished (past the gate)."""
    export = progress.stages.get(Stage.EXPORT.value)
    if not (progress.complete and export is not None and export.phase == StagePhase.SUCCEEDED):
        return None
    if not export.output_dir:
        return None
    exported = ExportResult.parse(export.result) or ExportResult()
    figures = _evaluated(progress) or EvaluateResult()
    return Checkpoint(
        path=export.output_dir,
        sha256=exported.sha256,
        bytes=exported.bytes,
        acceptance_length=figures.acceptance_length,
        acceptance_rate=figures.acceptance_rate,
        speculation=figures.speculation,
        categories=figures.categories,
        method=exported.method if exported.method in {m.value for m in DraftMethod} else None,
    )


def _checkpoint(spec: Eagle3RunSpec, progress: Progress, previous: Eagle3RunStatus) -> Checkpoint | None:
    pinned = spec.serving.pinned_checkpoint
    if pinned is not None:
        return Checkpoint(path=pinned.path, sha256=pinned.sha256)
    return _exported(progress) or previous.checkpoint


@dataclass(frozen=True)
class Drafts:
    """Which drafts the status names and which one vLLM may serve now (None: leave the Deployment be)."""

    checkpoint: Checkpoint | None
    candidate: Checkpoint | None = None
    rollout: Checkpoint | None = None


def _drafts(
    spec: Eagle3RunSpec, progress: Progress, check: Progress | None, previous: Eagle3RunStatus
) -> Drafts:
    """automatic: the export (or the verified pin) serves once every stage finished. reviewed (`check`: the
    verify stage's walk, `progress`: the training stages'): the verified pin serves, the export waits."""
    if check is None:
        checkpoint = pinned_speculation(spec, progress.stages, _checkpoint(spec, progress, previous))
        return Drafts(checkpoint, rollout=checkpoint if progress.complete else None)
    exported = _exported(progress)
    known = (exported, previous.candidate, previous.checkpoint)
    checkpoint = pinned_speculation(spec, check.stages, pinned_checkpoint(spec, known))
    serve = checkpoint if verified_pin(spec, check) is not None else None
    return Drafts(checkpoint, candidate(spec, exported), serve)


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
    if serving is not None and serving.ready_replicas > 0 and spec.serving.enabled:
        return RunPhase.SERVING
    if not spec.serving.enabled or (reviewed(spec) and spec.serving.pinned_checkpoint is None):
        return RunPhase.SUCCEEDED  # trained; reviewed: the candidate waits for its promotion
    return RunPhase.RUNNING


def _headline(
    progress: Progress, serving: ServingStatus | None, phase: RunPhase, waiting: bool
) -> tuple[str, str | None]:
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
    if waiting:
        return "awaiting promotion", None
    return ("done" if phase == RunPhase.SUCCEEDED else phase.value.lower()), None


# The run a spec's pods are checked as (restricted_findings): names do not change what is found.
_CHECKED_AS = RunRef("run", "namespace", "")


@dataclass(frozen=True)
class Resolved:
    """What a spec's text gives every reconcile of its run: the validated spec, its stage plans, its hash,
    and what takes its pods below the Pod Security "restricted" level."""

    spec: Eagle3RunSpec
    stage_plans: tuple[StagePlan, ...]
    spec_hash: str
    pod_security: PodSecurity


@functools.lru_cache(maxsize=1024)
def resolve(spec_json: str) -> Resolved:
    """The spec resolved: memoised, as every reconcile of a run needs it and validation is the costliest
    step of planning (the models are frozen, so sharing them is safe)."""
    spec = parse_spec(json.loads(spec_json))
    plans = tuple(plan_stages(spec))
    found = pod_security(_CHECKED_AS, spec, plans[0])
    return Resolved(spec, plans, content_hash(spec_document(spec)), found)


def pod_security_refusal(found: PodSecurity, floor: str) -> InvalidSpecError | None:
    """Pods that never start, or that are below the operator's Pod Security floor: the run is refused before
    anything is created (the operator's service account would create them for whoever made the run)."""
    if found.never_start:
        return InvalidSpecError(list(found.never_start))
    if found.below(floor):
        fields = "; ".join(line for line in found.findings)
        return InvalidSpecError(
            [
                f"spec.pod: the run's pods would be at the Pod Security level '{found.level}', below this "
                f"operator's minimum '{floor}' ({fields}); change spec.pod, or ask a cluster admin to lower "
                "the minimum (the chart's podSecurity.minimumLevel; never per run)"
            ]
        )
    return None


def plan_run(
    ref: RunRef,
    generation: int | None,
    spec_doc: Any,
    status_doc: dict[str, Any] | None,
    observed: Observed,
    now: str,
    pod_security_floor: str = RESTRICTED,
) -> Plan:
    """Decide the next writes and the new status of one run from its spec and its observed children (a spec
    whose pods are below `pod_security_floor` is refused)."""
    previous = previous_status(status_doc)
    try:
        resolved = resolve(json.dumps(spec_doc, sort_keys=True, default=str))
    except InvalidSpecError as error:
        return plan_invalid(generation, error, previous, now)
    if (refused := pod_security_refusal(resolved.pod_security, pod_security_floor)) is not None:
        return plan_invalid(generation, refused, previous, now)
    spec, stage_plans, spec_hash = resolved.spec, resolved.stage_plans, resolved.spec_hash
    configmap = names.spec_configmap_name(ref.name, spec_hash)
    check: Progress | None = None  # reviewed: the verify stage's walk, apart from the training stages'
    if reviewed(spec):
        progress, check = walk_reviewed(
            ref,
            spec,
            stage_plans,
            previous.stages,
            observed.jobs,
            configmap,
            observed.progress,
            observed.features,
        )
    else:
        progress = walk_stages(
            ref,
            spec,
            list(stage_plans),
            previous.stages,
            observed.jobs,
            configmap,
            observed.progress,
            features=observed.features,
        )
    # online: the producers first (they may hold the train Job back), then the Services of multi-node Jobs
    online_actions, producers = plan_producers(
        ref, spec, list(stage_plans), progress, observed, configmap, previous.producers
    )
    progress = replace(progress, actions=list(plan_rendezvous(ref, spec, progress, observed)))
    drafts = _drafts(spec, progress, check, previous)
    progress = with_check(progress, check) if check is not None else progress
    # exported past the gate, or pinned and verified; with serving.canary, served once its canary passed
    canary = plan_canary(ref, spec, observed, drafts.rollout, previous, now, generation)
    rollout = canary.serve
    serving_actions, serving = plan_serving(
        ref,
        served_spec(spec, rollout),  # the draft's own method
        observed,
        rollout.path if rollout else None,
        rollout.sha256 if rollout else None,
        schedule_of(spec, rollout),
    )
    # the stage pods' PodMonitor lives as long as the run (its pods come and go stage by stage)
    monitor = converge(observed, build_stage_pod_monitor(ref, spec)) if observed.pod_monitors_served else []
    changes = monitor + online_actions + progress.actions + serving_actions + list(canary.actions)
    actions = _storage_actions(ref, spec, observed, spec_hash, changes) + changes
    actions += _stale_configmaps(ref, observed, configmap)
    evaluated = _evaluated(progress)
    phase = _phase(spec, progress, serving)
    headline, eta = _headline(progress, serving, phase, drafts.candidate is not None)
    status = Eagle3RunStatus(
        phase=phase,
        current_stage=progress.blocked_at or (names.SERVE_STAGE if spec.serving.enabled else None),
        progress=headline,
        eta=eta,
        observed_generation=generation,
        acceptance_length=evaluated.acceptance_length if evaluated is not None else None,
        conditions=with_canary(
            run_conditions(
                ref,
                spec,
                progress,
                serving,
                drafts.candidate,
                previous.conditions,
                now,
                generation,
                resolved.pod_security.findings,
            ),
            canary.condition,
            tuned_note(spec, rollout or drafts.checkpoint),
        ),
        stages=progress.stages,
        checkpoint=drafts.checkpoint,
        candidate=drafts.candidate,
        serving=serving,
        canary=canary.status,
        producers=producers,
        plan=RunPlan(
            estimates=estimates_from_stages(spec, progress.stages, stage_plans),
            prediction=plan_prediction(progress.stages),
        ),
    )
    return Plan(
        actions=tuple(actions),
        status=status,
        phase=phase,
        finished=tuple(progress.finished),
        spec=spec,
        previous=previous,
        unconfirmed=tuple(progress.unconfirmed),
        failed_here=tuple(progress.failed_here),
    )

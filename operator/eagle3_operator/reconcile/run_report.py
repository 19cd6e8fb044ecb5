"""What one reconcile tells the metrics about a run, read from the plan, the status and the observed Jobs.

Pure: the readers here take the run's typed status (eagle3_contract.api.status) and JobViews, and return
numbers or the stages' typed results (eagle3_contract.results, which also knows the tokens each stage
processed); `OperatorMetrics` (metrics.py) turns them into Prometheus series and remembers what it counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eagle3_contract.api.status import BlockedBy, Eagle3RunStatus, RunPhase, StagePhase, StageStatus
from eagle3_contract.policy import expected_seconds, stage_deadline
from eagle3_contract.reasons import DEADLINE_EXCEEDED, ERROR, OUT_OF_MEMORY
from eagle3_contract.results import EvaluateResult, StageResult, parse_result
from eagle3_contract.stages import Stage
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.reconcile.observe import JobView
from eagle3_operator.reconcile.planner import Plan


@dataclass(frozen=True)
class RunReport:
    """One reconcile of one run, as plain data. `run` is the `eagle3.dev/run` label value (the run's name
    unless it is longer than 63 characters), so operator and vLLM series join on it."""

    namespace: str
    run: str
    phase: RunPhase
    status: Eagle3RunStatus
    now: float
    model: str | None = None
    deadlines: Mapping[str, int] = field(default_factory=dict)
    jobs: tuple[JobView, ...] = ()
    created: tuple[tuple[str, str], ...] = ()  # (Job name, stage) of Jobs this reconcile creates
    finished: tuple[tuple[str, float | None], ...] = ()


def run_report(ref: RunRef, plan: Plan, jobs: tuple[JobView, ...], now: float) -> RunReport:
    """The report of a reconcile that planned `plan` having observed `jobs`; `now` is unix time."""
    created = tuple(
        (a.body["metadata"]["name"], a.body["metadata"]["labels"][names.LABEL_STAGE])
        for a in plan.actions
        if a.verb == "create" and a.body.get("kind") == "Job"
    )
    deadlines: dict[str, int] = {}
    if plan.spec is not None:
        for stage in Stage:
            if (deadline := stage_deadline(plan.spec, stage)) is not None:
                deadlines[stage.value] = deadline
    return RunReport(
        namespace=ref.namespace,
        run=names.run_label(ref.name),
        phase=plan.phase,
        status=plan.status,
        now=now,
        model=plan.spec.verifier.model if plan.spec is not None else None,
        deadlines=deadlines,
        # a Job the plan failed itself (the server ignores its podFailurePolicy) counts as failed now
        jobs=tuple(
            dataclasses.replace(j, phase=StagePhase.FAILED) if j.name in plan.failed_here else j for j in jobs
        ),
        created=created,
        finished=plan.finished,
    )


def failure_reason(job: JobView) -> str:
    """OutOfMemory (OOMKilled, or the stage's out-of-memory exit code), DeadlineExceeded, else Error."""
    if job.out_of_memory:
        return OUT_OF_MEMORY
    if job.failure_reason == DEADLINE_EXCEEDED:
        return DEADLINE_EXCEEDED
    return ERROR


def unix_time(value: Any) -> float | None:
    """An RFC 3339 time of the API (`2025-01-02T03:04:05Z`) as unix time."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def stage_results(status: Eagle3RunStatus) -> dict[Stage, StageResult]:
    """The typed result of every stage that succeeded, by stage (a stage this version does not know is left
    out; a malformed result keeps its well-typed fields)."""
    out: dict[Stage, StageResult] = {}
    for stage, st in status.stages.items():
        if st.phase != StagePhase.SUCCEEDED or st.result is None:
            continue
        if (result := parse_result(stage, st.result)) is not None:
            out[Stage(stage)] = result
    return out


def running_stages(status: Eagle3RunStatus, deadlines: Mapping[str, int]) -> dict[str, tuple[float, int]]:
    """Stages whose current attempt runs now: (unix time it started, seconds it is expected to take). The
    expectation is the stage's live one where its progress has an ETA (the time it has run when its figures
    were read, plus the ETA then), else its deadline or the default for the stage."""
    out: dict[str, tuple[float, int]] = {}
    for stage, st in status.stages.items():
        started = unix_time(st.start_time)
        if st.phase == StagePhase.RUNNING and started is not None:
            out[stage] = (
                started,
                _live_expectation(started, st) or deadlines.get(stage) or expected_seconds(stage),
            )
    return out


def _live_expectation(started: float, stage: StageStatus) -> int | None:
    progress = stage.progress
    if progress is None or progress.eta_seconds is None:
        return None
    read = unix_time(progress.updated)
    if read is None:
        return None
    return max(round(read - started + progress.eta_seconds), 1)


def blocked_pods(status: Eagle3RunStatus) -> dict[str, BlockedBy]:
    """Stage (or `serve`, `producers`) to why its pod does not run (status blockedBy: reason, message)."""
    places = [
        *((stage, st.blocked_by) for stage, st in status.stages.items()),
        (names.SERVE_STAGE, status.serving.blocked_by if status.serving is not None else None),
        (names.PRODUCERS_STAGE, status.producers.blocked_by if status.producers is not None else None),
    ]
    return {stage: blocked for stage, blocked in places if blocked is not None and blocked.reason}


@dataclass(frozen=True)
class ServingDraft:
    """The draft a run's vLLM Deployment points at: its directory and (when known) its sha256."""

    checkpoint: str
    sha256: str


def serving_draft(status: Eagle3RunStatus) -> ServingDraft | None:
    """The draft of status.serving; its sha256 from status.checkpoint when that is the same directory."""
    draft = status.serving.draft if status.serving is not None else None
    if not draft:
        return None
    checkpoint = status.checkpoint
    sha = checkpoint.sha256 if checkpoint is not None and checkpoint.path == draft else None
    return ServingDraft(draft, sha or "")


def rolled_out_before(status: Eagle3RunStatus, draft: ServingDraft) -> float | None:
    """When a draft that served before the operator started was rolled out, as far as status tells: when
    the stage that cleared it finished (the rollout follows at once): verify for the pinned draft, export
    for the run's own; else when serving became Ready."""
    pinned = status.checkpoint is not None and status.checkpoint.path == draft.checkpoint
    verify, export = status.stages.get(Stage.VERIFY.value), status.stages.get(Stage.EXPORT.value)
    exported = export is not None and export.output_dir == draft.checkpoint
    for stage, cleared in ((verify, pinned), (export, exported)):
        if cleared and stage is not None and stage.phase == StagePhase.SUCCEEDED:
            done = unix_time(stage.completion_time)
            if done is not None:
                return done
    for cond in status.conditions:
        if cond.type == "Ready" and cond.status == "True":
            return unix_time(cond.last_transition_time)
    return None


GREEDY, SAMPLED = "greedy", "sampled"


@dataclass(frozen=True)
class EvaluatedAcceptance:
    """One of evaluate's measurements: `sampling` greedy (the gate's, at temperature 0) or sampled (at
    evaluation.sampling, the serving traffic's settings)."""

    sampling: str
    length: float | None
    rate: float | None
    by_position: tuple[float, ...]


def evaluated_acceptance(result: EvaluateResult) -> dict[str, EvaluatedAcceptance]:
    """evaluate's measurements by `sampling` label: greedy always, sampled when the result has it."""
    greedy = EvaluatedAcceptance(
        GREEDY, result.acceptance_length, result.acceptance_rate, tuple(result.acceptance_by_position or ())
    )
    out = {GREEDY: greedy}
    if (s := result.sampled) is not None:
        by_position = tuple(s.acceptance_by_position or ())
        out[SAMPLED] = EvaluatedAcceptance(SAMPLED, s.acceptance_length, s.acceptance_rate, by_position)
    return out

"""Stage progression: walk the stages in order and decide, for each, what exists and what to start next."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.status import BlockedBy, StagePhase, StageProgress, StageStatus
from eagle3_contract.estimates import estimates_from_stages
from eagle3_contract.gate import GateVerdict, judge_evaluation
from eagle3_contract.policy import next_token_budget, out_of_memory_message, out_of_memory_retry_note
from eagle3_contract.reasons import OUT_OF_MEMORY, STORAGE_TOO_SMALL
from eagle3_contract.results import EvaluateResult, StageResult, parse_message, parse_result, stage_error
from eagle3_contract.stages import Stage, StagePlan
from eagle3_contract.storage import claim_too_small
from eagle3_operator.builders.job import build_job, fail_fast_exit_codes
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.training import train_nodes
from eagle3_operator.reconcile.actions import Action, object_ref
from eagle3_operator.reconcile.observe import JobView
from eagle3_operator.reconcile.server_features import UNSUPPORTED_BY_CLUSTER, ServerFeatures
from eagle3_operator.reconcile.verification import check_failure

OOM_KILLED = "OOMKilled"  # a container's termination reason when the kernel killed it at its memory limit

# A completed Job whose result cannot be read is re-run (the program finds its output complete on the volume
# and reports its result again in seconds) until the stage's attempt number reaches this: past it, something
# keeps eating termination messages, and the stage is recorded without a result, with a message saying so.
MAX_RESULT_ATTEMPT = 8


@dataclass
class Progress:
    """The outcome of a walk: per-stage status, actions, and where (and why) the walk stopped."""

    stages: dict[str, StageStatus] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    finished: list[tuple[str, float | None]] = field(default_factory=list)
    blocked_at: str | None = None
    failed: tuple[str, str] | None = None  # (reason, message)
    stalled: BlockedBy | None = None  # why the pod of the stage at `blocked_at` does not run
    suspended: bool = False
    gate: GateVerdict | None = None  # once evaluate has succeeded
    # completed Jobs with no pod in the watch's view: the executor lists their pods before a re-run
    unconfirmed: list[str] = field(default_factory=list)
    # Jobs failed (and deleted) here, as their podFailurePolicy would have failed them (server_features.py)
    failed_here: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.blocked_at is None


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        t0 = datetime.fromisoformat(start.replace("Z", "+00:00"))
        t1 = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max((t1 - t0).total_seconds(), 0.0)


def _evaluated(result: StageResult | None) -> EvaluateResult | None:
    return result if isinstance(result, EvaluateResult) else None


def _failure_message(job: JobView) -> str:
    """The stage program's own error when its termination message holds one; else the message's tail (a
    crash's last log lines, kubelet's FallbackToLogsOnError)."""
    last = job.termination.message if job.termination and job.termination.message else None
    cause = job.failure_message or job.failure_reason or "the Job failed"
    error = stage_error(last)
    if error is not None:
        return f"Job {job.name} failed ({cause}): {error[-1500:]}"
    tail = f"; last message: {last[-1500:]}" if last else ""
    return f"Job {job.name} failed ({cause}){tail}"


def _lost_result(job: JobView) -> str:
    return (
        f"Job {job.name} completed but its result could not be read after {MAX_RESULT_ATTEMPT} attempts: "
        "check that the stage's pods keep their termination message (terminationMessagePath)"
    )


def _check_failure(job: JobView) -> tuple[str, str] | None:
    return check_failure(job.name, parse_message(job.termination.message if job.termination else None))


@dataclass
class Walk:
    """Walks the stages of one run; `run` is the step for one stage."""

    ref: RunRef
    spec: Eagle3RunSpec
    previous: dict[str, StageStatus]
    jobs: tuple[JobView, ...]
    spec_configmap: str
    live: Mapping[str, StageProgress] = field(default_factory=dict)  # by JobView.progress_key
    progress: Progress = field(default_factory=Progress)
    every: Sequence[StagePlan] = ()  # all the spec's stage plans (the estimates' input), not only the walk's
    features: ServerFeatures = field(default_factory=ServerFeatures)

    def run(self, plan: StagePlan) -> bool:
        """Record the stage's status; True when the walk may go on to the next stage."""
        stage = plan.stage.value
        if plan.skipped:
            self.progress.stages[stage] = StageStatus(phase=StagePhase.SKIPPED, message=plan.skipped)
            return True
        mine = sorted(
            (j for j in self.jobs if j.stage == stage and j.hash == plan.hash), key=lambda j: j.attempt
        )
        prev = self.previous.get(stage)
        remembered = prev if prev is not None and prev.hash == plan.hash else None
        latest = mine[-1] if mine else None
        if (
            latest is None
            and remembered is not None
            and remembered.phase == StagePhase.SUCCEEDED
            and (remembered.result is not None or remembered.attempts > MAX_RESULT_ATTEMPT)
        ):
            self.progress.stages[stage] = remembered  # its Job is gone (deleted or TTL); the result stays
            return (
                self._gate(EvaluateResult.parse(remembered.result)) if plan.stage == Stage.EVALUATE else True
            )
        if latest is None:  # never started, or its Job was deleted: the next attempt
            done = (StagePhase.FAILED, StagePhase.SUCCEEDED)
            attempt = remembered.attempts if remembered and remembered.phase in done else 0
            budget = remembered.token_budget if remembered and remembered.token_budget else plan.token_budget
            return self._start(plan, attempt, budget, remembered)
        base = StageStatus(
            phase=latest.phase,
            hash=plan.hash,
            job_name=latest.name,
            output_dir=plan.output_dir,
            attempts=latest.attempt + 1,
            token_budget=latest.token_budget,
            start_time=latest.start_time,
            completion_time=latest.completion_time,
            message=remembered.message if remembered and remembered.job_name == latest.name else None,
            progress=self.live.get(latest.progress_key)
            or (remembered.progress if remembered and remembered.job_name == latest.name else None),
        )
        if latest.phase == StagePhase.SUCCEEDED and latest.termination is None and latest.pods_seen:
            base = base.model_copy(
                update={"phase": StagePhase.RUNNING, "message": "waiting for the stage's result"}
            )
        if base.phase in (StagePhase.PENDING, StagePhase.RUNNING) and self._fails_fast(plan, latest):
            self._fail_here(plan, latest)
            base = base.model_copy(update={"phase": StagePhase.FAILED})
        if base.phase == StagePhase.SUCCEEDED:
            return self._succeeded(plan, latest, base, remembered)
        if base.phase == StagePhase.FAILED:
            return self._failed(plan, latest, base)
        self.progress.stages[stage] = base.model_copy(update={"blocked_by": latest.blocked_by})
        self.progress.blocked_at = stage
        self.progress.stalled = latest.blocked_by
        return False

    def _succeeded(
        self, plan: StagePlan, latest: JobView, base: StageStatus, remembered: StageStatus | None
    ) -> bool:
        stage = plan.stage.value
        message = latest.termination.message if latest.termination else None
        result = parse_result(plan.stage, message)
        if result is None and remembered is not None and remembered.job_name == latest.name:
            # its pods are gone (pod GC, eviction); the result was recorded
            result = parse_result(plan.stage, remembered.result)
        if result is None and not (message or "").strip() and latest.attempt < MAX_RESULT_ATTEMPT:
            if latest.pods_seen == 0 and not latest.pods_listed:
                return self._unconfirmed(plan, latest, base)
            return self._reread(plan, latest)
        document = result.document() if result is not None else None
        lost = None if result is not None or (message or "").strip() else _lost_result(latest)
        final = finished_progress(base.progress)
        self.progress.stages[stage] = base.model_copy(
            update={"result": document, "message": lost, "progress": final}
        )
        if remembered is None or remembered.phase != StagePhase.SUCCEEDED:
            self.progress.finished.append((stage, _seconds(latest.start_time, latest.completion_time)))
        return self._gate(_evaluated(result)) if plan.stage == Stage.EVALUATE else True

    def _fails_fast(self, plan: StagePlan, job: JobView) -> bool:
        """Whether a pod of a Job that has not failed ended so that running the same attempt again is
        pointless: killed by the kernel for its memory limit (OOMKilled) in a stage retried at half the
        budget (on every server: the Job controller would run the same budget into the same limit
        backoffLimit times), or with an exit code its podFailurePolicy fails the Job at (out of memory, a
        failed check) on a server that ignores the policy."""
        term = job.termination
        if term is None:
            return False
        if plan.retries_oom and term.reason == OOM_KILLED:
            return True
        if self.features.pod_failure_policy or term.exit_code is None:
            return False
        return term.exit_code in fail_fast_exit_codes(plan)

    def _held(
        self, plan: StagePlan, attempt: int, budget: int | None, message: str, failed: str | None = None
    ) -> bool:
        """The stage does not start (Pending, saying why); with `failed`, the run fails for that reason."""
        stage = plan.stage.value
        self.progress.stages[stage] = StageStatus(
            phase=StagePhase.PENDING, hash=plan.hash, output_dir=plan.output_dir, attempts=attempt,
            token_budget=budget, message=message,
        )  # fmt: skip
        if failed is not None:
            self.progress.failed = (failed, f"stage {stage}: {message}")
        return False

    def _fail_here(self, plan: StagePlan, job: JobView) -> None:
        """Fail the Job here, as its FailJob rule would have (the Job controller would run it again). Deleted
        when a next attempt follows (at half the budget); else stopped (parallelism 0) and kept, with its
        pods, as the failure's record: a deleted Job would read as one to run again."""
        budget = job.token_budget or plan.token_budget
        retries = plan.retries_oom and job.out_of_memory
        if retries and next_token_budget(budget, self.spec.dataset.max_sequence_length) is not None:
            self.progress.actions.append(Action("delete", object_ref("batch/v1", "Job", job.name, self.ref)))
        elif not job.stopped:
            stop = object_ref("batch/v1", "Job", job.name, self.ref) | {"spec": {"parallelism": 0}}
            self.progress.actions.append(Action("patch", stop))
        self.progress.failed_here.append(job.name)

    def _unconfirmed(self, plan: StagePlan, latest: JobView, base: StageStatus) -> bool:
        """A completed Job whose pod the watch has not shown: the pod watch may lag behind the Job watch (a
        second Job for the stage would then run for nothing), so the server is asked for its pods first."""
        stage = plan.stage.value
        waiting = base.model_copy(
            update={"phase": StagePhase.RUNNING, "message": "waiting for the stage's result"}
        )
        self.progress.stages[stage] = waiting
        self.progress.blocked_at = stage
        self.progress.unconfirmed.append(latest.name)
        return False

    def _reread(self, plan: StagePlan, latest: JobView) -> bool:
        """A completed Job whose result is lost (its pod gone before it was read, nothing recorded): run the
        stage again rather than take it as succeeded without a result (evaluate would fail the gate)."""
        self._start(plan, latest.attempt + 1, latest.token_budget or plan.token_budget, None)
        note = (
            f"Job {latest.name} completed but its result could not be read (its pod is gone); attempt "
            f"{latest.attempt + 2} re-reads it from the stage's complete output"
        )
        started = self.progress.stages[plan.stage.value]
        self.progress.stages[plan.stage.value] = started.model_copy(update={"message": note})
        return False

    def _start(self, plan: StagePlan, attempt: int, budget: int | None, prev: StageStatus | None) -> bool:
        stage = plan.stage.value
        self.progress.blocked_at = stage
        if self.spec.suspend:
            self.progress.suspended = True
            return self._held(plan, attempt, budget, "spec.suspend is true: no new Jobs are created")
        if plan.stage == Stage.EXTRACT and (short := self._storage_shortfall()) is not None:
            return self._held(plan, attempt, budget, short, failed=STORAGE_TOO_SMALL)
        if train_nodes(self.spec, plan) > 1 and not self.features.indexed_jobs:
            nodes, version = self.spec.training.nodes, self.features.version or "older"
            message = (
                f"training.nodes {nodes} needs Indexed Jobs (Kubernetes 1.22 or newer); this cluster is "
                f"{version}: set training.nodes to 1 or use a newer cluster"
            )
            return self._held(plan, attempt, budget, message, failed=UNSUPPORTED_BY_CLUSTER)
        job = build_job(self.ref, self.spec, plan, attempt, budget, self.spec_configmap)
        self.progress.actions.append(Action("create", job))
        self.progress.stages[stage] = StageStatus(
            phase=StagePhase.PENDING, hash=plan.hash, job_name=job["metadata"]["name"],
            output_dir=plan.output_dir, attempts=attempt + 1, token_budget=budget,
            message=prev.message if prev is not None and prev.phase == StagePhase.FAILED else None,
        )  # fmt: skip
        return False

    def _storage_shortfall(self) -> str | None:
        """Offline extract's hidden states against the claim the operator creates, from the data stages'
        results (exact by now): why the stage must not start, or None."""
        estimates = estimates_from_stages(self.spec, self.progress.stages, self.every or None)
        return claim_too_small(self.spec, estimates)

    def _failed(self, plan: StagePlan, job: JobView, base: StageStatus) -> bool:
        stage = plan.stage.value
        budget = job.token_budget or plan.token_budget
        max_len = self.spec.dataset.max_sequence_length
        retry = next_token_budget(budget, max_len) if plan.retries_oom and job.out_of_memory else None
        if retry is not None and budget is not None:
            note = out_of_memory_retry_note(job.attempt + 1, budget, retry)
            return self._start(plan, job.attempt + 1, retry, base.model_copy(update={"message": note}))
        if plan.retries_oom and job.out_of_memory:
            reason = OUT_OF_MEMORY
            message = out_of_memory_message(stage, budget, max_len)
        elif plan.stage == Stage.VERIFY and (verdict := _check_failure(job)) is not None:
            reason, message = verdict
        else:
            reason = OUT_OF_MEMORY if job.out_of_memory else (job.failure_reason or "JobFailed")
            message = _failure_message(job)
        self.progress.stages[stage] = base.model_copy(update={"message": message})
        self.progress.blocked_at = stage
        self.progress.failed = (reason, f"stage {stage}: {message}")
        return False

    def _gate(self, result: EvaluateResult | None) -> bool:
        """After evaluate: the draft goes on to export and serving only if it passes the gate."""
        verdict = judge_evaluation(result, self.spec.evaluation.min_acceptance_length)
        self.progress.gate = verdict
        if verdict.passed:
            return True
        self.progress.failed = (verdict.reason, verdict.message)
        self.progress.blocked_at = Stage.EVALUATE.value
        return False

    def _delete_stale(self, plan: StagePlan) -> None:
        """Unfinished Jobs of this stage for an older spec, or of a skipped stage, would waste GPUs."""
        for job in self.jobs:
            stale = job.stage == plan.stage.value and (plan.skipped is not None or job.hash != plan.hash)
            if stale and job.phase in (StagePhase.PENDING, StagePhase.RUNNING):
                self.progress.actions.append(
                    Action("delete", object_ref("batch/v1", "Job", job.name, self.ref))
                )


def finished_progress(last: StageProgress | None) -> StageProgress | None:
    """A finished stage's last figures (read before it ended) as done: every unit and epoch, no rate."""
    if last is None:
        return None
    total = last.total if last.total is not None else last.done
    update = {"done": total, "total": total, "rate": None, "eta_seconds": None, "eta": None}
    if last.epochs is not None:
        update["epochs_done"] = last.epochs
    return last.model_copy(update=update)


def walk_stages(
    ref: RunRef,
    spec: Eagle3RunSpec,
    plans: list[StagePlan],
    previous: dict[str, StageStatus],
    jobs: tuple[JobView, ...],
    spec_configmap: str,
    live: Mapping[str, StageProgress] | None = None,
    every: Sequence[StagePlan] | None = None,
    features: ServerFeatures | None = None,
) -> Progress:
    """Walk the stages in order, stopping at the first one that is not done; `live` holds the progress
    read from the running stages' pods (by JobView.progress_key); `every`: all the spec's stage plans, where
    `plans` are some of them."""
    walk = Walk(
        ref, spec, previous, jobs, spec_configmap, dict(live or {}), every=every or plans,
        features=features or ServerFeatures(),
    )  # fmt: skip
    for plan in plans:  # every stage, not only those the walk reaches: an edit upstream stops it early
        walk._delete_stale(plan)
    for plan in plans:
        if not walk.run(plan):
            break
    for plan in plans:  # stages after the stop: show what will run
        if plan.stage.value not in walk.progress.stages:
            phase = StagePhase.SKIPPED if plan.skipped else StagePhase.PENDING
            walk.progress.stages[plan.stage.value] = StageStatus(
                phase=phase, hash=None if plan.skipped else plan.hash, message=plan.skipped,
                output_dir=None if plan.skipped else plan.output_dir,
            )  # fmt: skip
    return walk.progress

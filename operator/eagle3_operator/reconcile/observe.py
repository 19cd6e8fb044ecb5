"""Observations: the few facts the planner needs, read from raw Job, Pod and Deployment dicts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eagle3_contract.api.status import BlockedBy, StagePhase, StageProgress, TrackFigures
from eagle3_contract.policy import is_out_of_memory, policy_exit_code
from eagle3_operator.builders import names
from eagle3_operator.reconcile.server_features import ServerFeatures


@dataclass(frozen=True)
class Termination:
    """How a stage container ended: its reason (OOMKilled, Error, Completed), exit code and last message."""

    reason: str | None
    exit_code: int | None
    message: str | None
    finished_at: str | None = None


@dataclass(frozen=True)
class JobView:
    """One stage attempt."""

    name: str
    stage: str
    hash: str
    attempt: int
    phase: StagePhase
    token_budget: int | None = None
    spec_configmap: str | None = None
    start_time: str | None = None
    completion_time: str | None = None
    failure_reason: str | None = None
    failure_message: str | None = None
    termination: Termination | None = None
    # parallelism 0: stopped by the operator after a failure that no retry of the Job can mend (stage_walk)
    stopped: bool = False
    pods_seen: int = 0
    # its pods were read from the API server, not only from the watch: none seen then means none are there
    pods_listed: bool = False
    blocked_by: BlockedBy | None = None
    pod_ip: str | None = None  # of its running pod (node 0's): where its progress metrics are served

    @property
    def progress_key(self) -> str:
        """The key of its live progress (stage_metrics.py): the labels its pods carry too."""
        return progress_key(self.stage, self.hash, self.attempt)

    @property
    def out_of_memory(self) -> bool:
        """The attempt ran out of memory (the contract's one rule): its container's exit code or OOMKilled,
        or, when its pod is gone, the exit code its podFailurePolicy failure names."""
        term = self.termination
        if term is not None:
            return is_out_of_memory(term.exit_code, term.reason)
        return self.failure_reason == "PodFailurePolicy" and is_out_of_memory(
            policy_exit_code(self.failure_message)
        )


def progress_key(stage: str, stage_hash: str, attempt: int | str) -> str:
    return f"{stage}/{stage_hash}/{attempt}"


@dataclass(frozen=True)
class DeploymentView:
    """A Deployment of the run: the serving one, the producers or the Mooncake master (`stage`)."""

    name: str
    spec_hash: str | None
    draft: str | None
    replicas: int
    ready_replicas: int
    stage: str = names.SERVE_STAGE
    hash: str | None = None  # producers, Mooncake master: the train stage they serve
    available_replicas: int = 0
    spec_configmap: str | None = None
    track: str | None = None  # `canary`: serving.canary's Deployment (its `eagle3.dev/track` label)


@dataclass(frozen=True)
class TrackWindows:
    """One track's figures in each complete sub-window since the canary's start (serving.canary.windows),
    the first first; None where the track had none (no drafts, no finished request, a counter reset)."""

    acceptance_length: tuple[float | None, ...] = ()
    output_tokens_per_second: tuple[float | None, ...] = ()
    requests: tuple[int | None, ...] = ()  # requests finished in the sub-window (those timed per token)


@dataclass(frozen=True)
class CanaryFigures:
    """serving.canary: both tracks' live figures over the observation window, in total and sub-window by
    sub-window, as the executor read them from Prometheus before planning (eagle3_operator.prometheus);
    `problem` says why some are missing."""

    incumbent: TrackFigures | None = None
    canary: TrackFigures | None = None
    incumbent_windows: TrackWindows = field(default_factory=TrackWindows)
    canary_windows: TrackWindows = field(default_factory=TrackWindows)
    problem: str | None = None


@dataclass(frozen=True)
class Observed:
    """Everything the planner knows about a run's children. `objects` holds (kind, name) of the others;
    `spec_hashes` their `eagle3.dev/spec-hash` annotations where they carry one."""

    jobs: tuple[JobView, ...] = ()
    deployment: DeploymentView | None = None
    objects: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    spec_hashes: Mapping[tuple[str, str], str] = field(default_factory=dict)
    serving_blocked_by: BlockedBy | None = None  # why a vLLM pod does not run
    pod_monitors_served: bool = False
    disruption_budgets_served: bool = False  # policy/v1 PodDisruptionBudgets (Kubernetes 1.21+)
    # the other Deployments (online: producers, Mooncake master) by their stage label, and why a pod of
    # one does not run
    workloads: Mapping[str, DeploymentView] = field(default_factory=dict)
    workload_blocked_by: Mapping[str, BlockedBy] = field(default_factory=dict)
    # the live progress of running stage attempts, by JobView.progress_key (stage_metrics.py)
    progress: Mapping[str, StageProgress] = field(default_factory=dict)
    features: ServerFeatures = field(default_factory=ServerFeatures)  # what the server's Jobs can do
    canary: DeploymentView | None = None  # serving.canary's Deployment
    canary_figures: CanaryFigures | None = None  # read while a canary is observed (None: not read)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def _terminations(pods: Iterable[Mapping[str, Any]], container: str) -> list[Termination]:
    found = []
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") != container:
                continue
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if term:
                found.append(
                    Termination(
                        reason=term.get("reason"),
                        exit_code=_int(term.get("exitCode")),
                        message=(term.get("message") or "").strip() or None,
                        finished_at=term.get("finishedAt"),
                    )
                )
    # Latest last; on a tie (second resolution) a successful exit counts as later: it ended the Job.
    return sorted(found, key=lambda t: (t.finished_at or "", t.exit_code == 0))


# Waiting reasons that need a person: the Job controller fails no pod for them (and a Deployment's pods
# restart for ever, CrashLoopBackOff), so without a word from the operator a stage would wait, silently,
# until its activeDeadlineSeconds, and a serving Deployment would never become ready.
STUCK_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "CrashLoopBackOff",
    }
)
MESSAGE_TAIL = 500  # characters of a crashed container's last message (its last log lines) kept


def blocked_by(pods: Iterable[Mapping[str, Any]]) -> BlockedBy | None:
    """Why a pod that has not ended does not run: a container stuck waiting (with its last exit, when it
    crash-loops), or no node that fits (the scheduler's message)."""
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        name = (pod.get("metadata") or {}).get("name", "")
        for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_WAITING:
                detail = waiting.get("message") or "no message"
                last = (cs.get("lastState") or {}).get("terminated")
                if last:
                    said = (last.get("message") or last.get("reason") or "").strip()[-MESSAGE_TAIL:]
                    detail += f"; last exit code {last.get('exitCode')}" + (f": {said}" if said else "")
                reason = str(waiting["reason"])
                return BlockedBy(
                    reason=reason, message=f"pod {name}, container {cs.get('name')}: {reason}: {detail}"
                )
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                detail = cond.get("message") or "no message"
                reason = str(cond.get("reason") or "Unschedulable")
                return BlockedBy(reason=reason, message=f"pod {name} is not scheduled ({reason}): {detail}")
    return None


def pods_of_stage(pods: Iterable[Mapping[str, Any]], stage: str) -> list[Mapping[str, Any]]:
    """The run's pods with the stage label `stage`."""
    return [
        p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(names.LABEL_STAGE) == stage
    ]


def serving_pods(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The run's vLLM pods among its pods (stage label `serve`)."""
    return pods_of_stage(pods, names.SERVE_STAGE)


WORKLOAD_STAGES = (names.PRODUCERS_STAGE, names.MOONCAKE_STAGE)


def workloads_blocked_by(pods: Iterable[Mapping[str, Any]]) -> dict[str, BlockedBy]:
    """Why a producer or Mooncake master pod does not run, by stage label."""
    listed = list(pods)
    found = {stage: blocked_by(pods_of_stage(listed, stage)) for stage in WORKLOAD_STAGES}
    return {stage: why for stage, why in found.items() if why is not None}


COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def _rank(pod: Mapping[str, Any]) -> str | None:
    """The completion index of an Indexed Job's pod (its label since Kubernetes 1.28, else annotation)."""
    meta = pod.get("metadata") or {}
    value = (meta.get("labels") or {}).get(COMPLETION_INDEX) or (meta.get("annotations") or {}).get(
        COMPLETION_INDEX
    )
    return str(value) if value is not None else None


def _job_phase(status: Mapping[str, Any]) -> StagePhase:
    if _condition(status, "Complete") or _condition(status, "SuccessCriteriaMet"):
        return StagePhase.SUCCEEDED
    if _condition(status, "Failed") or _condition(status, "FailureTarget"):
        return StagePhase.FAILED
    if status.get("active") or status.get("startTime"):
        return StagePhase.RUNNING
    return StagePhase.PENDING


def _spec_configmap(job: Mapping[str, Any]) -> str | None:
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    for volume in pod_spec.get("volumes") or []:
        if volume.get("name") == "spec" and volume.get("configMap"):
            return str(volume["configMap"].get("name"))
    return None


def observe_job(
    job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]] = (), listed: bool = False
) -> JobView:
    """Summarise a stage Job and the pods it ran (matched by the Job's stage/hash/attempt labels); `listed`:
    `pods` holds what the API server listed for it, not only what the watch delivered."""
    meta = job.get("metadata") or {}
    job_labels = meta.get("labels") or {}
    status = job.get("status") or {}
    stage = job_labels.get(names.LABEL_STAGE, "")
    mine = [
        p
        for p in pods
        if all(
            ((p.get("metadata") or {}).get("labels") or {}).get(key) == job_labels.get(key)
            for key in (names.LABEL_STAGE, names.LABEL_HASH, names.LABEL_ATTEMPT)
        )
    ]
    phase = _job_phase(status)
    # a multi-node stage's result is node 0's: the others' pods end too, a moment earlier or later
    first = [p for p in mine if _rank(p) in (None, "0")]
    terms = _terminations(first if phase == StagePhase.SUCCEEDED and first else mine, stage)
    failed = _condition(status, "Failed") or _condition(status, "FailureTarget")
    return JobView(
        name=meta.get("name", ""),
        stage=stage,
        hash=job_labels.get(names.LABEL_HASH, ""),
        attempt=_int(job_labels.get(names.LABEL_ATTEMPT)) or 0,
        phase=phase,
        token_budget=_int((meta.get("annotations") or {}).get(names.ANNOTATION_TOKEN_BUDGET)),
        spec_configmap=_spec_configmap(job),
        start_time=status.get("startTime"),
        completion_time=status.get("completionTime") or (failed or {}).get("lastTransitionTime"),
        failure_reason=(failed or {}).get("reason"),
        failure_message=(failed or {}).get("message"),
        termination=terms[-1] if terms else None,
        stopped=(job.get("spec") or {}).get("parallelism") == 0,
        pods_seen=len(mine),
        pods_listed=listed,
        blocked_by=blocked_by(mine),
        pod_ip=running_pod_ip(first or mine),
    )


def running_pod_ip(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """The IP of a running pod among `pods` (the last one listed), if any has one."""
    ips = [
        (p.get("status") or {}).get("podIP")
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running"
    ]
    return next((ip for ip in reversed(ips) if ip), None)


def observe_deployment(deployment: Mapping[str, Any]) -> DeploymentView:
    meta = deployment.get("metadata") or {}
    labels = meta.get("labels") or {}
    spec = deployment.get("spec") or {}
    template_meta = (spec.get("template") or {}).get("metadata") or {}
    status = deployment.get("status") or {}
    return DeploymentView(
        name=meta.get("name", ""),
        spec_hash=(meta.get("annotations") or {}).get(names.ANNOTATION_SPEC_HASH),
        draft=(template_meta.get("annotations") or {}).get(names.ANNOTATION_DRAFT),
        replicas=_int(spec.get("replicas")) or 0,
        ready_replicas=_int(status.get("readyReplicas")) or 0,
        stage=labels.get(names.LABEL_STAGE) or names.SERVE_STAGE,
        hash=labels.get(names.LABEL_HASH),
        available_replicas=_int(status.get("availableReplicas")) or 0,
        spec_configmap=_spec_configmap(deployment),
        track=labels.get(names.LABEL_TRACK),
    )


def split_deployments(
    deployments: Iterable[Mapping[str, Any]],
) -> tuple[DeploymentView | None, dict[str, DeploymentView]]:
    """The serving Deployment (stage `serve`, or no stage label: an older operator's) and the others by
    stage; the canary Deployment (canary_deployment) is neither."""
    serving: DeploymentView | None = None
    others: dict[str, DeploymentView] = {}
    for body in deployments:
        view = observe_deployment(body)
        if view.track == names.TRACK_CANARY:
            continue
        if view.stage == names.SERVE_STAGE:
            serving = serving or view
        else:
            others.setdefault(view.stage, view)
    return serving, others


def canary_deployment(deployments: Iterable[Mapping[str, Any]]) -> DeploymentView | None:
    """serving.canary's Deployment (label `eagle3.dev/track: canary`), if the run has one."""
    views = (observe_deployment(body) for body in deployments)
    return next((v for v in views if v.track == names.TRACK_CANARY), None)

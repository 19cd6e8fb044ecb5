"""Eagle3Run status: written only by the operator (the spec in git is the truth; status is what happened)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field

from eagle3_contract.api.base import ApiModel
from eagle3_contract.api.categories import CategoryFigures
from eagle3_contract.api.comparison import Comparison
from eagle3_contract.api.spec import DraftMethod
from eagle3_contract.api.speculation import SpeculationTable


class RunPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SERVING = "Serving"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    INVALID = "Invalid"


class StagePhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SKIPPED = "Skipped"


class ProducersPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    DELETED = "Deleted"


class ConditionType(StrEnum):
    SPEC_VALID = "SpecValid"
    POD_SECURITY = "PodSecurity"
    PROGRESSING = "Progressing"
    GATE_PASSED = "GatePassed"
    READY = "Ready"
    FAILED = "Failed"
    CANARY = "Canary"


class CanaryPhase(StrEnum):
    OBSERVING = "Observing"
    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"


class StatusModel(ApiModel):
    """Status models tolerate fields they do not know (a newer operator may have written them)."""

    model_config = ConfigDict(extra="ignore")

    def document(self) -> dict[str, Any]:
        """The camelCase JSON document the API server stores, unset fields left out."""
        out: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return out


class Condition(StatusModel):
    """A standard Kubernetes condition."""

    type: str = Field(
        description="Condition type: SpecValid, Progressing, GatePassed, Ready, Failed or Canary."
    )
    status: str = Field(pattern=r"^(True|False|Unknown)$", description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason of the last transition.")
    message: str = Field(
        min_length=1,
        description="Human-readable detail: what happened and what to do (never empty: Kubernetes 1.20 "
        "validates an empty string in status as null).",
    )
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="The spec generation this was computed from.")


class BlockedBy(StatusModel):
    """Why a pod does not run, while that lasts (the Job or Deployment does not fail for it)."""

    reason: str = Field(
        description="The kubelet's waiting reason (ImagePullBackOff, CreateContainerConfigError, "
        "CrashLoopBackOff, ...) or the scheduler's (Unschedulable)."
    )
    message: str = Field(description="The pod, the container and what the kubelet or the scheduler said.")


class StageProgress(StatusModel):
    """How far a running stage is, as its program reports it (its pod's metrics endpoint)."""

    unit: str = Field(description="What the stage counts: rows, samples, steps or prompts.")
    done: int = Field(0, description="Units done so far.")
    total: int | None = Field(None, description="Units the stage will do (unset: not known yet).")
    rate: float | None = Field(None, description="Recent rate, units per second.")
    eta_seconds: float | None = Field(None, description="Seconds left at the recent rate (unset: unknown).")
    eta: str | None = Field(None, description="When the stage should finish at the recent rate (RFC 3339).")
    updated: str | None = Field(None, description="When these figures were read (RFC 3339).")
    tokens: int | None = Field(None, description="Tokens handled so far (generate, extract, train).")
    failures: int | None = Field(None, description="Rows or requests that failed so far.")
    token_budget: int | None = Field(None, description="The current token budget (generate, extract).")
    epochs_done: int | None = Field(None, description="train: epochs completed.")
    epochs: int | None = Field(None, description="train: epochs to train.")
    step: int | None = Field(None, description="train: optimizer steps so far.")
    train_loss: float | None = Field(None, description="train: loss over the recent steps.")
    val_loss: float | None = Field(None, description="train: validation loss of the last completed epoch.")
    val_accuracy_by_position: list[float] | None = Field(
        None, description="train: per-position conditional validation accuracy of the last epoch."
    )
    estimated_acceptance_length: float | None = Field(
        None, description="train: the last epoch's acceptance length estimated from its validation accuracy."
    )
    tokens_per_second: float | None = Field(None, description="train: recent training tokens per second.")


class StageStatus(StatusModel):
    """What one stage did for the current spec."""

    phase: StagePhase = Field(description="Pending, Running, Succeeded, Failed or Skipped.")
    hash: str | None = Field(None, description="Content hash of the stage's parameters and inputs.")
    job_name: str | None = Field(None, description="The Job running the current attempt.")
    output_dir: str | None = Field(None, description="Output directory on the artifacts volume.")
    attempts: int = Field(0, description="Jobs started for this hash (out-of-memory retries included).")
    token_budget: int | None = Field(
        None, description="Token budget of the current attempt (extract, generate)."
    )
    start_time: str | None = Field(None, description="When the current attempt's Job started.")
    completion_time: str | None = Field(None, description="When the stage finished.")
    message: str | None = Field(None, description="The stage's last message: progress, skip reason or error.")
    blocked_by: BlockedBy | None = Field(
        None,
        description="Why the stage's pod is not running, while that lasts: a container that cannot start (an "
        "image that cannot be pulled, a missing Secret or ConfigMap) or no node that fits (the scheduler's "
        "message). The Job does not fail for these; fix the cause and the stage goes on.",
    )
    result: dict[str, Any] | None = Field(
        None,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        description="The stage program's JSON result (its container termination message).",
    )
    progress: StageProgress | None = Field(
        None,
        description="How far the stage is while it runs (read from its pod's metrics at a bounded rate), and "
        "its last figures once it finished.",
    )


class Checkpoint(StatusModel):
    """The exported draft; `eagle3 promote RUN` writes it into spec.serving.pinnedCheckpoint for git."""

    path: str = Field(description="Directory of the exported draft on the artifacts volume.")
    sha256: str | None = Field(None, description="sha256 of the draft's model.safetensors.")
    bytes: int | None = Field(None, description="Size of the exported checkpoint in bytes.")
    acceptance_length: float | None = Field(
        None,
        description="Mean acceptance length (tokens per verifier step) evaluate measured for this draft; "
        "unset for a pinned draft.",
    )
    acceptance_rate: float | None = Field(
        None,
        description="Fraction of proposed draft tokens the verifier accepted in evaluate; unset for a "
        "pinned draft.",
    )
    speculation: SpeculationTable | None = Field(
        None,
        description="evaluate's sweep (evaluation.sweep): acceptance and output tokens/s per k and "
        "concurrency, and the best k per batch-size range that serving.speculationLength tuned serves.",
    )
    method: DraftMethod | None = Field(
        None,
        description="The draft's method (export's or verify's reading of its config): the one vLLM serves "
        "it with; unset: draft.method.",
    )
    categories: list[CategoryFigures] | None = Field(
        None,
        description="evaluate's acceptance and speedup per category of the held-out prompts (a dataset row's "
        "`category` or its file; evaluation.categories); unset when they had one category, or for a pinned "
        "draft.",
    )


class ServingStatus(StatusModel):
    """The vLLM rollout."""

    deployment: str = Field(description="Name of the vLLM Deployment.")
    service: str = Field(description="Name of the vLLM Service.")
    replicas: int = Field(0, description="Desired replicas.")
    ready_replicas: int = Field(0, description="Ready replicas.")
    url: str = Field(description="In-cluster OpenAI-compatible endpoint.")
    draft: str | None = Field(None, description="Draft directory the Deployment serves.")
    blocked_by: BlockedBy | None = Field(
        None,
        description="Why a vLLM pod does not run, while that lasts: an image that cannot be pulled, no node "
        "that fits, or a crash loop with the container's last exit code and log lines.",
    )


class TrackFigures(StatusModel):
    """One Deployment's live figures over the canary's observation window, read from Prometheus."""

    acceptance_length: float | None = Field(None, description="Live mean acceptance length.")
    output_tokens_per_second: float | None = Field(
        None,
        description="Output tokens per second of one request while it decodes (1 / vLLM's mean time per "
        "output token): independent of how the Service splits the traffic.",
    )
    requests: int | None = Field(None, description="Requests finished in the window.")


class CanaryStatus(StatusModel):
    """serving.canary: a new draft served next to the incumbent, promoted or rolled back on live figures."""

    phase: CanaryPhase = Field(description="Observing, Promoted or RolledBack.")
    deployment: str = Field(description="Name of the canary's vLLM Deployment.")
    draft: str = Field(description="Draft directory the canary serves (the new draft).")
    sha256: str | None = Field(None, description="sha256 of the canary draft's model.safetensors.")
    incumbent_draft: str | None = Field(None, description="Draft directory the incumbent Deployment serves.")
    replicas: int = Field(0, description="Desired canary replicas (0 once decided).")
    ready_replicas: int = Field(0, description="Ready canary replicas.")
    started: str | None = Field(
        None, description="When the observation window began: the canary's first ready replica (RFC 3339)."
    )
    decided: str | None = Field(None, description="When the canary was promoted or rolled back (RFC 3339).")
    seconds_to_decision: float | None = Field(
        None, description="From the start of the observation window to the decision."
    )
    incumbent: TrackFigures | None = Field(None, description="The incumbent's figures in the window.")
    canary: TrackFigures | None = Field(None, description="The canary's figures in the window.")
    window_seconds: float | None = Field(
        None, description="Length of each sub-window compared: serving.canary.duration / windows."
    )
    acceptance_ratio: Comparison | None = Field(
        None,
        description="The canary's mean acceptance length over the incumbent's, sub-window by sub-window: "
        "the median ratio and its 95 % interval (sub-windows where a track has no figure left out).",
    )
    speed_ratio: Comparison | None = Field(
        None,
        description="The canary's output tokens/s per request over the incumbent's, sub-window by "
        "sub-window: the median ratio and its 95 % interval.",
    )
    extended: bool = Field(
        False,
        description="The first decision could not tell the tracks apart: the canary was observed once "
        "more for serving.canary.duration.",
    )
    extended_at: str | None = Field(None, description="When the observation was extended (RFC 3339).")
    incumbent_categories: list[CategoryFigures] | None = Field(
        None,
        description="The incumbent draft's evaluated figures per category (its status.checkpoint.categories "
        "when the canary started), compared with the new draft's; unset when unknown (a pinned draft).",
    )
    categories: str | None = Field(
        None,
        description="What the comparison of the two drafts' evaluated acceptance length per category found "
        "(a category below 1 - tolerance times the incumbent's, with enough prompts, refuses the canary).",
    )
    message: str | None = Field(None, description="What the canary waits for, or why it was decided so.")


class ModeEstimate(StatusModel):
    """The hidden states of one extraction mode: bytes on the artifacts volume, and bytes the verifier
    computes and hands to the trainer over the whole run."""

    stored_bytes: int | None = Field(None, description="Bytes stored at once (unset: not known yet).")
    stored: str | None = Field(None, description="storedBytes for people, e.g. '86.0 TB' (decimal units).")
    moved_bytes: int | None = Field(
        None, description="Bytes the verifier computes and hands to the trainer in the run (unset: unknown)."
    )
    moved: str | None = Field(None, description="movedBytes for people, e.g. '860.3 TB' (decimal units).")
    note: str = Field(description="How the figures follow from the tokens (epochs, extraction.keep).")


class HiddenStatesEstimate(StatusModel):
    """The hidden states of the run, in both modes, so extraction.mode can be chosen before anything runs."""

    mode: str = Field(description="The spec's extraction.mode: offline or online.")
    dtype: str = Field(description="extraction.dtype.")
    layers: int = Field(description="Layers stored per token: the auxiliary layers and the last one.")
    hidden_size: int | None = Field(None, description="The verifier's hidden size (unset: not known yet).")
    bytes_per_token: int | None = Field(
        None, description="layers x hiddenSize x dtype bytes, plus the token id (and fp8's scale)."
    )
    offline: ModeEstimate = Field(description="extraction.mode offline: extract stores every sample.")
    online: ModeEstimate = Field(description="extraction.mode online: producers compute samples as asked.")
    basis: str = Field(description="Where the hidden size came from, or why it is not known yet.")


class StageEstimate(StatusModel):
    """What one stage would use while it runs."""

    stage: str = Field(description="The stage.")
    gpus: int = Field(0, description="GPUs of the stage's pods (GPUs per pod x pods); 0: skipped or CPU.")
    pods: int = Field(0, description="Pods the stage runs (training.nodes for train); 0: skipped.")
    producer_gpus: int | None = Field(
        None, description="Online train: GPUs of the hidden-state producers (servers x tensorParallelSize)."
    )
    tokens: int | None = Field(None, description="Tokens the stage handles (unset: none or unknown).")
    basis: str | None = Field(None, description="How the stage's tokens follow from the dataset's.")
    skipped: str | None = Field(None, description="Why the stage does not run for this spec.")


class ServingEstimate(StatusModel):
    """What serving holds from its rollout on: the vLLM Deployment, and the canary beside it while it runs."""

    replicas: int = Field(description="vLLM replicas (serving.replicas).")
    gpus: int = Field(description="GPUs of the Deployment: replicas x verifier.tensorParallelSize; 0 on CPU.")
    canary_replicas: int | None = Field(
        None, description="serving.canary.replicas, beside the Deployment while a canary is observed."
    )
    canary_gpus: int | None = Field(None, description="GPUs of the canary's pods (unset: no canary).")


class Estimates(StatusModel):
    """Figures before (and while) the run: each says its basis, an upper bound until prepare has run."""

    tokens: int | None = Field(None, description="Tokens of the training dataset (unset: unknown yet).")
    tokens_basis: str = Field(description="Where the token count came from: exact, upper bound, unknown.")
    hidden_states: HiddenStatesEstimate = Field(description="Hidden-state bytes, offline and online.")
    stages: list[StageEstimate] = Field(default_factory=list, description="GPUs and tokens per stage.")
    serving: ServingEstimate | None = Field(
        None, description="GPUs serving holds from its rollout on (unset: serving.enabled is false)."
    )
    peak_gpus: int | None = Field(
        None,
        description="The most GPUs the run holds at once: its largest stage (train with its online "
        "producers) or serving with its canary, whichever is more.",
    )


class PredictionRow(StatusModel):
    """An acceptance length the prediction is made at, and the speedup it would give."""

    acceptance_length: float = Field(description="Mean tokens per verifier step (bonus token included).")
    source: str | None = Field(
        None, description="Where the figure comes from (a published draft, or targetAcceptanceLength)."
    )
    speedup: list[float | None] = Field(
        default_factory=list, description="Predicted speedup over the verifier alone, per concurrency."
    )
    tokens_per_second: list[float | None] = Field(
        default_factory=list, description="Predicted output tokens per second, per concurrency."
    )


class Prediction(StatusModel):
    """evaluation.predict: the speedup a draft would give this verifier here, measured before training."""

    method: str | None = Field(
        None,
        description="synthetic: vLLM's synthetic rejection sampling at each length (GPU); step-cost: an "
        "untrained draft's measured step cost scaled by the acceptance length (CPU).",
    )
    num_speculative_tokens: int | None = Field(None, description="k: draft tokens proposed per step.")
    concurrencies: list[int] = Field(default_factory=list, description="Requests in flight, per column.")
    baseline_tokens_per_second: list[float | None] = Field(
        default_factory=list, description="Output tokens per second of the verifier alone, per concurrency."
    )
    lengths: list[PredictionRow] = Field(
        default_factory=list, description="The acceptance lengths predicted at, lowest first."
    )
    break_even: list[float | None] = Field(
        default_factory=list,
        description="Per concurrency, the acceptance length at which the speedup is 1 (null: above k + 1).",
    )
    verdict: str | None = Field(None, description="From which acceptance length a draft pays off, where.")


class RunPlan(StatusModel):
    """What the run would take, derived from the spec and the results of the stages so far."""

    estimates: Estimates | None = Field(None, description="Tokens, hidden-state bytes and GPUs per stage.")
    prediction: Prediction | None = Field(
        None, description="evaluation.predict: the speedup predicted before training (the predict stage)."
    )


class ProducersStatus(StatusModel):
    """Online extraction's hidden-state producers (and the Mooncake master): they live while the train
    stage runs and are deleted, freeing their GPUs, once it finished."""

    phase: ProducersPhase = Field(
        description="Pending: created, no producer answers yet (the train Job waits for one); Running: at "
        "least one producer is available; Deleted: the train stage finished (or needs none), their GPUs "
        "are free."
    )
    deployment: str = Field(description="Name of the producers' Deployment (and Service).")
    endpoint: str = Field(description="The producers' OpenAI API the train stage asks for hidden states.")
    mooncake_master: str | None = Field(
        None, description="host:port of the Mooncake master (extraction.transfer mooncake)."
    )
    train_hash: str | None = Field(None, description="Hash of the train stage the producers serve.")
    replicas: int = Field(0, description="Desired producers (extraction.servers); 0 once deleted.")
    ready_replicas: int = Field(0, description="Producers whose vLLM answers /health.")
    available_replicas: int = Field(0, description="Producers available to the train stage.")
    blocked_by: BlockedBy | None = Field(
        None,
        description="Why a producer (or the Mooncake master) pod does not run, while that lasts: an image "
        "that cannot be pulled, no node with free GPUs, a crash loop (out of memory) with its last exit "
        "code and log lines.",
    )
    message: str | None = Field(None, description="What the producers wait for, or why they were deleted.")


class Eagle3RunStatus(StatusModel):
    """Observed state of an Eagle3Run."""

    phase: RunPhase = Field(RunPhase.PENDING, description="Overall phase of the run.")
    current_stage: str | None = Field(
        None, description="The stage running now, or the one that stopped the run."
    )
    observed_generation: int | None = Field(None, description="The spec generation this status reflects.")
    acceptance_length: float | None = Field(None, description="Mean acceptance length measured by evaluate.")
    progress: str | None = Field(
        None, description="The current stage and how far it is, e.g. 'train 6/10 ep' (kubectl's Progress)."
    )
    eta: str | None = Field(
        None, description="Time left in the current stage at its recent rate, e.g. '3h20m' (kubectl's ETA)."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions.")
    stages: dict[str, StageStatus] = Field(
        default_factory=dict, description="Per-stage status, keyed by stage."
    )
    checkpoint: Checkpoint | None = Field(None, description="The exported (or pinned) draft checkpoint.")
    candidate: Checkpoint | None = Field(
        None,
        description="serving.promotion reviewed: the current spec's evaluated and exported draft that waits "
        "for `eagle3 promote RUN` to be merged; vLLM serves spec.serving.pinnedCheckpoint meanwhile. Unset "
        "while the run trains, and once the pin is this draft (promoted).",
    )
    serving: ServingStatus | None = Field(None, description="The vLLM rollout, once created.")
    canary: CanaryStatus | None = Field(
        None, description="serving.canary: the last new draft's canary, while observed and once decided."
    )
    producers: ProducersStatus | None = Field(
        None, description="extraction.mode online: the hidden-state producers of the train stage."
    )
    plan: RunPlan | None = Field(
        None, description="What the run would take: tokens, hidden-state bytes, GPUs per stage (estimates)."
    )

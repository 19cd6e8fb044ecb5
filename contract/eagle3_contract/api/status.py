"""Eagle3Run status: written only by the operator (the spec in git is the truth; status is what happened)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field

from eagle3_contract.api.base import ApiModel


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


class ConditionType(StrEnum):
    SPEC_VALID = "SpecValid"
    PROGRESSING = "Progressing"
    GATE_PASSED = "GatePassed"
    READY = "Ready"
    FAILED = "Failed"


class StatusModel(ApiModel):
    """Status models tolerate fields they do not know (a newer operator may have written them)."""

    model_config = ConfigDict(extra="ignore")


class Condition(StatusModel):
    """A standard Kubernetes condition."""

    type: str = Field(description="Condition type: SpecValid, Progressing, GatePassed, Ready or Failed.")
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


class Eagle3RunStatus(StatusModel):
    """Observed state of an Eagle3Run."""

    phase: RunPhase = Field(RunPhase.PENDING, description="Overall phase of the run.")
    current_stage: str | None = Field(
        None, description="The stage running now, or the one that stopped the run."
    )
    observed_generation: int | None = Field(None, description="The spec generation this status reflects.")
    acceptance_length: float | None = Field(None, description="Mean acceptance length measured by evaluate.")
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions.")
    stages: dict[str, StageStatus] = Field(
        default_factory=dict, description="Per-stage status, keyed by stage."
    )
    checkpoint: Checkpoint | None = Field(None, description="The exported (or pinned) draft checkpoint.")
    serving: ServingStatus | None = Field(None, description="The vLLM rollout, once created.")

"""Pod-level models of the spec: the settings of every pod a run creates, container resources, placement
tolerations, per-stage Job overrides, the serving PodDisruptionBudget and Prometheus discovery."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from eagle3_contract.api.base import ApiModel
from eagle3_contract.api.fields import (
    ANNOTATION_VALUE_MAX,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    DNS_SUBDOMAIN_MAX,
    LABEL_VALUE,
    LABEL_VALUE_MAX,
    QUALIFIED_NAME,
    QUALIFIED_NAME_MAX,
    CountOrPercent,
    LabelValue,
    NonNegativeQuantity,
)
from eagle3_contract.api.kubernetes_types import Affinity, EnvVarSource, PodSecurityContext, SecurityContext
from eagle3_contract.quantity import quantity


class Resources(ApiModel):
    """Container resource requests and limits (GPU limits are set by the operator)."""

    requests: dict[str, NonNegativeQuantity] = Field(
        default_factory=dict, description="Resource requests (each at least 0, and at most its limit)."
    )
    limits: dict[str, NonNegativeQuantity] = Field(
        default_factory=dict, description="Resource limits (each at least 0)."
    )

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Resources:
        """A request above its limit is refused by the API server (core/v1 ValidateResourceRequirements): a
        comparison of two quantities, which no structural schema (nor CEL before Kubernetes 1.29) can state,
        so it is checked here, where `eagle3 run` and the operator both parse the spec."""
        over = [
            f"requests.{name} ({request}) is more than limits.{name} ({self.limits[name]})"
            for name, request in self.requests.items()
            if name in self.limits
            and (asked := quantity(str(request))) is not None
            and (most := quantity(str(self.limits[name]))) is not None
            and asked > most
        ]
        if over:
            raise ValueError("; ".join(over) + ": a request must be at most its limit")
        return self


class DisruptionBudget(ApiModel):
    """The PodDisruptionBudget of the vLLM pods: how many a drain or an upgrade may evict at once."""

    enabled: bool = Field(True, description="Create a PodDisruptionBudget for the vLLM pods.")
    max_unavailable: CountOrPercent = Field(
        1,
        description="vLLM pods that may be unavailable during voluntary disruptions: a count or a "
        "percentage ('25%').",
    )


MAX_METADATA = 64  # labels, annotations: bounds the cost of the CEL rules over their keys (rules.py)
# What the operator's own annotations of a pod may take of the API server's 256 KiB for all of them (the
# Prometheus scrape annotations, the spec hash): spec.pod.annotations get the rest.
OPERATOR_ANNOTATIONS_RESERVE = 4 * 1024
USER_ANNOTATIONS_MAX = ANNOTATION_VALUE_MAX - OPERATOR_ANNOTATIONS_RESERVE
MAX_TOLERATIONS = 64  # bounds the cost of the CEL rule over them (eagle3_contract.api.rules)


# A toleration's key: empty (with operator Exists: every taint), or a label key
OPTIONAL_QUALIFIED_NAME = f"^({QUALIFIED_NAME[1:-1]})?$"


class Toleration(ApiModel):
    """A Kubernetes toleration (core/v1 Toleration)."""

    key: str | None = Field(
        None,
        pattern=OPTIONAL_QUALIFIED_NAME,
        max_length=QUALIFIED_NAME_MAX,
        description="Taint key to tolerate (a label key); empty with operator Exists tolerates every taint.",
    )
    operator: str | None = Field(
        None, pattern=r"^(Exists|Equal)$", description="Exists or Equal (the default)."
    )
    value: str | None = Field(
        None,
        pattern=LABEL_VALUE,
        max_length=LABEL_VALUE_MAX,
        description="Taint value for operator Equal (a label value).",
    )
    effect: str | None = Field(
        None, pattern=r"^(NoSchedule|PreferNoSchedule|NoExecute)$", description="Taint effect to tolerate."
    )
    toleration_seconds: int | None = Field(
        None, description="How long a NoExecute taint is tolerated (effect NoExecute only)."
    )

    def problem(self) -> str | None:
        """What the API server would refuse in this toleration (core/v1 validation), or None."""
        if not self.key and self.operator != "Exists":
            return "a toleration with no key needs operator Exists (it then tolerates every taint)"
        if self.operator == "Exists" and self.value:
            return "operator Exists takes no value (it tolerates every value of the key)"
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            return "tolerationSeconds applies to effect NoExecute only"
        return None


class LocalObjectReference(ApiModel):
    """The name of an object in the run's namespace."""

    name: str = Field(pattern=DNS_LABEL, max_length=253, description="Name of the object.")


# core/v1 EnvVar names as the API server checks them (a C identifier, '-' and '.' allowed, not a digit first)
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
ENV_MAX_ITEMS = 128
# The operator's own variables: what a stage is, where its inputs are, what a draft check checks. That no name
# of spec.pod.env starts with it is a rule of rules.py (CEL and its Python twin).
OPERATOR_ENV_PREFIX = "EAGLE3_"


class EnvVar(ApiModel):
    """A core/v1 EnvVar, checked as the API server checks a pod's (when the run is applied, not later)."""

    name: str = Field(
        pattern=ENV_NAME,
        max_length=253,
        description=f"Name of the variable (not {OPERATOR_ENV_PREFIX}*: those are the operator's).",
    )
    value: str | None = Field(None, description="Its value.")
    value_from: EnvVarSource | None = Field(
        None, description="Where its value comes from: a core/v1 EnvVarSource."
    )

    def document(self) -> dict[str, Any]:
        """As a container's env entry."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class PodSettings(ApiModel):
    """Settings of every pod the run creates: stage Jobs, vLLM serving, online producers, Mooncake master."""

    service_account_name: str | None = Field(
        None, pattern=DNS_LABEL, description="ServiceAccount of the pods; default the namespace's default."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, description="Secrets for pulling the images from a private registry."
    )
    labels: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=MAX_METADATA, description="Extra labels of every pod."
    )
    annotations: dict[str, Annotated[str, Field(max_length=ANNOTATION_VALUE_MAX)]] = Field(
        default_factory=dict, max_length=MAX_METADATA, description="Extra annotations of every pod."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=ENV_MAX_ITEMS,
        description="Extra environment variables (core/v1 EnvVar) of every container, after the operator's; "
        f"names starting {OPERATOR_ENV_PREFIX} are the operator's and are refused.",
    )
    priority_class_name: str | None = Field(
        None,
        pattern=DNS_SUBDOMAIN,
        max_length=DNS_SUBDOMAIN_MAX,
        description="PriorityClass of every pod (a DNS subdomain).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=MAX_TOLERATIONS,
        description="Tolerations of every pod (GPU pods add nodePool.tolerations).",
    )
    affinity: Affinity = Field(
        default_factory=dict,
        description="A core/v1 Affinity for pods off the GPU pool; GPU pods use nodePool.affinity when set.",
    )
    security_context: PodSecurityContext | None = Field(
        None,
        description="The pods' core/v1 PodSecurityContext, merged field by field over the Pod Security "
        "'restricted' defaults: runAsNonRoot, user and group 65532, fsGroup 65532, seccomp RuntimeDefault. "
        "A pod below the 'restricted' level is refused (SpecValid False), unless a cluster admin lowered the "
        "operator's floor (the chart's podSecurity.minimumLevel): then it gets a Warning Event and the "
        "PodSecurity condition.",
    )
    container_security_context: SecurityContext | None = Field(
        None,
        description="Every container's core/v1 SecurityContext, merged field by field over the 'restricted' "
        "defaults: no privilege escalation, every capability dropped.",
    )

    @model_validator(mode="after")
    def _annotations_fit(self) -> PodSettings:
        """The API server limits all of an object's annotations together (keys and values, 256 KiB): a rule
        CEL cannot state (it has no sum over a map), so it is checked here, where `eagle3 run` and the
        operator both parse the spec."""
        size = sum(len(k.encode()) + len(v.encode()) for k, v in self.annotations.items())
        if size > USER_ANNOTATIONS_MAX:
            raise ValueError(
                f"annotations of {size:,} bytes (keys and values together); the API server takes "
                f"256 KiB for all of a pod's annotations, and the operator's own need "
                f"{OPERATOR_ANNOTATIONS_RESERVE:,}: keep them to {USER_ANNOTATIONS_MAX:,} bytes"
            )
        return self


class Monitoring(ApiModel):
    """How Prometheus finds the run's metrics."""

    pod_monitor_labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        description="Labels of the run's PodMonitors (vLLM and the stages), added to the operator's "
        "(the chart's podMonitor.labels), e.g. {release: kube-prometheus-stack}: the label a Prometheus "
        "selects PodMonitors by.",
    )


class StageOverride(ApiModel):
    """Per-stage Job settings."""

    resources: Resources | None = Field(None, description="Container resources of the stage.")
    backoff_limit: int | None = Field(None, ge=0, le=20, description="Pod retries before the stage fails.")
    active_deadline_seconds: int | None = Field(
        None, ge=1, description="Wall-clock limit of the stage's Job."
    )


class StageOverrides(ApiModel):
    """Overrides keyed by stage."""

    predict: StageOverride | None = Field(None, description="Overrides of the predict stage.")
    prepare: StageOverride | None = Field(None, description="Overrides of the prepare stage.")
    generate: StageOverride | None = Field(None, description="Overrides of the generate stage.")
    extract: StageOverride | None = Field(None, description="Overrides of the extract stage.")
    vocab: StageOverride | None = Field(None, description="Overrides of the vocab stage.")
    train: StageOverride | None = Field(None, description="Overrides of the train stage.")
    evaluate: StageOverride | None = Field(None, description="Overrides of the evaluate stage.")
    export: StageOverride | None = Field(None, description="Overrides of the export stage.")
    verify: StageOverride | None = Field(None, description="Overrides of the verify stage.")

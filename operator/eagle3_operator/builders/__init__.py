"""Pure builders: (run, stage plan) -> Kubernetes object dicts. No I/O."""

from __future__ import annotations

from eagle3_operator.builders.claim import build_artifacts_claim
from eagle3_operator.builders.configmap import build_spec_configmap
from eagle3_operator.builders.job import build_job
from eagle3_operator.builders.serving import (
    build_canary_deployment,
    build_deployment,
    build_pod_monitor,
    build_service,
)

__all__ = [
    "build_artifacts_claim",
    "build_canary_deployment",
    "build_deployment",
    "build_job",
    "build_pod_monitor",
    "build_service",
    "build_spec_configmap",
]

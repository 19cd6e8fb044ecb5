"""Starting the kopf operator: one process, standalone (one replica, Deployment strategy Recreate)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import kopf

import eagle3_operator.handlers  # noqa: F401  (registers the handlers)
from eagle3_operator.metrics import OperatorMetrics


def run_operator(
    namespaces: Sequence[str],
    liveness: str | None,
    metrics_port: int | None,
    pipeline_image: str | None = None,
) -> None:
    """Block running the operator; metrics on `metrics_port`, kopf's liveness probe on `liveness`; stage Jobs
    of runs that name no spec.images.pipeline run `pipeline_image`."""
    metrics = OperatorMetrics()
    if metrics_port:
        metrics.serve(metrics_port)
    asyncio.run(
        kopf.operator(
            standalone=True,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            liveness_endpoint=liveness,
            memo=kopf.Memo(metrics=metrics, pipeline_image=pipeline_image),
        )
    )

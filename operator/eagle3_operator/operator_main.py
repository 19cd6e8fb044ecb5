"""Starting the kopf operator: one process, standalone (one replica, Deployment strategy Recreate)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import kopf

import eagle3_operator.handlers  # noqa: F401  (registers the handlers)
from eagle3_operator.k8s import TOTAL_SECONDS, ApiError, Kube, current_namespace
from eagle3_operator.lease import LEASE_SECONDS, PeerActive, PeerLease, identity
from eagle3_operator.metrics import OperatorMetrics


def run_operator(
    namespaces: Sequence[str],
    liveness: str | None,
    metrics_port: int | None,
    pipeline_image: str | None = None,
    resync_seconds: float | None = None,
    api_timeout_seconds: float | None = None,
) -> None:
    """Block running the operator; metrics on `metrics_port`, kopf's liveness probe on `liveness`; stage Jobs
    of runs that name no spec.images.pipeline run `pipeline_image`; every run reconciled (and the indexes
    re-listed) each `resync_seconds`; every API call answered within `api_timeout_seconds` or retried."""
    metrics = OperatorMetrics()
    if metrics_port:
        metrics.serve(metrics_port)
    memo = kopf.Memo(
        metrics=metrics,
        pipeline_image=pipeline_image,
        namespaces=list(namespaces),
        resync_seconds=resync_seconds,
        api_timeout_seconds=api_timeout_seconds,
    )
    options: dict[str, Any] = dict(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        liveness_endpoint=liveness,
        memo=memo,
    )
    # The Lease lives where the runs are: the first watched namespace, else the operator's own (cluster-wide).
    where = namespaces[0] if namespaces else None
    try:
        asyncio.run(run_alone(options, where))
    except PeerActive as err:
        raise SystemExit(f"eagle3 operator: refusing to start: {err}") from None
    except ApiError as err:
        raise SystemExit(
            f"eagle3 operator: cannot take the peer Lease ({err}); its service account needs get, create and "
            "patch on coordination.k8s.io leases (eagle3_operator/rbac.py, the chart's RBAC)"
        ) from None


async def run_alone(
    options: dict[str, Any], namespace: str | None = None, seconds: int = LEASE_SECONDS
) -> None:
    """kopf.operator(**options) while this process holds the peer Lease (eagle3_operator.lease) in
    `namespace` (default: the operator's own); PeerActive when a live peer holds it or takes it."""
    memo = options["memo"]
    owned = memo.get("kube") is None
    if owned:
        memo.kube = await Kube.connect(memo.get("api_timeout_seconds") or TOTAL_SECONDS)  # the handlers' too
    lease = PeerLease(memo.kube, namespace or current_namespace(), identity(), seconds)
    try:
        await lease.acquire()
        stop = options.get("stop_flag") or asyncio.Event()
        keeper = asyncio.create_task(lease.keep(stop))
        try:
            await kopf.operator(**(options | {"stop_flag": stop}))
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            await lease.release()
        if lease.lost:
            raise PeerActive(f"{lease.lost} took the {lease.where}; this operator stopped")
    finally:
        if owned:
            await memo.kube.close()

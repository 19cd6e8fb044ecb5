"""Starting the kopf operator: one process, standalone (one replica, Deployment strategy Recreate)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kopf
import yaml
from kubernetes_asyncio.config import ConfigException

import eagle3_operator.handlers  # noqa: F401  (registers the handlers)
from eagle3_contract.api.base import GROUP, PLURAL, VERSION
from eagle3_operator.k8s import TOTAL_SECONDS, ApiError, ApiUnreachable, Kube, current_namespace
from eagle3_operator.lease import LEASE_SECONDS, PeerActive, PeerLease, identity
from eagle3_operator.metrics import OperatorMetrics

logger = logging.getLogger(__name__)


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
    except StartupError as err:  # one line, a log record (JSON with --log-format json), not a traceback
        logger.error("eagle3 operator: %s", err)
        raise SystemExit(1) from None
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
    if owned:  # the handlers' client too; checked before kopf starts, which would retry a dead end forever
        memo.kube = await connect(memo.get("api_timeout_seconds") or TOTAL_SECONDS)
        try:
            await check_runs_served(memo.kube, namespace)
        except BaseException:
            await memo.kube.close()
            raise
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


class StartupError(Exception):
    """The operator cannot start: what is wrong, and what to do, in one line."""


def kubeconfig_files() -> list[str]:
    """The kubeconfig files a `kubectl` here would read: $KUBECONFIG's, else ~/.kube/config."""
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [str(Path("~/.kube/config").expanduser())]


async def connect(total_seconds: float) -> Kube:
    """Kube.connect, its failures a StartupError: in a pod its service account, else a kubeconfig file that
    exists, parses and names a current context."""
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    files = kubeconfig_files()
    if not in_cluster and not any(Path(f).is_file() for f in files):
        raise StartupError(
            f"no kubeconfig: {', '.join(files)} does not exist; set KUBECONFIG to a cluster's kubeconfig "
            "(the one kubectl uses), or run the operator in a pod (the chart)"
        )
    where = "the pod's service account" if in_cluster else f"kubeconfig {', '.join(files)}"
    try:
        return await Kube.connect(total_seconds)
    except ConfigException as exc:
        detail = str(exc)
        if "current-context" in detail:
            detail = "it names no current context; choose one with `kubectl config use-context NAME`"
        raise StartupError(f"{where} is not usable: {detail}") from None
    except (yaml.YAMLError, ValueError, OSError) as exc:
        detail = " ".join(str(exc).split())
        raise StartupError(
            f"{where} is not usable ({type(exc).__name__}: {detail}); fix or replace it"
        ) from None


async def check_runs_served(kube: Kube, namespace: str | None) -> None:
    """One list of Eagle3Runs (where the operator watches: `namespace`, else cluster-wide): a StartupError
    naming the cause when the server does not answer, refuses the credentials or serves no Eagle3Run CRD."""
    base = f"/apis/{GROUP}/{VERSION}"
    path = f"{base}/namespaces/{namespace}/{PLURAL}" if namespace else f"{base}/{PLURAL}"
    server = str(kube.api.configuration.host)
    try:
        await kube.list_uids(path)
    except ApiUnreachable as err:
        cause = err.cause
        why = (
            "no answer in time" if isinstance(cause, TimeoutError) else str(getattr(cause, "os_error", cause))
        )
        raise StartupError(
            f"the API server {server} does not answer ({why}); check the kubeconfig's server and the network "
            "(`kubectl cluster-info` should answer)"
        ) from None
    except ApiError as err:
        raise StartupError(_refusal(err.status, server, path)) from None


def _refusal(status: int, server: str, path: str) -> str:
    if status == 401:
        return (
            f"the API server {server} refused the credentials (HTTP 401 Unauthorized): the kubeconfig's "
            "token or certificate is wrong or expired; log in again (`kubectl get ns` should work)"
        )
    if status == 403:
        return (
            f"the API server {server} forbids listing {PLURAL}.{GROUP} (HTTP 403, GET {path}); grant the "
            "operator's RBAC (the chart's ClusterRole/Role, eagle3_operator/rbac.py)"
        )
    if status == 404:
        return (
            f"the Eagle3Run CRD is not installed: {server} serves no {PLURAL}.{GROUP}/{VERSION} (HTTP 404, "
            f"GET {path}); install it with `eagle3 crd | kubectl apply -f -` (or the chart), then start again"
        )
    return f"the API server {server} answered HTTP {status} to GET {path}; check the cluster and start again"

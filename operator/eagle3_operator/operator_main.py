"""Starting the kopf operator: one process; of several (the chart's replicas) one is active, the others stand
by (kopf's peering, eagle3_operator.peering, fenced by a Lease, eagle3_operator.lease)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import kopf

from eagle3_contract.api.base import GROUP, PLURAL, VERSION
from eagle3_contract.api.defaults import OperatorDefaults
from eagle3_contract.patch_guard import LibraryChanged
from eagle3_operator import handlers, kopf_pause  # handlers: importing it registers them with kopf
from eagle3_operator.credentials import NoCredentials
from eagle3_operator.k8s import PEERING_API, TOTAL_SECONDS, ApiError, ApiUnreachable, Kube
from eagle3_operator.lease import LEASE_NAME, Lease, lease_namespace, lease_seconds
from eagle3_operator.metrics import OperatorMetrics
from eagle3_operator.peering import (
    LIFETIME_SECONDS,
    PEERING_NAME,
    Peering,
    default_priority,
    identity,
    lifetime_seconds,
)
from eagle3_operator.state import state_of

logger = logging.getLogger(__name__)
# How long the operator waits, once a watch got HTTP 404, for the API server to serve Eagle3Runs again before
# it exits (a restarted kube-apiserver loads its CRDs within seconds), and its longest pause between checks.
SERVED_PATIENCE_SECONDS = 300.0
MAX_SERVED_DELAY_SECONDS = 5.0
# Restarts of the watches closer together than this back off (a kind that stays unserved), up to the maximum.
RESTART_RESET_SECONDS = 60.0
MAX_RESTART_DELAY_SECONDS = 30.0


def run_operator(
    namespaces: Sequence[str],
    liveness: str | None,
    metrics_port: int | None,
    defaults: OperatorDefaults | None = None,
    priority: int | None = None,
    resync_seconds: float | None = None,
    api_timeout_seconds: float | None = None,
    watch_seconds: int | None = None,
) -> None:
    """Block running the operator; metrics on `metrics_port`, kopf's liveness probe on `liveness`; runs get
    the `defaults` they leave unset (eagle3_contract.api.defaults: images, pull secrets, PodMonitor labels,
    the Prometheus URL of serving.canary);
    `priority` ranks this operator among its kopf peers (None: the default); every run reconciled (and the
    indexes re-listed) each `resync_seconds`; every API call answered within `api_timeout_seconds` or
    retried; a watch trusted for `watch_seconds` (None: the default; 0: kopf's own, unbounded)."""
    metrics = OperatorMetrics()
    if metrics_port:
        try:
            metrics.serve(metrics_port)
        except OSError as exc:  # one line, not a traceback: the port is taken, or not this user's to bind
            logger.error("eagle3 operator: cannot serve metrics on port %d (%s); free it or pass another "
                         "--metrics-port", metrics_port, exc.strerror or exc)  # fmt: skip
            raise SystemExit(1) from None
    memo = kopf.Memo(
        metrics=metrics,
        defaults=defaults or OperatorDefaults(),
        priority=priority,
        namespaces=list(namespaces),
        resync_seconds=resync_seconds,
        api_timeout_seconds=api_timeout_seconds,
        watch_seconds=watch_seconds,
    )
    options: dict[str, Any] = dict(
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        liveness_endpoint=liveness,
        memo=memo,
    )
    try:
        asyncio.run(run_with_peers(options, _lifetime()))
    except (StartupError, LibraryChanged) as err:  # a log record (JSON with --log-format json), no traceback
        logger.error("eagle3 operator: %s", err)
        raise SystemExit(1) from None


def _lifetime() -> int:
    try:
        return lifetime_seconds()
    except ValueError as err:
        raise StartupError(str(err)) from None


async def run_with_peers(options: dict[str, Any], lifetime: int = LIFETIME_SECONDS) -> None:
    """kopf.operator(**options), with kopf's peering where the cluster serves its CRDs (one operator active,
    the others standing by), else standalone."""
    handlers.EVENT_CONTEXT_GUARD.check()  # kopf's context variables, reused by the handlers' module
    memo = options["memo"]
    namespaces: list[str] = list(options.get("namespaces") or [])
    owned = memo.get("kube") is None
    if owned:  # the handlers' client too; checked before kopf starts, which would retry a dead end forever
        memo.kube = await connect(memo.get("api_timeout_seconds") or TOTAL_SECONDS)
    try:
        if owned:
            await check_runs_served(memo.kube, namespaces[0] if namespaces else None)
        await operate(options, namespaces, lifetime)
    finally:
        if owned:
            await memo.kube.close()


async def operate(options: dict[str, Any], namespaces: list[str], lifetime: int) -> None:
    """kopf.operator until it stops of itself (a signal), started again where a watch got HTTP 404 once the
    API server serves Eagle3Runs again: a restarted API server must not end the operator. Restarts that follow
    each other within RESTART_RESET_SECONDS wait longer each time, up to MAX_RESTART_DELAY_SECONDS."""
    memo, namespace = options["memo"], namespaces[0] if namespaces else None
    loop, delay = asyncio.get_running_loop(), 0.0
    while True:
        peered = await peering_options(memo, namespaces, options.get("settings"), lifetime)
        started = loop.time()
        try:
            return await kopf_pause.operator(options | peered, _follow(memo.get("peering")))
        except Exception as err:
            if not unserved(err):
                raise
        # kopf runs no cleanup handler after a watcher's failure: the old state's tasks end here
        if (state := state_of(memo)) is not None:
            await state.close()
        delay = (
            0.0
            if loop.time() - started > RESTART_RESET_SECONDS
            else min(2 * delay or 1.0, MAX_RESTART_DELAY_SECONDS)
        )
        logger.warning(
            "a watch got HTTP 404: the API server stopped serving a watched kind (one that has just "
            "restarted serves custom resources only once it has loaded their CRDs); the operator's watches "
            "start again once it serves %s.%s (waiting up to %.0f s)",
            PLURAL,
            GROUP,
            SERVED_PATIENCE_SECONDS,
        )
        await asyncio.sleep(delay)
        await wait_served(memo.kube, namespace, SERVED_PATIENCE_SECONDS)


def _follow(gate: Peering | None) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """What runs around kopf's tasks with its pause state: the gate follows it and holds the Lease (peered),
    or nothing (standalone: kopf never pauses)."""
    return gate.following if gate is not None else _alone


@contextlib.asynccontextmanager
async def _alone(_toggles: Any) -> AsyncIterator[None]:
    yield


def unserved(err: BaseException) -> bool:
    """Whether kopf stopped because a watch (or its first list) got HTTP 404. kopf takes a watcher's failure
    for fatal and leaves a restart to the pod's; kopf's own error wraps aiohttp's, whose status is public."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, aiohttp.ClientResponseError) and cause.status == 404:
            return True
        cause = cause.__cause__ or cause.__context__
    return False


async def wait_served(kube: Kube, namespace: str | None, patience: float) -> None:
    """Return once the API server lists Eagle3Runs again; a StartupError with the last refusal after
    `patience` seconds (the pod's restart takes over from there)."""
    deadline = asyncio.get_running_loop().time() + patience
    delay = 0.5
    while True:
        try:
            return await check_runs_served(kube, namespace)
        except StartupError:
            if asyncio.get_running_loop().time() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(2 * delay, MAX_SERVED_DELAY_SECONDS)


async def peering_options(
    memo: kopf.Memo, namespaces: Sequence[str], settings: kopf.OperatorSettings | None, lifetime: int
) -> dict[str, Any]:
    """kopf.operator's options for peering in the peering object `eagle3-operator` (created if missing), with
    memo.priority or the default (earlier-started operators rank higher); standalone, with a warning, where
    the cluster serves no peering CRD. Sets memo.peering (eagle3_operator.peering.Peering, or None)."""
    plural = "kopfpeerings" if namespaces else "clusterkopfpeerings"
    if not await memo.kube.serves(*PEERING_API, plural):
        logger.warning(
            "the cluster serves no %s.%s: this operator runs alone, with no standby, and a second one "
            "beside it would do everything twice; install crds/kopf-peering.yaml (the chart does) for high "
            "availability",
            plural,
            PEERING_API[0],
        )
        memo.peering = None
        return {"standalone": True}
    settings = settings or kopf.OperatorSettings()
    settings.peering.name, settings.peering.mandatory = PEERING_NAME, True
    settings.peering.standalone, settings.peering.lifetime = False, lifetime
    priority = memo.get("priority")
    settings.peering.priority = default_priority() if priority is None else int(priority)
    me = identity()
    try:
        duration = lease_seconds()
    except ValueError as err:
        raise StartupError(str(err)) from None
    lease = Lease(memo.kube, lease_namespace(namespaces), me, duration)
    gate = Peering(memo.kube, settings, me, namespaces, lease)
    try:
        await gate.ensure()
    except ApiError as err:
        raise StartupError(
            f"cannot create the peering object {PEERING_NAME} ({err}); the operator's service account needs "
            f"get, list, watch, create and patch on {plural}.{PEERING_API[0]} (eagle3_operator/rbac.py, the "
            "chart's RBAC)"
        ) from None
    try:
        await memo.kube.lease("get", lease.namespace, LEASE_NAME)
    except ApiError as err:
        raise StartupError(
            f"cannot read the {lease.where} ({err}); the operator's service account needs get, create and "
            "update on leases.coordination.k8s.io there (eagle3_operator/rbac.py, the chart's RBAC)"
        ) from None
    memo.peering = gate
    logger.info(
        "peering in %s %s as %s, priority %s: active unless a live peer ranks higher, once it holds the %s",
        plural,
        PEERING_NAME,
        gate.me,
        gate.priority,
        lease.where,
    )
    return {"settings": settings, "identity": gate.me}


class StartupError(Exception):
    """The operator cannot start: what is wrong, and what to do, in one line."""


async def connect(total_seconds: float) -> Kube:
    """Kube.connect_checked, its failures a StartupError: in a pod its service account, else a kubeconfig
    file that exists, parses and names a current context."""
    try:
        return await Kube.connect_checked(total_seconds)
    except NoCredentials as exc:
        advice = (
            "; set KUBECONFIG to a cluster's kubeconfig (the one kubectl uses), or run the operator in a pod "
            "(the chart)"
        )
        raise StartupError(f"{exc}{advice if exc.missing else ''}") from None


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

"""kopf wiring only: indexes of a run's children, and handlers that call the executor's `reconcile`."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import kopf

from eagle3_contract.api.base import GROUP, PLURAL, VERSION
from eagle3_operator import peering, stage_metrics
from eagle3_operator.builders import names
from eagle3_operator.k8s import CONNECT_SECONDS, TOTAL_SECONDS, Kube
from eagle3_operator.metrics import OperatorMetrics
from eagle3_operator.reconcile.executor import (
    CHILD_INDEXES,
    OWNED_INDEXES,
    Key,
    Owned,
    forget_run,
    reconcile,
    reconcile_current,
    run_key,
    serves_disruption_budgets,
    sweep_ghosts,
)
from eagle3_operator.reconcile.observe import blocked_by
from eagle3_operator.reconcile.slim import slim_deployment, slim_job, slim_pod, slim_run

RUN = (GROUP, VERSION, PLURAL)
MANAGED = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
RESYNC_SECONDS = 60.0
# The liveness probe fails when the resync has not moved on (finished a run's reconcile or a round) for this
# many intervals: every API call it makes is bounded (k8s.TOTAL_SECONDS), so a longer silence is a hang.
RESYNC_STALE_ROUNDS = 3
RELIST_SETTLE_SECONDS = 2.0
logger = logging.getLogger(__name__)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    # Everything kopf keeps lives in status: GitOps tools see no operator-written metadata on the run.
    settings.persistence.progress_storage = kopf.StatusProgressStorage()
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage()
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # kopf's own calls (its status bookkeeping, Events, watch connects) bounded like the operator's: a silent
    # connection is retried, not awaited for kopf's default of five minutes.
    api_seconds = float(memo.get("api_timeout_seconds") or TOTAL_SECONDS)
    settings.networking.request_timeout = api_seconds
    settings.networking.connect_timeout = min(CONNECT_SECONDS, api_seconds)
    settings.watching.connect_timeout = min(CONNECT_SECONDS, api_seconds)
    if memo.get("kube") is None:
        memo.kube = await Kube.connect(api_seconds)
        memo.owns_kube = True
    if memo.get("metrics") is None:
        memo.metrics = OperatorMetrics()
    memo.locks = {}
    memo.statuses = {}
    memo.pending = {}
    memo.gone = set()  # uids of runs and children found deleted (their stale index entries are skipped)
    memo.pod_monitors = await memo.kube.serves("monitoring.coreos.com", "v1", "podmonitors")
    memo.disruption_budgets = await serves_disruption_budgets(memo.kube)
    memo.contexts = {}  # a handler's context (_remember_context)
    memo.relisted = asyncio.Event()  # a watch listed its objects: sweep the indexes for ghosts soon
    memo.resync_beat = time.monotonic()
    memo.resync = asyncio.create_task(resync(memo, kwargs))
    memo.progress = {}  # run key -> live progress by JobView.progress_key (stage_metrics.py)
    if memo.get("progress_reader") is None:
        memo.progress_reader = stage_metrics.Reader.open()
    memo.progress_task = asyncio.create_task(
        stage_metrics.poll(
            memo,
            kwargs.get("eagle3_runs", {}),
            kwargs.get("stage_pods", {}),
            _reconciler(memo, kwargs),
            acting=lambda: peering.acting(memo),
        )
    )


def _reconciler(memo: kopf.Memo, kwargs: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], Awaitable[None]]:
    """Reconcile one run from outside kopf's handlers (the live progress task), as the resync does."""

    async def reconcile_run(run: Mapping[str, Any]) -> None:
        try:
            await _in_handler_context(memo, reconcile_current(run, memo, logger, _indices(kwargs)))
        except (kopf.TemporaryError, kopf.PermanentError) as err:
            logger.warning("reconcile after a stage's progress failed (the resync retries): %s", err)

    return reconcile_run


def _resync_seconds(memo: kopf.Memo) -> float:
    return float(memo.get("resync_seconds") or RESYNC_SECONDS)


async def resync(memo: kopf.Memo, kwargs: Mapping[str, Any]) -> None:
    """Reconcile every run periodically, so a missed child event only delays, never stalls, a run.

    A task of its own rather than a kopf timer: timers put a finalizer on every run, and a finalizer blocks
    `kubectl delete` for as long as the operator is down. It survives every exception (an outage, a bug in
    one run's reconcile): one failing run or round must not end the resync of all of them for good. A standby
    operator (eagle3_operator.peering) skips its rounds: kopf pauses only its own handlers.
    """
    while True:
        await _next_round(memo)
        try:
            if await peering.acting(memo):
                await _resync_round(memo, kwargs)
        except Exception:
            logger.exception("a resync round failed; the next one starts in %ss", _resync_seconds(memo))
        memo.resync_beat = time.monotonic()


async def _next_round(memo: kopf.Memo) -> None:
    """Wait one interval, or less when a watch (re-)listed its objects: after a re-list the indexes may
    hold objects deleted meanwhile, and the round's sweep finds them (RELIST_SETTLE_SECONDS lets the other
    watches' listings arrive first, so one round covers them all)."""
    try:
        await asyncio.wait_for(memo.relisted.wait(), _resync_seconds(memo))
        await asyncio.sleep(min(RELIST_SETTLE_SECONDS, _resync_seconds(memo)))
    except TimeoutError:
        pass
    memo.relisted.clear()


async def _in_handler_context(memo: kopf.Memo, call: Coroutine[Any, Any, None]) -> None:
    """Await a reconcile started outside kopf's handlers (the resync, the live progress task) in a copy of a
    handler's context, so the Events it causes are posted (_remember_context)."""
    context: contextvars.Context | None = memo.contexts.get("handler")
    await (asyncio.create_task(call, context=context.copy()) if context else call)


async def _resync_round(memo: kopf.Memo, kwargs: Mapping[str, Any]) -> None:
    runs: kopf.Index[Key, dict[str, Any]] = kwargs["eagle3_runs"]
    await sweep_ghosts(memo, {"eagle3_runs": runs} | _indices(kwargs), logger)
    for key in list(runs):
        for body in list(runs.get(key, [])):
            try:
                await _in_handler_context(memo, reconcile_current(body, memo, logger, _indices(kwargs)))
            except (kopf.TemporaryError, kopf.PermanentError) as err:
                logger.warning("resync of %s/%s failed: %s", key[0], key[1], err)
            except Exception:
                logger.exception("resync of %s/%s failed; going on with the next run", key[0], key[1])
            memo.resync_beat = time.monotonic()


@kopf.on.probe(id="resync")
def resync_alive(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Part of kopf's liveness endpoint: a resync task that died or went silent fails the probe (HTTP 500),
    so Kubernetes restarts the operator instead of leaving missed events unrepaired for good."""
    task: asyncio.Task[None] | None = memo.get("resync")
    if task is None:
        return {"running": False}  # before startup finished
    if task.done():
        why = "was cancelled" if task.cancelled() else f"ended: {task.exception()!r}"
        raise kopf.PermanentError(f"the periodic resync {why}; restart the operator")
    silent = time.monotonic() - float(memo.get("resync_beat") or 0.0)
    if silent > RESYNC_STALE_ROUNDS * _resync_seconds(memo):
        raise kopf.PermanentError(
            f"the periodic resync made no progress for {silent:.0f}s ({RESYNC_STALE_ROUNDS} intervals of "
            f"{_resync_seconds(memo):.0f}s); it is stuck: restart the operator"
        )
    return {"running": True, "secondsSinceProgress": round(silent, 1)}


@kopf.on.probe(id="peering")
def peering_role(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Part of kopf's health endpoint: this operator's identity, priority and role (active or standby).

    The endpoint is the readiness probe as well: an operator serves no traffic, so Ready means started and
    able to take over (a standby is ready too; readiness on "active" would keep a rolling update's new pod,
    which waits as standby, unready for ever)."""
    gate: peering.Peering | None = memo.get("peering")
    return {"role": "standalone"} if gate is None else gate.probe()


@kopf.on.login()
def login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """A connection handed over in memo (tests, benchmarks), else the service account or the kubeconfig."""
    connection: kopf.ConnectionInfo | None = memo.get("connection")
    if connection is not None:
        return connection
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    if memo.get("resync") is not None:
        memo.resync.cancel()
    if memo.get("progress_task") is not None:
        memo.progress_task.cancel()
    if memo.get("progress_reader") is not None:
        await memo.progress_reader.close()
    if memo.get("owns_kube"):
        await memo.kube.close()


@kopf.index(*RUN)
def eagle3_runs(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {run_key(namespace, names.run_label(name)): slim_run(body)}


@kopf.index("batch", "v1", "jobs", labels=MANAGED)
def stage_jobs(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {run_key(namespace, labels.get(names.LABEL_RUN)): slim_job(body)}


@kopf.index("v1", "pods", labels=MANAGED)
def stage_pods(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {run_key(namespace, labels.get(names.LABEL_RUN)): slim_pod(body)}


@kopf.index("apps", "v1", "deployments", labels=MANAGED)
def serving_deployments(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, Any]:
    return {run_key(namespace, labels.get(names.LABEL_RUN)): slim_deployment(body)}


def _owned(kind: str, namespace: str | None, body: kopf.Body) -> dict[Key, Owned]:
    meta = body.metadata
    owned = (kind, meta.name or "", meta.annotations.get(names.ANNOTATION_SPEC_HASH), meta.uid)
    return {run_key(namespace, meta.labels.get(names.LABEL_RUN)): owned}


@kopf.index("v1", "services", labels=MANAGED)
def owned_services(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Key, Owned]:
    return _owned("Service", namespace, body)


@kopf.index("v1", "configmaps", labels=MANAGED | {names.LABEL_STAGE: "spec"})
def owned_configmaps(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Key, Owned]:
    return _owned("ConfigMap", namespace, body)


@kopf.index("v1", "persistentvolumeclaims", labels=MANAGED)
def owned_claims(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Key, Owned]:
    return _owned("PersistentVolumeClaim", namespace, body)


# Watched only where the Prometheus operator is (its CRD is served).
@kopf.index("monitoring.coreos.com", "v1", "podmonitors", labels=MANAGED)
def owned_pod_monitors(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Key, Owned]:
    return _owned("PodMonitor", namespace, body)


# Watched only where the cluster serves policy/v1 (Kubernetes 1.21+).
@kopf.index("policy", "v1", "poddisruptionbudgets", labels=MANAGED)
def owned_disruption_budgets(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Key, Owned]:
    return _owned("PodDisruptionBudget", namespace, body)


def _indices(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: kwargs[k] for k in (*CHILD_INDEXES, *OWNED_INDEXES)}


def _remember_context(memo: kopf.Memo) -> None:
    """kopf.info/warn post through context variables kopf sets only in its handlers' tasks; the resync task
    (not one of them) reconciles inside a copy of a handler's context, so the Events it causes are posted.
    Kept in a dict made at startup: a handler's memo is its object's shallow copy of the operator's."""
    contexts: dict[str, contextvars.Context] | None = memo.get("contexts")
    if contexts is not None and "handler" not in contexts:
        contexts["handler"] = contextvars.copy_context()


@kopf.on.create(*RUN, id="reconcile-create")
@kopf.on.update(*RUN, id="reconcile-update")
@kopf.on.resume(*RUN, id="reconcile-resume")
async def run_changed(body: kopf.Body, memo: kopf.Memo, logger: Any, **kwargs: Any) -> None:
    _remember_context(memo)
    await reconcile(body, memo, logger, _indices(kwargs))


def _pod_news(status: kopf.Status, **_: Any) -> bool:
    """What the planner reads of a pod: a container ended, the pod is stuck, or it runs (no longer stuck)."""
    ended = any("terminated" in (cs.get("state") or {}) for cs in status.get("containerStatuses") or [])
    return ended or status.get("phase") == "Running" or blocked_by([{"status": status}]) is not None


def _deleted_or_listed(**kwargs: Any) -> bool:
    return kwargs.get("type") in ("DELETED", None)


@kopf.on.event("batch", "v1", "jobs", labels=MANAGED)
@kopf.on.event("v1", "pods", labels=MANAGED, when=_pod_news)
@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
async def child_changed(
    namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, logger: Any, **kwargs: Any
) -> None:
    """A child changed: reconcile its run now instead of waiting for the resync timer."""
    _remember_context(memo)
    if kwargs.get("type") is None:
        memo.relisted.set()  # kopf's (re-)listing of the watch: this is no change, but ghosts may be left
    runs: kopf.Index[Key, dict[str, Any]] = kwargs["eagle3_runs"]
    for run in list(runs.get(run_key(namespace, labels.get(names.LABEL_RUN)), [])):
        if (run.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            await reconcile_current(run, memo, logger, _indices(kwargs))
        except (kopf.TemporaryError, kopf.PermanentError) as err:
            logger.warning("reconcile after a child's change failed (the resync retries): %s", err)


@kopf.on.event(*RUN, when=_deleted_or_listed)
async def run_event(
    event: Mapping[str, Any], namespace: str | None, name: str, memo: kopf.Memo, **_: Any
) -> None:
    """A deleted run: forget its metrics, lock and cached status (owner references delete its children).
    A (re-)listed one: the sweep looks for runs deleted while the watch was away."""
    _remember_context(memo)
    if event.get("type") == "DELETED":
        # with its uid, a reconcile of it still under way ends without putting its status or series back
        uid = (event.get("object") or {}).get("metadata", {}).get("uid")
        forget_run(memo, namespace or "", name, uid)
    else:
        memo.relisted.set()

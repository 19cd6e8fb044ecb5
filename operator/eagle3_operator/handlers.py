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
from eagle3_operator.k8s import CONNECT_SECONDS
from eagle3_operator.reconcile.drift import observed_hash
from eagle3_operator.reconcile.executor import (
    CHILD_INDEXES,
    OWNED_INDEXES,
    Owned,
    forget_run,
    reconcile,
    reconcile_current,
    run_key,
    sweep_ghosts,
)
from eagle3_operator.reconcile.observe import blocked_by
from eagle3_operator.reconcile.slim import slim_deployment, slim_job, slim_pod, slim_run
from eagle3_operator.reconcile.state import Key
from eagle3_operator.state import MEMO_KEY, OperatorState, api_timeout_seconds, state_of

RUN = (GROUP, VERSION, PLURAL)
MANAGED = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
# The liveness probe fails when the resync has not moved on (finished a run's reconcile or a round) for this
# many intervals: every API call it makes is bounded (k8s.TOTAL_SECONDS), so a longer silence is a hang.
RESYNC_STALE_ROUNDS = 3
RELIST_SETTLE_SECONDS = 2.0
# How long one watch request lasts (the server ends it; kopf resumes from its resourceVersion), and the grace
# after it before the client gives a silent one up: a run created after a partition heals is seen within
# about their sum (issue 28 item 17), at the cost of one watch request per watched kind per WATCH_SECONDS.
WATCH_SECONDS = 8  # an integer: kopf sends it as the timeoutSeconds query parameter (--watch-seconds)
WATCH_GRACE_SECONDS = 2.0
logger = logging.getLogger(__name__)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    # Everything kopf keeps lives in status: GitOps tools see no operator-written metadata on the run.
    settings.persistence.progress_storage = kopf.StatusProgressStorage()
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage()
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # kopf's own calls (its status bookkeeping, Events, watch connects) bounded like the operator's: a silent
    # connection is retried, not awaited for kopf's default of five minutes.
    api_seconds = api_timeout_seconds(memo)
    settings.networking.request_timeout = api_seconds
    settings.networking.connect_timeout = min(CONNECT_SECONDS, api_seconds)
    settings.watching.connect_timeout = min(CONNECT_SECONDS, api_seconds)
    # A watch is trusted for WATCH_SECONDS: the server ends each watch request then and kopf resumes it from
    # its last resourceVersion (no re-list), and one that stays silent past that (a partition that drops
    # packets without a reset) is given up client-side soon after, not at kopf's 70 s inactivity timeout.
    watch_seconds = memo.get("watch_seconds")
    watch_seconds = WATCH_SECONDS if watch_seconds is None else int(watch_seconds)
    if watch_seconds > 0:  # 0: kopf's own (one request for as long as the server keeps it)
        settings.watching.server_timeout = watch_seconds
        settings.watching.client_timeout = watch_seconds + min(WATCH_GRACE_SECONDS, api_seconds)
    state = await OperatorState.start(memo)
    memo[MEMO_KEY] = state  # before the tasks start: kopf copies the memo for each object's handlers
    state.resync = asyncio.create_task(resync(state, kwargs))
    state.progress_task = asyncio.create_task(
        stage_metrics.poll(
            state.progress_reader,
            state.reconcile,
            state.progress_seconds,
            kwargs.get("eagle3_runs", {}),
            kwargs.get("stage_pods", {}),
            _reconciler(state, kwargs),
            acting=lambda: peering.acting(state.peering),
        )
    )


def _reconciler(
    state: OperatorState, kwargs: Mapping[str, Any]
) -> Callable[[Mapping[str, Any]], Awaitable[None]]:
    """Reconcile one run from outside kopf's handlers (the live progress task), as the resync does."""

    async def reconcile_run(run: Mapping[str, Any]) -> None:
        try:
            call = reconcile_current(run, state.reconcile, logger, _indices(kwargs))
            await _in_handler_context(state, call)
        except (kopf.TemporaryError, kopf.PermanentError) as err:
            logger.warning("reconcile after a stage's progress failed (the resync retries): %s", err)

    return reconcile_run


async def resync(state: OperatorState, kwargs: Mapping[str, Any]) -> None:
    """Reconcile every run periodically, so a missed child event only delays, never stalls, a run.

    A task of its own rather than a kopf timer: timers put a finalizer on every run, and a finalizer blocks
    `kubectl delete` for as long as the operator is down. It survives every exception (an outage, a bug in
    one run's reconcile): one failing run or round must not end the resync of all of them for good. A standby
    operator (eagle3_operator.peering) skips its rounds: kopf pauses only its own handlers.
    """
    while True:
        await _next_round(state)
        try:
            if await peering.acting(state.peering):
                await _resync_round(state, kwargs)
        except Exception:
            logger.exception("a resync round failed; the next one starts in %ss", state.resync_seconds)
        state.resync_beat = time.monotonic()


async def _next_round(state: OperatorState) -> None:
    """Wait one interval, or less when a watch (re-)listed its objects: after a re-list the indexes may
    hold objects deleted meanwhile, and the round's sweep finds them (RELIST_SETTLE_SECONDS lets the other
    watches' listings arrive first, so one round covers them all)."""
    try:
        await asyncio.wait_for(state.relisted.wait(), state.resync_seconds)
        await asyncio.sleep(min(RELIST_SETTLE_SECONDS, state.resync_seconds))
    except TimeoutError:
        pass
    state.relisted.clear()


async def _in_handler_context(state: OperatorState, call: Coroutine[Any, Any, None]) -> None:
    """Await a reconcile started outside kopf's handlers (the resync, the live progress task) in a copy of a
    handler's context, so the Events it causes are posted (_remember_context)."""
    context = state.contexts.get("handler")
    await (asyncio.create_task(call, context=context.copy()) if context else call)


async def _resync_round(state: OperatorState, kwargs: Mapping[str, Any]) -> None:
    """Every run the index holds, then those the re-list found that it never saw (a silent watch missed
    them: they are reconciled from the API server's copy, as every run is)."""
    runs: kopf.Index[Key, dict[str, Any]] = kwargs["eagle3_runs"]
    unseen = await sweep_ghosts(state.reconcile, {"eagle3_runs": runs} | _indices(kwargs), logger)
    bodies = [body for key in list(runs) for body in list(runs.get(key, []))]
    for body in unseen:
        meta = body["metadata"]
        logger.info(
            "run %s/%s is not in the watch's index yet; reconciling it from the re-list",
            meta["namespace"],
            meta["name"],
        )
    for body in bodies + unseen:
        meta = body["metadata"]
        try:
            call = reconcile_current(body, state.reconcile, logger, _indices(kwargs))
            await _in_handler_context(state, call)
        except (kopf.TemporaryError, kopf.PermanentError) as err:
            logger.warning("resync of %s/%s failed: %s", meta["namespace"], meta["name"], err)
        except Exception:
            logger.exception(
                "resync of %s/%s failed; going on with the next run", meta["namespace"], meta["name"]
            )
        state.resync_beat = time.monotonic()


@kopf.on.probe(id="resync")
def resync_alive(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Part of kopf's liveness endpoint: a resync task that died or went silent fails the probe (HTTP 500),
    so Kubernetes restarts the operator instead of leaving missed events unrepaired for good."""
    state = state_of(memo)
    if state is None or state.resync is None:
        return {"running": False}  # before startup finished
    task = state.resync
    if task.done():
        why = "was cancelled" if task.cancelled() else f"ended: {task.exception()!r}"
        raise kopf.PermanentError(f"the periodic resync {why}; restart the operator")
    silent = time.monotonic() - state.resync_beat
    if silent > RESYNC_STALE_ROUNDS * state.resync_seconds:
        raise kopf.PermanentError(
            f"the periodic resync made no progress for {silent:.0f}s ({RESYNC_STALE_ROUNDS} intervals of "
            f"{state.resync_seconds:.0f}s); it is stuck: restart the operator"
        )
    return {"running": True, "secondsSinceProgress": round(silent, 1)}


@kopf.on.probe(id="peering")
def peering_role(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Part of kopf's health endpoint: this operator's identity, priority and role (active or standby).

    The endpoint is the readiness probe as well: an operator serves no traffic, so Ready means started and
    able to take over (a standby is ready too; readiness on "active" would keep a rolling update's new pod,
    which waits as standby, unready for ever)."""
    state = state_of(memo)
    gate = state.peering if state is not None else memo.get("peering")
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
    state = state_of(memo)
    if state is not None:
        await state.close()


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
    spec_hash = observed_hash(body, names.ANNOTATION_SPEC_HASH, names.ANNOTATION_APPLIED)
    owned = (kind, meta.name or "", spec_hash, meta.uid)
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


def _remember_context(memo: kopf.Memo) -> OperatorState:
    """The operator's state, once the handler's context is kept in it: kopf.info/warn post through context
    variables kopf sets only in its handlers' tasks; the resync task (not one of them) reconciles inside a
    copy of a handler's context, so the Events it causes are posted."""
    state = state_of(memo)
    if state is None:
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    state.contexts.setdefault("handler", contextvars.copy_context())
    return state


@kopf.on.create(*RUN, id="reconcile-create")
@kopf.on.update(*RUN, id="reconcile-update")
@kopf.on.resume(*RUN, id="reconcile-resume")
async def run_changed(body: kopf.Body, memo: kopf.Memo, logger: Any, **kwargs: Any) -> None:
    state = _remember_context(memo)
    await reconcile(body, state.reconcile, logger, _indices(kwargs))


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
    state = _remember_context(memo)
    if kwargs.get("type") is None:
        state.relisted.set()  # kopf's (re-)listing of the watch: this is no change, but ghosts may be left
    runs: kopf.Index[Key, dict[str, Any]] = kwargs["eagle3_runs"]
    for run in list(runs.get(run_key(namespace, labels.get(names.LABEL_RUN)), [])):
        if (run.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            await reconcile_current(run, state.reconcile, logger, _indices(kwargs))
        except (kopf.TemporaryError, kopf.PermanentError) as err:
            logger.warning("reconcile after a child's change failed (the resync retries): %s", err)


@kopf.on.event(*RUN, when=_deleted_or_listed)
async def run_event(
    event: Mapping[str, Any], namespace: str | None, name: str, memo: kopf.Memo, **_: Any
) -> None:
    """A deleted run: forget its metrics, lock and cached status (owner references delete its children).
    A (re-)listed one: the sweep looks for runs deleted while the watch was away."""
    state = _remember_context(memo)
    if event.get("type") == "DELETED":
        # with its uid, a reconcile of it still under way ends without putting its status or series back
        uid = (event.get("object") or {}).get("metadata", {}).get("uid")
        forget_run(state.reconcile, namespace or "", name, uid)
    else:
        state.relisted.set()

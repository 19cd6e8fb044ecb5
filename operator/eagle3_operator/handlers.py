"""kopf wiring only: indexes of a run's children, and handlers that call the executor's `reconcile`."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any

import kopf

from eagle3_contract.api.base import GROUP, PLURAL, VERSION
from eagle3_contract.patch_guard import PatchGuard, Source
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
    run_key,
)
from eagle3_operator.reconcile.observe import blocked_by
from eagle3_operator.reconcile.slim import slim_deployment, slim_job, slim_pod, slim_run
from eagle3_operator.reconcile.state import Key
from eagle3_operator.reconcile.trigger import (
    child_news,
    reconcile_current,
    reconcile_indexed,
    run_news,
    sweep_ghosts,
)
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
# A reconcile that failed for a transient reason (kopf.TemporaryError) is retried after the error's delay,
# doubled for each failure in a row of the same run, up to this.
RETRY_SECONDS = 5.0
RETRY_MAX_SECONDS = 60.0
logger = logging.getLogger(__name__)
# kopf.info and kopf.warn post through context variables that kopf sets in the task of each object it handles,
# and kopf 1.45 has no public way to post from another task: the resync, the live progress reads and the
# retries reconcile in a copy of a handler's context (_remember_context). Checked before kopf starts
# (eagle3_operator.operator_main.run_with_peers).
EVENT_CONTEXT_GUARD = PatchGuard(
    patch=__name__,
    distribution="kopf",
    version="1.45.2",
    sources=(
        Source(
            "kopf._core.engines.posting:enqueue",
            "6cab650c765103eba4a0dbe06de8736db106b664581a138f6d6b415f42a98d61",
            "an Event goes to the queue and the loop in event_queue_var and event_queue_loop_var, read from "
            "the caller's context",
        ),
        Source(
            "kopf._core.engines.posting:info",
            "c896f2da42b664c1ae7a9a288c3da030aa5b0cba2163d1ce31ac2406847fabd6",
            "kopf.info reads the operator's settings from settings_var in the caller's context",
        ),
        Source(
            "kopf._core.engines.posting:warn",
            "9a6bafc3746e9fa3f135253ca1294411ca9ee9389a591df3ddf9062be5a054ca",
            "kopf.warn reads the operator's settings from settings_var in the caller's context",
        ),
        Source(
            "kopf._core.reactor.processing:process_resource_event",
            "98fd7bf864ff9528bb478077cfafcc7f455b0c216e1efdab810a9ba547ccc422",
            "each object's task sets event_queue_var and event_queue_loop_var for its life, before its "
            "handlers run: a copy of a handler's context holds them, and they stay valid",
        ),
    ),
    remove_when="kopf posts Events from tasks outside its handlers, or has a public way to",
)


class _EventHandlerSuccess(logging.Filter):
    """Drops kopf's "Handler 'child_changed' succeeded." (and run_event's): kopf logs every handler's success
    at INFO, which for the event handlers is a line per event of every child (27,000 lines in a 500-run
    round of the scale benchmark). What they do that matters is logged by the reconciles they start."""

    QUIET = frozenset(f"Handler {name!r} succeeded." for name in ("child_changed", "run_event"))

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.QUIET


EVENT_HANDLER_SUCCESS = _EventHandlerSuccess()


class NoDiffBase(kopf.StatusDiffBaseStorage):
    """A diff base that is never built. kopf builds one for every event of every watched object (a deep copy
    of the whole body, most of which it then deletes) for its create/update handlers; this operator has
    none (tests/unit/test_handlers.py keeps it so), and the copies were a tenth of its CPU at 500 runs."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    logging.getLogger("kopf.objects").addFilter(EVENT_HANDLER_SUCCESS)  # once: addFilter skips a repeat
    # The operator's handlers are event handlers and indexes: kopf keeps no progress or diff base for them,
    # and builds none (NoDiffBase). What kopf would keep lives in status, never in the run's metadata
    # (annotations, a finalizer), which GitOps tools would see as drift.
    settings.persistence.progress_storage = kopf.StatusProgressStorage()
    settings.persistence.diffbase_storage = NoDiffBase()
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
    state.indices = _all_indices(kwargs)
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


def _reconciler(state: OperatorState, kwargs: Mapping[str, Any]) -> Callable[[Key], Awaitable[None]]:
    """Reconcile one run from outside kopf's handlers (the live progress task), as the resync does."""

    async def reconcile_run(key: Key) -> None:
        call = reconcile_indexed(key, state.reconcile, logger, _all_indices(kwargs))
        await _in_handler_context(state, _reconcile_or_retry(state, key, call))

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
    """Every run the index holds, from the index (the watch cache), then those the re-list found that it
    never saw (a silent watch missed them: they are read from the API server first)."""
    runs: kopf.Index[Key, dict[str, Any]] = kwargs["eagle3_runs"]
    indices = _all_indices(kwargs)
    unseen = await sweep_ghosts(state.reconcile, indices, logger)
    for body in unseen:
        meta = body["metadata"]
        logger.info(
            "run %s/%s is not in the watch's index yet; reconciling it from the re-list",
            meta["namespace"],
            meta["name"],
        )
    rounds: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = [
        (f"{key[0]}/{key[1]}", functools.partial(reconcile_indexed, key, state.reconcile, logger, indices))
        for key in list(runs)
    ]
    rounds += [
        (
            f"{body['metadata']['namespace']}/{body['metadata']['name']}",
            functools.partial(reconcile_current, body, state.reconcile, logger, indices),
        )
        for body in unseen
    ]
    for what, call in rounds:
        if not await peering.acting(state.peering):
            logger.info("the resync round stops: kopf paused this operator (a peer took over)")
            return
        try:
            await _in_handler_context(state, call())
        except (kopf.TemporaryError, kopf.PermanentError) as err:
            logger.warning("resync of %s failed: %s", what, err)
        except Exception:
            logger.exception("resync of %s failed; going on with the next run", what)
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


# The indexes are async on purpose: kopf runs a synchronous handler in its thread pool, a round trip through
# the executor for every event of every watched object (a sixth of the operator's CPU at 500 runs).
@kopf.index(*RUN)
async def eagle3_runs(
    namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {run_key(namespace, names.run_label(name)): slim_run(body)}


@kopf.index("batch", "v1", "jobs", labels=MANAGED)
async def stage_jobs(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {run_key(namespace, labels.get(names.LABEL_RUN)): slim_job(body)}


@kopf.index("v1", "pods", labels=MANAGED)
async def stage_pods(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {run_key(namespace, labels.get(names.LABEL_RUN)): slim_pod(body)}


@kopf.index("apps", "v1", "deployments", labels=MANAGED)
async def serving_deployments(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, Any]:
    return {run_key(namespace, labels.get(names.LABEL_RUN)): slim_deployment(body)}


def _owned(kind: str, namespace: str | None, body: kopf.Body) -> dict[Key, Owned]:
    meta = body.metadata
    spec_hash = observed_hash(body, names.ANNOTATION_SPEC_HASH, names.ANNOTATION_APPLIED)
    owned = (kind, meta.name or "", spec_hash, meta.uid)
    return {run_key(namespace, meta.labels.get(names.LABEL_RUN)): owned}


@kopf.index("v1", "services", labels=MANAGED)
async def owned_services(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Key, Owned]:
    return _owned("Service", namespace, body)


@kopf.index("v1", "configmaps", labels=MANAGED)  # the spec's, and serving.capture's (stage serve)
async def owned_configmaps(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Key, Owned]:
    return _owned("ConfigMap", namespace, body)


@kopf.index("v1", "persistentvolumeclaims", labels=MANAGED)
async def owned_claims(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Key, Owned]:
    return _owned("PersistentVolumeClaim", namespace, body)


# Watched only where the Prometheus operator is (its CRD is served).
@kopf.index("monitoring.coreos.com", "v1", "podmonitors", labels=MANAGED)
async def owned_pod_monitors(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Key, Owned]:
    return _owned("PodMonitor", namespace, body)


# Watched only where the cluster serves policy/v1 (Kubernetes 1.21+).
@kopf.index("policy", "v1", "poddisruptionbudgets", labels=MANAGED)
async def owned_disruption_budgets(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Key, Owned]:
    return _owned("PodDisruptionBudget", namespace, body)


def _indices(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: kwargs[k] for k in (*CHILD_INDEXES, *OWNED_INDEXES)}


def _all_indices(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The runs' index and their children's."""
    return {"eagle3_runs": kwargs["eagle3_runs"]} | _indices(kwargs)


def _remember_context(memo: kopf.Memo) -> OperatorState:
    """The operator's state, once the handler's context is kept in it: kopf.info/warn post through context
    variables kopf sets only in its handlers' tasks; the resync task and the retries (not among them)
    reconcile inside a copy of a handler's context, so the Events they cause are posted
    (EVENT_CONTEXT_GUARD)."""
    state = state_of(memo)
    if state is None:
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    state.contexts.setdefault("handler", contextvars.copy_context())
    return state


async def _reconcile_or_retry(state: OperatorState, key: Key, call: Coroutine[Any, Any, None]) -> None:
    """Await a reconcile; a transient failure is retried from the watch cache after its delay, doubled for
    each failure in a row (at most RETRY_MAX_SECONDS), one retry at a time per run. An invalid spec is in the
    run's status (its SpecValid condition), and the log."""
    try:
        await call
    except kopf.TemporaryError as err:
        failures = state.failures[key] = state.failures.get(key, 0) + 1
        delay = min(float(err.delay or RETRY_SECONDS) * 2 ** (failures - 1), RETRY_MAX_SECONDS)
        logger.warning("reconcile of %s/%s failed; retried in %.0f s: %s", key[0], key[1], delay, err)
        if key not in state.retries:
            state.retries[key] = asyncio.create_task(_retry(state, key, delay))
        return
    except kopf.PermanentError as err:
        logger.warning("run %s/%s: %s", key[0], key[1], err)
    state.failures.pop(key, None)


async def _retry(state: OperatorState, key: Key, delay: float) -> None:
    await asyncio.sleep(delay)
    del state.retries[key]
    if state.indices is not None and await peering.acting(state.peering):
        call = reconcile_indexed(key, state.reconcile, logger, state.indices)
        await _in_handler_context(state, _reconcile_or_retry(state, key, call))


@kopf.on.event(*RUN)
async def run_event(
    event: Mapping[str, Any],
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: kopf.Memo,
    logger: Any,
    **kwargs: Any,
) -> None:
    """A run's own event: reconcile the run from the event's body when it is new to this process (created,
    listed, its spec edited: `run_news`); forget it when it is deleted (owner references delete its
    children). kopf's create, update and resume handlers would do the same at the cost of kopf's own
    bookkeeping: a diff base built for every event of every run, and a status patch of kopf's for each
    change; status.observedGeneration is this operator's record of what it reconciled."""
    state = _remember_context(memo)
    key = run_key(namespace, names.run_label(name))
    if event.get("type") == "DELETED":
        # with its uid, a reconcile of it still under way ends without putting its status or series back
        uid = (event.get("object") or {}).get("metadata", {}).get("uid")
        forget_run(state.reconcile, namespace or "", name, uid)
        state.reconcile.versions.pop(uid or "", None)
        return
    if event.get("type") is None:
        state.relisted.set()  # kopf's (re-)listing: the sweep looks for runs deleted while it was away
    if run_news(state.reconcile, key, event.get("type"), body):
        await _reconcile_or_retry(state, key, reconcile(body, state.reconcile, logger, _indices(kwargs)))


def _pod_news(status: kopf.Status, **_: Any) -> bool:
    """What the planner reads of a pod: a container ended, the pod is stuck, or it runs (no longer stuck)."""
    ended = any("terminated" in (cs.get("state") or {}) for cs in status.get("containerStatuses") or [])
    return ended or status.get("phase") == "Running" or blocked_by([{"status": status}]) is not None


@kopf.on.event("batch", "v1", "jobs", labels=MANAGED)
@kopf.on.event("v1", "pods", labels=MANAGED, when=_pod_news)
@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
async def child_changed(
    namespace: str | None,
    labels: kopf.Labels,
    body: kopf.Body,
    memo: kopf.Memo,
    logger: Any,
    **kwargs: Any,
) -> None:
    """A child changed: reconcile its run now (from the watch cache) instead of waiting for the resync."""
    state = _remember_context(memo)
    if kwargs.get("type") is None:
        state.relisted.set()  # kopf's (re-)listing of the watch: this is no change, but ghosts may be left
    key = run_key(namespace, labels.get(names.LABEL_RUN))
    if child_news(state.reconcile, key, kwargs.get("type"), body):
        call = reconcile_indexed(key, state.reconcile, logger, _all_indices(kwargs))
        await _reconcile_or_retry(state, key, call)

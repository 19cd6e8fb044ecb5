"""The executor: observe a run's children, plan, carry out the plan, write status once, announce.

kopf's handlers (handlers.py) call `reconcile` with the run's body and kopf's indexes; everything a reconcile
does beyond the pure planner lives here: what this process created that the watch has not delivered yet, the
API writes in order, the status patch, and the Events on the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from eagle3_contract.api.defaults import with_operator_defaults
from eagle3_contract.api.validation import InvalidSpecError
from eagle3_contract.reasons import REJECTED
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.k8s import ApiError, ApiUnreachable, Kube
from eagle3_operator.reconcile.actions import Action
from eagle3_operator.reconcile.announce import announce
from eagle3_operator.reconcile.canary_figures import with_canary_figures
from eagle3_operator.reconcile.observe import (
    Observed,
    blocked_by,
    canary_deployment,
    observe_job,
    serving_pods,
    split_deployments,
    workloads_blocked_by,
)
from eagle3_operator.reconcile.planner import Plan, plan_invalid, plan_run
from eagle3_operator.reconcile.relist import entry_uid
from eagle3_operator.reconcile.run_report import run_report
from eagle3_operator.reconcile.slim import slim_pod
from eagle3_operator.reconcile.state import Key, ReconcileState
from eagle3_operator.reconcile.status_patch import merge_patch

logger = logging.getLogger(__name__)
PENDING_SECONDS = 30.0
Owned = tuple[str, str, str | None, str | None]  # kind, name, eagle3.dev/spec-hash, uid
# kopf's indexes of a run's children, by the handler that fills them (handlers.py)
CHILD_INDEXES = ("stage_jobs", "stage_pods", "serving_deployments")
OWNED_INDEXES = (
    "owned_services",
    "owned_configmaps",
    "owned_claims",
    "owned_pod_monitors",
    "owned_disruption_budgets",
)


def run_key(namespace: str | None, run_label: str | None) -> Key:
    """The key of a run in every index: its namespace and its `eagle3.dev/run` label."""
    return (namespace or "", run_label or "")


def recently_created(
    state: ReconcileState, key: Key, indexed: set[tuple[str, str]]
) -> dict[tuple[str, str], Any]:
    """Objects this process created that the watch has not delivered yet (forgotten once seen, or after
    PENDING_SECONDS): without them a second reconcile right after the first would create them again."""
    pending: dict[tuple[str, str], tuple[float, dict[str, Any]]] = state.pending.setdefault(key, {})
    horizon = time.monotonic() - PENDING_SECONDS
    for obj in [o for o, (at, _) in pending.items() if o in indexed or at < horizon]:
        del pending[obj]
    return {obj: body for obj, (_, body) in pending.items()}


def observe(
    key: Key,
    state: ReconcileState,
    indices: Mapping[str, Any],
    listed: Mapping[str, list[dict[str, Any]]] | None = None,
) -> Observed:
    """The run's children as the indexes (and this process's own recent creates) know them, without the
    index entries of objects found deleted (relist.py); `listed`: the pods the API server listed for the
    Jobs named (the planner's `unconfirmed`), which those Jobs are observed with."""
    gone: set[str] = state.gone

    def live(index: str) -> list[Any]:
        return [v for v in indices[index].get(key, []) if entry_uid(v) not in gone]

    pods, jobs, deployments = live("stage_pods"), live("stage_jobs"), live("serving_deployments")
    owned: list[Owned] = [obj for index in OWNED_INDEXES for obj in live(index)]
    objects = {(kind, name) for kind, name, _, _ in owned}
    hashes = {(kind, name): spec_hash for kind, name, spec_hash, _ in owned if spec_hash}
    indexed = objects | {("Job", j["metadata"]["name"]) for j in jobs}
    indexed |= {("Deployment", d["metadata"]["name"]) for d in deployments}
    for (kind, name), body in recently_created(state, key, indexed).items():
        if kind == "Job":
            jobs.append(body)
        elif kind == "Deployment":
            deployments.append(body)
        else:
            objects.add((kind, name))
            if spec_hash := body["metadata"].get("annotations", {}).get(names.ANNOTATION_SPEC_HASH):
                hashes[(kind, name)] = spec_hash
    serving, workloads = split_deployments(deployments)
    listed = listed or {}
    return Observed(
        jobs=tuple(
            observe_job(job, pods + listed[name], listed=True)
            if (name := job["metadata"]["name"]) in listed
            else observe_job(job, pods)
            for job in jobs
        ),
        deployment=serving,
        canary=canary_deployment(deployments),
        objects=frozenset(objects),
        spec_hashes=hashes,
        serving_blocked_by=blocked_by(serving_pods(pods)),
        pod_monitors_served=state.pod_monitors,
        disruption_budgets_served=state.disruption_budgets,
        workloads=workloads,
        workload_blocked_by=workloads_blocked_by(pods),
        progress=dict(state.progress.get(key) or {}),
        features=state.features,
    )


async def serves_disruption_budgets(kube: Kube) -> bool:
    """Whether the cluster serves policy/v1 PodDisruptionBudgets (Kubernetes 1.21+); where not, the runs'
    vLLM pods get none, said once here."""
    served = await kube.serves("policy", "v1", "poddisruptionbudgets")
    if not served:
        logger.info("the cluster does not serve policy/v1 PodDisruptionBudgets: vLLM pods get none")
    return served


class RunGone(Exception):
    """The run is not on the API server any more (HTTP 404): deleted while this process missed or raced it."""


def forget_run(state: ReconcileState, namespace: str, name: str, uid: str | None = None) -> None:
    """Drop everything this process keeps about a run that is gone: cached status, pending creates, lock and
    metric series; `uid` (when known) is remembered so a stale index entry of it is never acted on again."""
    key = run_key(namespace, names.run_label(name))
    state.statuses.pop(key, None)
    state.unsure.discard(key)
    state.pending.pop(key, None)
    state.locks.pop(key, None)
    state.progress.pop(key, None)
    state.metrics.forget_run(namespace, name)
    if uid:
        state.gone.add(uid)


def kopf_error(state: ReconcileState, err: ApiError) -> kopf.TemporaryError | kopf.PermanentError:
    """A failed API call as kopf's retry (transient: the server's 5xx, 409, 429, a timeout) or give-up."""
    state.metrics.reconciles.labels("error").inc()
    if err.transient:
        return kopf.TemporaryError(str(err), delay=5)
    return kopf.PermanentError(str(err))


async def _run_exists(state: ReconcileState, ref: RunRef) -> bool:
    """Whether the run is still there (a create's 404 is its namespace gone, or a kind not served)."""
    try:
        current = await state.kube.get_run(ref.namespace, ref.name)
    except ApiError as err:
        if err.not_found:
            return False
        raise
    return bool(current["metadata"].get("uid") == ref.uid)


# The most of the server's words a Rejected condition quotes (a Status of many causes can be long).
REJECTED_MESSAGE_MAX = 4000


def rejection(action: Action, err: ApiError) -> str:
    """What a Rejected condition says: the object, the fields the server named (its Status's causes) and the
    server's own message."""
    kind, name = action.body["kind"], action.body["metadata"]["name"]
    fields = err.fields()
    at = f" (the field{'s' if len(fields) > 1 else ''} {', '.join(fields)})" if fields else ""
    said = err.server_message()
    if len(said) > REJECTED_MESSAGE_MAX:
        said = said[:REJECTED_MESSAGE_MAX] + " ..."
    return f"the API server refused to {action.verb} {kind} {name}{at}: {said}"


def plan_rejected(plan: Plan, action: Action, err: ApiError, now: str) -> Plan:
    """The plan once the API server refused one of its objects (HTTP 422): the run is Invalid and its
    SpecValid condition, reason Rejected, names the object, the fields and the server's words. The rest of
    the status stays as last written (what the plan meant to record was not all done)."""
    error = InvalidSpecError([rejection(action, err)])
    return plan_invalid(plan.status.observed_generation, error, plan.previous, now, reason=REJECTED)


async def _apply(
    state: ReconcileState, ref: RunRef, key: Key, plan: Plan, now: str, logger: Any
) -> Plan | None:
    """Carry out the plan's writes in order; the first one the server refuses as invalid (HTTP 422) ends
    them and is returned as a Rejected plan (sending it again would be refused again), None when all went."""
    for action in plan.actions:
        try:
            done = await state.kube.apply(action.verb, action.body)
        except ApiError as err:
            if err.status == 404 and action.verb == "create" and not await _run_exists(state, ref):
                raise RunGone(str(err)) from err
            if err.invalid:
                logger.warning("%s", err)
                return plan_rejected(plan, action, err, now)
            raise
        kind, name = action.body["kind"], action.body["metadata"]["name"]
        if action.verb == "create":
            state.pending.setdefault(key, {})[(kind, name)] = (time.monotonic(), action.body)
        if done:
            logger.info("%s %s %s", action.verb, kind, name)
    return None


async def carry_out(
    state: ReconcileState, ref: RunRef, key: Key, known: dict[str, Any], plan: Plan, now: str, logger: Any
) -> Plan:
    """Apply the plan's writes in order, then patch status with what changed since the last write; returns
    the plan carried out: `plan`, or where the API server refused an object as invalid (HTTP 422) the
    Rejected plan whose status was written instead (plan_rejected). A create or the status patch answered
    404 means the run (or its namespace) is gone, `RunGone`, once a read of the run confirms it."""
    try:
        plan = await _apply(state, ref, key, plan, now, logger) or plan
        patch = merge_patch(known, plan.status.document(), ignore=("kopf",))
        if patch:
            try:
                await state.kube.patch_run_status(ref.namespace, ref.name, patch)
            except ApiUnreachable:
                # no answer: the patch may have landed. The status cached here is then older than the
                # server's, and the next reconcile must start from the server's (a stage it shows Failed
                # whose Job is deleted gets its next attempt, not its first again).
                state.statuses.pop(key, None)
                state.unsure.add(key)
                raise
            except ApiError as err:
                if err.status != 404:
                    raise
                if not await _run_exists(state, ref):
                    raise RunGone(str(err)) from err
                # the run is there: a restarted API server answered before it had loaded the CRD
                state.metrics.reconciles.labels("error").inc()
                raise kopf.TemporaryError(f"{err}; the run is there: retried", delay=5) from err
    except ApiError as err:
        raise kopf_error(state, err) from err
    return plan


async def _known_status(
    state: ReconcileState, key: Key, ref: RunRef, body: Mapping[str, Any]
) -> dict[str, Any]:
    """The status this process last wrote for this very run (same uid), else the body's. A run deleted and
    created again under the same name while the deletion was missed starts from its own status, and the
    previous one's pending creates are dropped. After a status patch that got no answer (it may or may not
    have landed), the server's status as it is now: the body may be a copy older than that patch."""
    cached: tuple[str, dict[str, Any]] | None = state.statuses.get(key)
    if cached is not None and cached[0] == ref.uid:
        return cached[1]
    if cached is not None:
        state.pending.pop(key, None)
    unsure: set[Key] = state.unsure
    if key in unsure:
        try:
            body = await state.kube.get_run(ref.namespace, ref.name)
        except ApiError as err:
            if err.not_found:
                raise RunGone(str(err)) from err
            raise kopf_error(state, err) from err
        if body["metadata"].get("uid") != ref.uid:
            raise RunGone(f"run {ref.namespace}/{ref.name} was deleted and created again (a new uid)")
        unsure.discard(key)
    status: dict[str, Any] = body.get("status") or {}
    return status


async def _plan(
    state: ReconcileState,
    ref: RunRef,
    key: Key,
    body: Mapping[str, Any],
    known: Mapping[str, Any],
    indices: Mapping[str, Any],
    now: str,
) -> tuple[Plan, Observed]:
    """Observe and plan. Where the plan would run a completed stage again because the watch shows no pod of
    its Job (`Plan.unconfirmed`), the run's pods are listed from the API server and the run planned again
    with them: the pod watch may lag behind the Job watch, and only the server can say the pod is gone."""
    spec = with_operator_defaults(body.get("spec"), state.defaults)
    generation = body["metadata"].get("generation")
    observed = await with_canary_figures(observe(key, state, indices), ref, spec, known, now)
    floor = state.defaults.pod_security_minimum_level
    plan = plan_run(ref, generation, spec, dict(known), observed, now, floor)
    if plan.unconfirmed:
        listed = await _listed_pods(state, ref, plan.unconfirmed)
        observed = dataclasses.replace(observed, jobs=observe(key, state, indices, listed).jobs)
        plan = plan_run(ref, generation, spec, dict(known), observed, now, floor)
    return plan, observed


async def _listed_pods(state: ReconcileState, ref: RunRef, jobs: tuple[str, ...]) -> dict[str, list[Any]]:
    """The run's stage pods as the API server lists them, for each of `jobs` (observe_job matches them)."""
    run = names.run_label(ref.name)
    try:
        found = await state.kube.list_objects(
            f"/api/v1/namespaces/{ref.namespace}/pods", f"{names.LABEL_RUN}={run}"
        )
    except ApiError as err:
        raise kopf_error(state, err) from err
    # the selector again here: a server (or a mock) that ignores it returns every pod of the namespace
    pods = [slim_pod(p) for p in found if (p["metadata"].get("labels") or {}).get(names.LABEL_RUN) == run]
    return {job: pods for job in jobs}


async def _confirm(state: ReconcileState, ref: RunRef) -> dict[str, Any]:
    """The run as the API server has it, read before children are written from the watch cache's copy:
    `RunGone` where it was deleted (or deleted and created again under its name: a new uid)."""
    try:
        current = await state.kube.get_run(ref.namespace, ref.name)
    except ApiError as err:
        if err.not_found:  # NotServed is not: a restarted API server says nothing of the run
            raise RunGone(str(err)) from err
        raise kopf_error(state, err) from err
    if ref.uid and current["metadata"].get("uid") != ref.uid:
        raise RunGone(f"run {ref.namespace}/{ref.name} was deleted and created again (a new uid)")
    return current


async def reconcile(
    body: Mapping[str, Any],
    state: ReconcileState,
    logger: Any,
    indices: Mapping[str, Any],
    confirmed: bool = True,
) -> None:
    """Plan one run from its observed children, carry out the plan, write status once if it changed.

    `confirmed`: `body` is the API server's word (a run's own event, a read); False for the watch cache's
    copy (the `eagle3_runs` index), which may be a run deleted while a watch was away or an older spec:
    the run is then read from the server before any child is written (`_confirm`)."""
    meta = body["metadata"]
    key = run_key(meta["namespace"], names.run_label(meta["name"]))
    async with state.locks.setdefault(key, asyncio.Lock()):
        await reconcile_locked(body, state, logger, indices, confirmed)


async def reconcile_locked(
    body: Mapping[str, Any],
    state: ReconcileState,
    logger: Any,
    indices: Mapping[str, Any],
    confirmed: bool,
) -> None:
    """`reconcile`, its caller holding the run's lock."""
    meta = body["metadata"]
    ref = RunRef(meta["name"], meta["namespace"], meta.get("uid", ""))
    key = run_key(ref.namespace, names.run_label(ref.name))
    started = time.perf_counter()
    try:
        known = await _known_status(state, key, ref, body)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        plan, observed = await _plan(state, ref, key, body, known, indices, now)
        if plan.actions and not confirmed:
            current = await _confirm(state, ref)
            if current["metadata"].get("deletionTimestamp"):
                return  # being deleted: its children go with it
            if current["metadata"].get("generation") != meta.get("generation"):
                body, meta = current, current["metadata"]  # the watch has not delivered the newer spec yet
                plan, observed = await _plan(state, ref, key, body, known, indices, now)
        plan = await carry_out(state, ref, key, known, plan, now, logger)
    except RunGone as gone:
        logger.info("run %s/%s is gone; forgetting it: %s", ref.namespace, ref.name, gone)
        forget_run(state, ref.namespace, ref.name, ref.uid)
        return
    if ref.uid and ref.uid in state.gone:
        return  # forgotten while this reconcile awaited the API server (the re-list's sweep): keep it so
    state.statuses[key] = (ref.uid, plan.status.document())
    announce(body, plan)
    state.metrics.observe(run_report(ref, plan, observed.jobs, time.time()))
    state.metrics.reconciles.labels("ok").inc()  # last: a scrape that sees it sees the run's series
    state.metrics.latency.observe(time.perf_counter() - started)
    if plan.problems:
        raise kopf.PermanentError("invalid spec: " + "; ".join(plan.problems))

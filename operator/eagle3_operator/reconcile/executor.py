"""The executor: observe a run's children, plan, carry out the plan, write status once, announce.

kopf's handlers (handlers.py) call `reconcile` with the run's body and kopf's indexes; everything a reconcile
does beyond the pure planner lives here: what this process created that the watch has not delivered yet, the
API writes in order, the status patch, and the Events on the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from eagle3_contract.api.status import RunPhase
from eagle3_contract.api.validation import with_pipeline_image
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.k8s import ApiError
from eagle3_operator.reconcile.observe import (
    Observed,
    blocked_by,
    observe_deployment,
    observe_job,
    serving_pods,
)
from eagle3_operator.reconcile.planner import Plan, plan_run
from eagle3_operator.reconcile.run_report import blocked_pods, run_report
from eagle3_operator.reconcile.status_patch import merge_patch

PENDING_SECONDS = 30.0
Key = tuple[str, str]
Owned = tuple[str, str, str | None]  # kind, name, eagle3.dev/spec-hash
# kopf's indexes of a run's children, by the handler that fills them (handlers.py)
CHILD_INDEXES = ("stage_jobs", "stage_pods", "serving_deployments")
OWNED_INDEXES = ("owned_services", "owned_configmaps", "owned_claims", "owned_pod_monitors")


def run_key(namespace: str | None, run_label: str | None) -> Key:
    """The key of a run in every index: its namespace and its `eagle3.dev/run` label."""
    return (namespace or "", run_label or "")


def recently_created(memo: kopf.Memo, key: Key, indexed: set[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """Objects this process created that the watch has not delivered yet (forgotten once seen, or after
    PENDING_SECONDS): without them a second reconcile right after the first would create them again."""
    pending: dict[tuple[str, str], tuple[float, dict[str, Any]]] = memo.pending.setdefault(key, {})
    horizon = time.monotonic() - PENDING_SECONDS
    for obj in [o for o, (at, _) in pending.items() if o in indexed or at < horizon]:
        del pending[obj]
    return {obj: body for obj, (_, body) in pending.items()}


def observe(key: Key, memo: kopf.Memo, indices: Mapping[str, Any]) -> Observed:
    """The run's children as the indexes (and this process's own recent creates) know them."""
    pods = list(indices["stage_pods"].get(key, []))
    jobs = list(indices["stage_jobs"].get(key, []))
    deployments = list(indices["serving_deployments"].get(key, []))
    owned: list[Owned] = [obj for index in OWNED_INDEXES for obj in indices[index].get(key, [])]
    objects = {(kind, name) for kind, name, _ in owned}
    hashes = {(kind, name): spec_hash for kind, name, spec_hash in owned if spec_hash}
    indexed = objects | {("Job", j["metadata"]["name"]) for j in jobs}
    indexed |= {("Deployment", d["metadata"]["name"]) for d in deployments}
    for (kind, name), body in recently_created(memo, key, indexed).items():
        if kind == "Job":
            jobs.append(body)
        elif kind == "Deployment":
            deployments.append(body)
        else:
            objects.add((kind, name))
            if spec_hash := body["metadata"].get("annotations", {}).get(names.ANNOTATION_SPEC_HASH):
                hashes[(kind, name)] = spec_hash
    return Observed(
        jobs=tuple(observe_job(job, pods) for job in jobs),
        deployment=observe_deployment(deployments[0]) if deployments else None,
        objects=frozenset(objects),
        spec_hashes=hashes,
        serving_blocked_by=blocked_by(serving_pods(pods)),
        pod_monitors_served=bool(memo.pod_monitors),
    )


async def carry_out(
    memo: kopf.Memo, ref: RunRef, key: Key, known: dict[str, Any], plan: Plan, logger: Any
) -> None:
    """Apply the plan's writes in order, then patch status with what changed since the last write."""
    try:
        for action in plan.actions:
            done = await memo.kube.apply(action.verb, action.body)
            kind, name = action.body["kind"], action.body["metadata"]["name"]
            if action.verb == "create":
                memo.pending.setdefault(key, {})[(kind, name)] = (time.monotonic(), action.body)
            if done:
                logger.info("%s %s %s", action.verb, kind, name)
        patch = merge_patch(known, plan.status, ignore=("kopf",))
        if patch:
            await memo.kube.patch_run_status(ref.namespace, ref.name, patch)
    except ApiError as err:
        memo.metrics.reconciles.labels("error").inc()
        if err.transient:
            raise kopf.TemporaryError(str(err), delay=5) from err
        raise kopf.PermanentError(str(err)) from err


def announce(body: Mapping[str, Any], known: Mapping[str, Any], plan: Plan) -> None:
    """Kubernetes Events on the run (`kubectl describe e3r` shows the history): its phase changed, or a pod
    of it stopped running for a new reason."""
    target = kopf.Body(cast(kopf.RawBody, dict(body)))
    before = blocked_pods(known)
    for stage, why in blocked_pods(plan.status).items():
        if (before.get(stage) or {}).get("reason") != why["reason"]:
            kopf.warn(target, reason="PodNotRunning", message=f"stage {stage}: {why.get('message')}"[:1000])
    if known.get("phase") == plan.phase.value:
        return
    failed = next((c for c in plan.status.get("conditions", []) if c["type"] == "Failed"), None)
    detail = (
        failed["message"] if failed and failed["status"] == "True" else plan.status.get("currentStage") or ""
    )
    if plan.phase in (RunPhase.FAILED, RunPhase.INVALID):
        kopf.warn(target, reason=plan.phase.value, message=str(detail)[:1000])
    else:
        kopf.info(target, reason=plan.phase.value, message=f"stage {detail}" if detail else "")


async def reconcile(
    body: Mapping[str, Any], memo: kopf.Memo, logger: Any, indices: Mapping[str, Any]
) -> None:
    """Plan one run from its observed children, carry out the plan, write status once if it changed."""
    meta = body["metadata"]
    ref = RunRef(meta["name"], meta["namespace"], meta.get("uid", ""))
    key = run_key(ref.namespace, names.run_label(ref.name))
    async with memo.locks.setdefault(key, asyncio.Lock()):
        started = time.perf_counter()
        known: dict[str, Any] = memo.statuses.get(key) or body.get("status") or {}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        observed = observe(key, memo, indices)
        spec = with_pipeline_image(body.get("spec"), memo.get("pipeline_image"))
        plan = plan_run(ref, meta.get("generation"), spec, known, observed, now)
        await carry_out(memo, ref, key, known, plan, logger)
        memo.statuses[key] = plan.status
        announce(body, known, plan)
        memo.metrics.observe(run_report(ref, plan, observed.jobs, time.time()))
        memo.metrics.reconciles.labels("ok").inc()  # last: a scrape that sees it sees the run's series
        memo.metrics.latency.observe(time.perf_counter() - started)
    if plan.problems:
        raise kopf.PermanentError("invalid spec: " + "; ".join(plan.problems))

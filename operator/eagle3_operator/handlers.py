"""kopf handlers, a few lines each: indexes observe children; `reconcile` plans, applies, writes status."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from eagle3_operator.api.base import GROUP, PLURAL, VERSION
from eagle3_operator.api.status import RunPhase
from eagle3_operator.api.validation import with_pipeline_image
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.k8s import ApiError, Kube
from eagle3_operator.metrics import OperatorMetrics
from eagle3_operator.reconcile.observe import (
    Observed,
    blocked_by,
    observe_deployment,
    observe_job,
    serving_pods,
    slim_deployment,
    slim_job,
    slim_pod,
    slim_run,
)
from eagle3_operator.reconcile.planner import Plan, plan_run
from eagle3_operator.reconcile.status_patch import merge_patch
from eagle3_operator.run_metrics import blocked_pods, run_report

RUN = (GROUP, VERSION, PLURAL)
MANAGED = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
RESYNC_SECONDS = 60.0
PENDING_SECONDS = 30.0
Key = tuple[str, str]


def _key(namespace: str | None, run_label: str | None) -> Key:
    return (namespace or "", run_label or "")


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    # Everything kopf keeps lives in status: GitOps tools see no operator-written metadata on the run.
    settings.persistence.progress_storage = kopf.StatusProgressStorage()
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage()
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    if memo.get("kube") is None:
        memo.kube = await Kube.connect()
        memo.owns_kube = True
    if memo.get("metrics") is None:
        memo.metrics = OperatorMetrics()
    memo.locks = {}
    memo.statuses = {}
    memo.pending = {}
    memo.pod_monitors = await memo.kube.serves("monitoring.coreos.com", "v1", "podmonitors")
    memo.resync = asyncio.create_task(resync(memo, kwargs))


async def resync(memo: kopf.Memo, kwargs: Mapping[str, Any]) -> None:
    """Reconcile every run periodically, so a missed child event only delays, never stalls, a run.

    A task of its own rather than a kopf timer: timers put a finalizer on every run, and a finalizer blocks
    `kubectl delete` for as long as the operator is down.
    """
    logger = logging.getLogger(__name__)
    while True:
        await asyncio.sleep(memo.get("resync_seconds") or RESYNC_SECONDS)
        runs: kopf.Index[Key, dict[str, Any]] = kwargs["eagle3_runs"]
        for key in list(runs):
            for body in list(runs.get(key, [])):
                try:
                    await reconcile(body, memo, logger, _indices(kwargs))
                except (kopf.TemporaryError, kopf.PermanentError) as err:
                    logger.warning("resync of %s/%s failed: %s", key[0], key[1], err)


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
    if memo.get("owns_kube"):
        await memo.kube.close()


@kopf.index(*RUN)
def eagle3_runs(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {_key(namespace, names.run_label(name)): slim_run(body)}


@kopf.index("batch", "v1", "jobs", labels=MANAGED)
def stage_jobs(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {_key(namespace, labels.get(names.LABEL_RUN)): slim_job(body)}


@kopf.index("v1", "pods", labels=MANAGED)
def stage_pods(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {_key(namespace, labels.get(names.LABEL_RUN)): slim_pod(body)}


@kopf.index("apps", "v1", "deployments", labels=MANAGED)
def serving_deployments(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, Any]:
    return {_key(namespace, labels.get(names.LABEL_RUN)): slim_deployment(body)}


Owned = tuple[str, str, str | None]  # kind, name, eagle3.dev/spec-hash


def _owned(
    kind: str, namespace: str | None, name: str, labels: kopf.Labels, annotations: kopf.Annotations
) -> dict[Key, Owned]:
    owned = (kind, name, annotations.get(names.ANNOTATION_SPEC_HASH))
    return {_key(namespace, labels.get(names.LABEL_RUN)): owned}


@kopf.index("v1", "services", labels=MANAGED)
def owned_services(
    namespace: str | None, name: str, labels: kopf.Labels, annotations: kopf.Annotations, **_: Any
) -> dict[Key, Owned]:
    return _owned("Service", namespace, name, labels, annotations)


@kopf.index("v1", "configmaps", labels=MANAGED | {names.LABEL_STAGE: "spec"})
def owned_configmaps(
    namespace: str | None, name: str, labels: kopf.Labels, annotations: kopf.Annotations, **_: Any
) -> dict[Key, Owned]:
    return _owned("ConfigMap", namespace, name, labels, annotations)


@kopf.index("v1", "persistentvolumeclaims", labels=MANAGED)
def owned_claims(
    namespace: str | None, name: str, labels: kopf.Labels, annotations: kopf.Annotations, **_: Any
) -> dict[Key, Owned]:
    return _owned("PersistentVolumeClaim", namespace, name, labels, annotations)


# Watched only where the Prometheus operator is (its CRD is served).
@kopf.index("monitoring.coreos.com", "v1", "podmonitors", labels=MANAGED)
def owned_pod_monitors(
    namespace: str | None, name: str, labels: kopf.Labels, annotations: kopf.Annotations, **_: Any
) -> dict[Key, Owned]:
    return _owned("PodMonitor", namespace, name, labels, annotations)


OWNED_INDEXES = ("owned_services", "owned_configmaps", "owned_claims", "owned_pod_monitors")


def _recently_created(memo: kopf.Memo, key: Key, indexed: set[tuple[str, str]]) -> dict[tuple[str, str], Any]:
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
    for (kind, name), body in _recently_created(memo, key, indexed).items():
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


async def _carry_out(
    memo: kopf.Memo, ref: RunRef, key: Key, known: dict[str, Any], plan: Plan, logger: Any
) -> None:
    """Apply the plan's writes in order, then patch status with what changed since the last write."""
    try:
        for action in plan.actions:
            done = await memo.kube.apply(action)
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


def _announce(body: Mapping[str, Any], known: Mapping[str, Any], plan: Plan) -> None:
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
    key = _key(ref.namespace, names.run_label(ref.name))
    async with memo.locks.setdefault(key, asyncio.Lock()):
        started = time.perf_counter()
        known: dict[str, Any] = memo.statuses.get(key) or body.get("status") or {}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        observed = observe(key, memo, indices)
        spec = with_pipeline_image(body.get("spec"), memo.get("pipeline_image"))
        plan = plan_run(ref, meta.get("generation"), spec, known, observed, now)
        await _carry_out(memo, ref, key, known, plan, logger)
        memo.statuses[key] = plan.status
        _announce(body, known, plan)
        memo.metrics.observe(run_report(ref, plan, observed.jobs, time.time()))
        memo.metrics.reconciles.labels("ok").inc()  # last: a scrape that sees it sees the run's series
        memo.metrics.latency.observe(time.perf_counter() - started)
    if plan.problems:
        raise kopf.PermanentError("invalid spec: " + "; ".join(plan.problems))


def _indices(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: kwargs[k] for k in ("stage_jobs", "stage_pods", "serving_deployments", *OWNED_INDEXES)}


@kopf.on.create(*RUN, id="reconcile-create")
@kopf.on.update(*RUN, id="reconcile-update")
@kopf.on.resume(*RUN, id="reconcile-resume")
async def run_changed(body: kopf.Body, memo: kopf.Memo, logger: Any, **kwargs: Any) -> None:
    await reconcile(body, memo, logger, _indices(kwargs))


def _pod_news(status: kopf.Status, **_: Any) -> bool:
    """What the planner reads of a pod: a container ended, the pod is stuck, or it runs (no longer stuck)."""
    ended = any("terminated" in (cs.get("state") or {}) for cs in status.get("containerStatuses") or [])
    return ended or status.get("phase") == "Running" or blocked_by([{"status": status}]) is not None


def _deleted(**kwargs: Any) -> bool:
    return bool(kwargs.get("type") == "DELETED")


@kopf.on.event("batch", "v1", "jobs", labels=MANAGED)
@kopf.on.event("v1", "pods", labels=MANAGED, when=_pod_news)
@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
async def child_changed(
    namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, logger: Any, **kwargs: Any
) -> None:
    """A child changed: reconcile its run now instead of waiting for the resync timer."""
    runs: kopf.Index[Key, dict[str, Any]] = kwargs["eagle3_runs"]
    for run in list(runs.get(_key(namespace, labels.get(names.LABEL_RUN)), [])):
        if (run.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            await reconcile(run, memo, logger, _indices(kwargs))
        except (kopf.TemporaryError, kopf.PermanentError) as err:
            logger.warning("reconcile after a child's change failed (the resync retries): %s", err)


@kopf.on.event(*RUN, when=_deleted)
async def run_event(
    event: Mapping[str, Any], namespace: str | None, name: str, memo: kopf.Memo, **_: Any
) -> None:
    """A deleted run: forget its metrics, lock and cached status (owner references delete its children)."""
    if event.get("type") == "DELETED":
        key = _key(namespace, names.run_label(name))
        memo.statuses.pop(key, None)
        memo.pending.pop(key, None)
        memo.locks.pop(key, None)
        memo.metrics.forget_run(namespace, name)

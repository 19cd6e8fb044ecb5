"""The operator test harness: a REST cluster client, a Job-controller player, the operator runner.

The client speaks the Kubernetes REST API (JSON over HTTP), not kmock's Python API, so the same
lifecycle tests can drive a real API server: only the connection (URL, token, TLS) and the player differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import aiohttp
import kmock
import kopf
from kubernetes_asyncio import client as k8s

import eagle3_operator.handlers  # noqa: F401  (registers the handlers in kopf's default registry)
from eagle3_contract.api.base import API_VERSION, GROUP, KIND, PLURAL, SINGULAR, VERSION
from eagle3_contract.api.defaults import OperatorDefaults
from eagle3_operator.builders import names
from eagle3_operator.k8s import Kube
from eagle3_operator.metrics import OperatorMetrics
from eagle3_operator.state import OperatorState, state_of

MERGE = "application/merge-patch+json"
NS = "e3"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Emulator(kmock.KubernetesEmulator):
    """kmock plus what a real server assigns: uid, creationTimestamp, generation and a fresh resourceVersion.

    kopf's consistency tracking needs resourceVersion to change on every write; owner references need uids.
    The recorded request stays pristine; only the stored copy gets the server-side fields.
    """

    _rv = itertools.count(1)

    async def _handle(self, request: Any) -> Any:
        if isinstance(request.data, dict) and request.action in {kmock.action.CREATE, kmock.action.UPDATE}:
            meta = dict(request.data.get("metadata") or {})
            meta["resourceVersion"] = str(next(self._rv))
            if request.action == kmock.action.CREATE:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", now())
                meta.setdefault("generation", 1)
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            original = request.data
            object.__setattr__(request, "data", {**original, "metadata": meta})
            try:
                return await super()._handle(request)
            finally:
                object.__setattr__(request, "data", original)
        return await super()._handle(request)


def declare_resources(mock: Any, pod_monitors: bool = False) -> None:
    mock.resources.load_bundled()
    mock.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock.ResourceInfo(
        kind=KIND,
        singular=SINGULAR,
        namespaced=True,
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        subresources={"status"},
    )
    if pod_monitors:
        mock.resources["monitoring.coreos.com/v1/podmonitors"] = kmock.ResourceInfo(
            kind="PodMonitor", singular="podmonitor", namespaced=True,
            verbs={"get", "list", "watch", "create", "patch", "delete"},
        )  # fmt: skip


# kubectl's Accept header for `kubectl get`: the server renders the printer columns
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


class Cluster:
    """A namespace driven over REST. Label selectors apply client-side (kmock ignores them)."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, namespace: str = NS, token: str | None = None
    ) -> None:
        self.session = session
        self.url = url.rstrip("/")
        self.ns = namespace
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def path(self, api: str, plural: str, name: str = "", sub: str = "") -> str:
        prefix = f"/api/{api}" if "/" not in api else f"/apis/{api}"
        tail = "/".join(p for p in (name, sub) if p)
        return f"{self.url}{prefix}/namespaces/{self.ns}/{plural}" + (f"/{tail}" if tail else "")

    async def _call(self, method: str, url: str, body: Any = None, ctype: str = "application/json") -> Any:
        headers = self.headers | {"Content-Type": ctype}
        async with self.session.request(method, url, json=body, headers=headers, ssl=False) as resp:
            data = await resp.json(content_type=None)
            if resp.status >= 300:
                raise AssertionError(f"{method} {url}: HTTP {resp.status}: {data}")
            return data

    async def create(self, api: str, plural: str, body: dict[str, Any]) -> Any:
        body = {**body, "metadata": {**body.get("metadata", {}), "namespace": self.ns}}
        return await self._call("POST", self.path(api, plural), body)

    async def get(self, api: str, plural: str, name: str) -> Any:
        return await self._call("GET", self.path(api, plural, name))

    async def table(self, api: str, plural: str) -> Any:
        """The server's Table of the objects (what `kubectl get` renders, printer columns included)."""
        headers = self.headers | {"Accept": TABLE}
        async with self.session.get(self.path(api, plural), headers=headers, ssl=False) as resp:
            data = await resp.json(content_type=None)
            if resp.status >= 300:
                raise AssertionError(f"GET {plural} as a Table: HTTP {resp.status}: {data}")
            return data

    async def patch(self, api: str, plural: str, name: str, body: Any, sub: str = "") -> Any:
        return await self._call("PATCH", self.path(api, plural, name, sub), body, MERGE)

    async def delete(self, api: str, plural: str, name: str, propagation: str | None = None) -> Any:
        """DELETE; `propagation` "Background" as kubectl (a Job's REST default orphans and waits for the
        garbage collector to drop its finalizer: the object outlives the call)."""
        body = {"propagationPolicy": propagation} if propagation else None
        return await self._call("DELETE", self.path(api, plural, name), body)

    async def list_objects(self, api: str, plural: str, **labels: str) -> list[dict[str, Any]]:
        items = (await self._call("GET", self.path(api, plural)))["items"]
        return [
            i for i in items
            if i and all((i["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items())
        ]  # fmt: skip

    # The Eagle3Run and its children.
    async def apply_run(self, name: str, spec: dict[str, Any]) -> Any:
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name},
            "spec": spec,
        }
        return await self.create(API_VERSION, PLURAL, body)

    async def run(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.get(API_VERSION, PLURAL, name)
        return result

    async def edit_run(self, name: str, spec_patch: dict[str, Any]) -> Any:
        run = await self.run(name)
        generation = int(run["metadata"].get("generation", 1)) + 1
        return await self.patch(
            API_VERSION, PLURAL, name, {"metadata": {"generation": generation}, "spec": spec_patch}
        )

    async def jobs(self, run: str, stage: str | None = None) -> list[dict[str, Any]]:
        labels = {names.LABEL_RUN: run} | ({names.LABEL_STAGE: stage} if stage else {})
        found = await self.list_objects("batch/v1", "jobs", **labels)
        return sorted(found, key=lambda j: j["metadata"]["name"])

    async def deployment(self, run: str) -> dict[str, Any] | None:
        found = await self.list_objects("apps/v1", "deployments", **{names.LABEL_RUN: run})
        return found[0] if found else None


class Player(Protocol):
    """Moves stage Jobs and serving pods as told: `JobPlayer` on the mock, `Kubelet` on a real server."""

    async def run(self, job: dict[str, Any], ip: str) -> None: ...

    async def succeed(self, job: dict[str, Any], result: dict[str, Any] | None = None) -> None: ...

    async def fail_pod(self, job: dict[str, Any], message: str, n: int, exit_code: int = 1) -> None: ...

    async def fail(
        self, job: dict[str, Any], message: str, reason: str = "Error", exit_code: int = 1,
        job_reason: str = "BackoffLimitExceeded",
    ) -> None: ...  # fmt: skip

    async def ready(self, deployment: dict[str, Any]) -> None: ...

    async def stall(self, job: dict[str, Any], reason: str, message: str) -> None: ...

    async def crash_loop(self, deployment: dict[str, Any], exit_code: int, last_lines: str) -> None: ...


class JobPlayer:
    """Plays the Job controller and kubelet: a pod for the Job, terminated as told, then Job status."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def _pod(self, job: dict[str, Any], reason: str, exit_code: int, message: str, n: int) -> None:
        labels = job["spec"]["template"]["metadata"]["labels"] | {"job-name": job["metadata"]["name"]}
        container = job["spec"]["template"]["spec"]["containers"][0]["name"]
        terminated = {"reason": reason, "exitCode": exit_code, "message": message, "finishedAt": now()}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{job['metadata']['name']}-{n}-{uuid.uuid4().hex[:5]}", "labels": labels},
            "status": {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "containerStatuses": [{"name": container, "state": {"terminated": terminated}}],
            },
        }
        await self.cluster.create("v1", "pods", pod)

    async def run(self, job: dict[str, Any], ip: str) -> None:
        """The Job's pod runs, at `ip` (where the stage's progress metrics are served)."""
        labels = job["spec"]["template"]["metadata"]["labels"] | {"job-name": job["metadata"]["name"]}
        container = job["spec"]["template"]["spec"]["containers"][0]["name"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{job['metadata']['name']}-running", "labels": labels},
            "status": {
                "phase": "Running",
                "podIP": ip,
                "containerStatuses": [{"name": container, "state": {"running": {"startedAt": now()}}}],
            },
        }
        await self.cluster.create("v1", "pods", pod)
        status = {"active": 1, "startTime": now()}
        await self.cluster.patch("batch/v1", "jobs", job["metadata"]["name"], {"status": status}, "status")

    async def succeed(self, job: dict[str, Any], result: dict[str, Any] | None = None) -> None:
        import json

        for pod in await self.cluster.list_objects("v1", "pods", **{"job-name": job["metadata"]["name"]}):
            if (pod.get("status") or {}).get("phase") == "Running":  # run(): it ends as the new one
                await self.cluster.delete("v1", "pods", pod["metadata"]["name"])
        await self._pod(job, "Completed", 0, json.dumps(result or {}), 0)
        status = {
            "succeeded": 1, "active": 0, "startTime": now(), "completionTime": now(),
            "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": now()}],
        }  # fmt: skip
        await self.cluster.patch("batch/v1", "jobs", job["metadata"]["name"], {"status": status}, "status")

    async def fail_pod(self, job: dict[str, Any], message: str, n: int, exit_code: int = 1) -> None:
        """One pod fails; the Job still has retries left and starts another."""
        await self._pod(job, "Error", exit_code, message, n)
        status = {"failed": n + 1, "active": 1, "startTime": now()}
        await self.cluster.patch("batch/v1", "jobs", job["metadata"]["name"], {"status": status}, "status")

    async def fail(
        self, job: dict[str, Any], message: str, reason: str = "Error", exit_code: int = 1,
        job_reason: str = "BackoffLimitExceeded",
    ) -> None:  # fmt: skip
        await self._pod(job, reason, exit_code, message, 9)
        cond = {
            "type": "Failed", "status": "True", "reason": job_reason, "lastTransitionTime": now(),
            "message": "Job has reached the specified backoff limit",
        }  # fmt: skip
        status = {"failed": 1, "active": 0, "startTime": now(), "conditions": [cond]}
        await self.cluster.patch("batch/v1", "jobs", job["metadata"]["name"], {"status": status}, "status")

    async def stall(self, job: dict[str, Any], reason: str, message: str) -> None:
        """The Job's pod cannot start (`reason`: ImagePullBackOff, CreateContainerConfigError)."""
        labels = job["spec"]["template"]["metadata"]["labels"] | {"job-name": job["metadata"]["name"]}
        container = job["spec"]["template"]["spec"]["containers"][0]["name"]
        waiting = {"waiting": {"reason": reason, "message": message}}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{job['metadata']['name']}-stalled-{uuid.uuid4().hex[:5]}",
                "labels": labels,
            },
            "status": {"phase": "Pending", "containerStatuses": [{"name": container, "state": waiting}]},
        }
        await self.cluster.create("v1", "pods", pod)
        status = {"active": 1, "startTime": now()}
        await self.cluster.patch("batch/v1", "jobs", job["metadata"]["name"], {"status": status}, "status")

    async def crash_loop(self, deployment: dict[str, Any], exit_code: int, last_lines: str) -> None:
        """A vLLM pod of the Deployment crashes at start, again and again."""
        template = deployment["spec"]["template"]
        crashed = {"terminated": {"reason": "Error", "exitCode": exit_code, "message": last_lines}}
        back_off = {
            "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}
        }
        status = {"name": template["spec"]["containers"][0]["name"], "state": back_off, "lastState": crashed}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{deployment['metadata']['name']}-crash",
                "labels": template["metadata"]["labels"],
            },
            "status": {"phase": "Running", "containerStatuses": [status]},
        }
        await self.cluster.create("v1", "pods", pod)

    async def ready(self, deployment: dict[str, Any]) -> None:
        """The Deployment controller's part: report one ready replica (its pods run)."""
        selector = deployment["spec"]["selector"]["matchLabels"]
        for pod in await self.cluster.list_objects("v1", "pods", **selector):
            running = {"phase": "Running", "containerStatuses": [{"name": "vllm", "state": {"running": {}}}]}
            await self.cluster.patch("v1", "pods", pod["metadata"]["name"], {"status": running}, "status")
        ready = {"status": {"readyReplicas": 1}}
        await self.cluster.patch("apps/v1", "deployments", deployment["metadata"]["name"], ready, "status")


# Polls start 20 ms apart and back off to 200 ms: a wait of a few seconds (most of them, on the real API
# server) then costs about 5 requests a second instead of 50, each of which the server, the client and, on
# the API mock, the operator's own event loop pay for in CPU the suite is short of.
POLL_FIRST_S, POLL_MAX_S, POLL_GROWTH = 0.02, 0.2, 1.5
# How long a wait may take before it counts as hung: a bound, not a speed. With two busy loops beside the
# suite, the operator took more than 10 s (the old default) to create a serving Deployment and to write a
# run's Serving phase; a wait that is met returns at once, however high its bound.
WAIT_BOUND_S = 60.0


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float = WAIT_BOUND_S, what: str = ""
) -> Any:
    """Poll `check` until it returns a truthy value (AssertionError/KeyError count as not yet)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    pause = POLL_FIRST_S
    while time.monotonic() < deadline:
        try:
            value = await check()
            if value:
                return value
        except (AssertionError, KeyError, IndexError, TypeError) as err:
            last = err
        await asyncio.sleep(pause)
        pause = min(pause * POLL_GROWTH, POLL_MAX_S)
    raise AssertionError(f"not reached within {timeout}s: {what or check}; last error: {last!r}")


def operator_state(memo: kopf.Memo) -> OperatorState:
    """The state the operator's startup handler put in `memo` (eagle3_operator.state)."""
    state = state_of(memo)
    assert state is not None, "the operator has not started"
    return state


@asynccontextmanager
async def running_operator(
    url: str,
    metrics: OperatorMetrics | None = None,
    token: str | None = None,
    namespace: str | None = None,
    resync_seconds: float | None = None,
    pipeline_image: str | None = None,
    liveness: str | None = None,
    progress_seconds: float | None = None,
    watch_seconds: int | None = None,
    progress_reader: Any = None,
    pod_security_minimum_level: str = "restricted",
) -> AsyncIterator[kopf.Memo]:
    """The real kopf operator with this project's handlers, in this event loop, against `url`.

    `namespace` limits it to one namespace (a real server; kmock cannot list namespaces), else cluster-wide.
    Against kmock (plain http) the watches are kopf's own, unbounded, unless `watch_seconds` says otherwise:
    kmock ignores timeoutSeconds (its TODO) and replays every object on each connect, so a bounded watch
    reconnects and replays everything every few seconds (a re-list, over and over). `progress_reader`
    replaces the reader of the stage pods' progress (eagle3_operator.stage_metrics.Reader).
    """
    stop, ready = asyncio.Event(), asyncio.Event()
    config = k8s.Configuration(host=url)
    config.verify_ssl = False
    if token:
        config.api_key = {"BearerToken": token}
        config.api_key_prefix = {"BearerToken": "Bearer"}
    api = k8s.ApiClient(config)
    memo = kopf.Memo(
        connection=kopf.ConnectionInfo(server=url, insecure=True, token=token),
        kube=Kube(api),
        metrics=metrics or OperatorMetrics(),
        resync_seconds=resync_seconds,
        progress_seconds=progress_seconds,
        defaults=OperatorDefaults(
            pipeline_image=pipeline_image, pod_security_minimum_level=pod_security_minimum_level
        ),
        namespaces=[namespace] if namespace else [],
        watch_seconds=watch_seconds
        if watch_seconds is not None
        else 0
        if url.startswith("http://")
        else None,
        progress_reader=progress_reader,
    )
    scope: dict[str, Any] = {"namespaces": [namespace]} if namespace else {"clusterwide": True}
    task = asyncio.create_task(
        kopf.operator(
            standalone=True, stop_flag=stop, ready_flag=ready, memo=memo, liveness_endpoint=liveness, **scope
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 10)
        yield memo
    finally:
        # Cancel rather than set `stop`: a graceful stop waits 5 s for the mock server's never-ending
        # watch-stream handlers, which kopf counts as its own "hung" tasks. Cancelling stops them at once.
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 15)
        await api.close()

"""A test kubelet for a real API server with no nodes: it moves the Job controller's pods as a scenario says.

The real Job controller creates a stage Job's pods; this kubelet finds them and patches their status through
Running to Succeeded (with the stage's JSON result as the termination message) or Failed (an error, or
OOMKilled with exit code 137), and the real controller completes or fails the Job. Serving pods are marked
Running and Ready, so the Deployment controller reports ready replicas. Same interface as `JobPlayer`.
"""

from __future__ import annotations

import json
from typing import Any

from tests.harness.cluster import Cluster, eventually, now

# How long a pod of a Job may take to appear: the Job controller waits 10 s, then 20 s, ... before replacing a
# failed pod, and under make test's load (both cores busy) a new Job's first pod once took over 60 s. A bound
# that says it happens, not how fast.
POD_TIMEOUT = 180.0


class Kubelet:
    """Plays the kubelet for the pods of stage Jobs and serving Deployments on a real API server."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def _live_pod(self, job: dict[str, Any]) -> dict[str, Any]:
        """A pod of the Job that has not ended yet (the controller creates one after each failure)."""

        async def check() -> dict[str, Any] | None:
            pods = await self.cluster.list_objects("v1", "pods", **{"job-name": job["metadata"]["name"]})
            live = [p for p in pods if (p.get("status") or {}).get("phase") in (None, "Pending", "Running")]
            return live[0] if live else None

        pod: dict[str, Any] = await eventually(check, POD_TIMEOUT, f"a pod of Job {job['metadata']['name']}")
        return pod

    async def _patch_pod(
        self,
        pod: dict[str, Any],
        phase: str,
        state: dict[str, Any],
        ready: bool,
        last: dict[str, Any] | None = None,
        ip: str | None = None,
    ) -> None:
        container = pod["spec"]["containers"][0]
        status = {
            "phase": phase,
            **({"podIP": ip, "podIPs": [{"ip": ip}]} if ip else {}),
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now()}
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": ready,
                    "restartCount": 0,
                    "state": state,
                    "lastState": last or {},
                }
            ],
        }
        await self.cluster.patch("v1", "pods", pod["metadata"]["name"], {"status": status}, "status")

    async def _end(self, job: dict[str, Any], reason: str, exit_code: int, message: str) -> None:
        await self._end_pod(await self._live_pod(job), reason, exit_code, message)

    async def _end_pod(self, pod: dict[str, Any], reason: str, exit_code: int, message: str) -> None:
        ended = {
            "reason": reason,
            "exitCode": exit_code,
            "message": message,
            "startedAt": now(),
            "finishedAt": now(),
        }
        await self._patch_pod(pod, "Succeeded" if exit_code == 0 else "Failed", {"terminated": ended}, False)

    async def _job(self, job: dict[str, Any]) -> dict[str, Any] | None:
        """The Job as the server has it now; None once it is deleted."""
        found = await self.cluster.list_objects("batch/v1", "jobs")
        return next((j for j in found if j["metadata"]["name"] == job["metadata"]["name"]), None)

    async def _job_condition(self, job: dict[str, Any], kind: str) -> None:
        async def check() -> bool:
            body = await self._job(job)
            if body is None or _stopped(body):
                # the operator failed it itself (a server without podFailurePolicy): deleted, or stopped
                return kind == "Failed"
            conditions = (body.get("status") or {}).get("conditions") or []
            return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)

        await eventually(check, POD_TIMEOUT, f"Job {job['metadata']['name']} {kind}")

    async def stall(self, job: dict[str, Any], reason: str, message: str) -> None:
        """The Job's pod cannot start (`reason`: ImagePullBackOff, CreateContainerConfigError)."""
        pod = await self._live_pod(job)
        await self._patch_pod(pod, "Pending", {"waiting": {"reason": reason, "message": message}}, False)

    async def run(self, job: dict[str, Any], ip: str) -> None:
        """The Job's pod runs, at `ip` (where the stage's progress metrics are served)."""
        pod = await self._live_pod(job)
        await self._patch_pod(pod, "Running", {"running": {"startedAt": now()}}, True, ip=ip)

    async def succeed(self, job: dict[str, Any], result: dict[str, Any] | None = None) -> None:
        await self._end(job, "Completed", 0, json.dumps(result or {}))
        await self._job_condition(job, "Complete")

    async def fail_pod(self, job: dict[str, Any], message: str, n: int, exit_code: int = 1) -> None:
        """One pod fails; the Job controller starts another (after its back-off)."""
        await self._end(job, "Error", exit_code, message)

    async def fail(
        self, job: dict[str, Any], message: str, reason: str = "Error", exit_code: int = 1,
        job_reason: str = "BackoffLimitExceeded",
    ) -> None:  # fmt: skip
        """Fail each pod the Job controller starts until it gives up (the server decides the reason; a
        podFailurePolicy FailJob rule gives up after the first)."""
        limit = int(job["spec"].get("backoffLimit", 6))
        for _ in range(limit + 1):
            pod = await self._next_pod_or_ended(job)
            if pod is None:
                break  # the operator stopped or deleted it before the controller's next pod
            try:
                await self._end_pod(pod, reason, exit_code, message)
            except AssertionError as err:
                # the pod went between its read and its patch: the controller deletes a stopped Job's pods
                body = await self._job(job)
                if "HTTP 404" in str(err) and (body is None or _stopped(body) or _failing(body)):
                    break
                raise
            if await self._gave_up(job, limit):
                break
        await self._job_condition(job, "Failed")

    async def _next_pod_or_ended(self, job: dict[str, Any]) -> dict[str, Any] | None:
        """Wait for the controller's next pod (returned) or for the Job to end without one (None): on a
        server without podFailurePolicy the operator stops the Job itself, and it may do so after the
        controller counted the failure, even after the controller started the next pod, which it then
        deletes. So the pod ended is the one found here, never one looked for again: a replacement the stop
        deleted meanwhile is a 404 to the patch, not a wait for a pod that never comes."""

        async def check() -> tuple[dict[str, Any] | None] | None:
            pods = await self.cluster.list_objects("v1", "pods", **{"job-name": job["metadata"]["name"]})
            live = [p for p in pods if (p.get("status") or {}).get("phase") in (None, "Pending", "Running")]
            if live:
                return (live[0],)
            body = await self._job(job)
            return (None,) if body is None or _stopped(body) or _failing(body) else None

        result: tuple[dict[str, Any] | None] = await eventually(
            check, POD_TIMEOUT, f"the next pod of Job {job['metadata']['name']}"
        )
        return result[0]

    async def _gave_up(self, job: dict[str, Any], limit: int) -> bool:
        """Whether the Job controller starts no further pod: the backoff limit is spent, or it is failing."""

        async def settled() -> tuple[bool] | None:
            body = await self._job(job)
            if body is None or _stopped(body):
                return (
                    True,
                )  # the operator deleted or stopped it: it failed the Job itself (no podFailurePolicy)
            status = body.get("status") or {}
            if _failing(body) or int(status.get("failed", 0)) > limit:
                return (True,)
            return (False,) if int(status.get("failed", 0)) > 0 else None

        result: tuple[bool] = await eventually(settled, POD_TIMEOUT, f"Job {job['metadata']['name']} counted")
        return result[0]

    async def crash_loop(self, deployment: dict[str, Any], exit_code: int, last_lines: str) -> None:
        """The Deployment's vLLM pods crash at start, again and again."""
        crashed = {"terminated": {"reason": "Error", "exitCode": exit_code, "message": last_lines}}
        back_off = {
            "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}
        }
        for pod in await self._serving_pods(deployment):
            await self._patch_pod(pod, "Running", back_off, False, last=crashed)

    async def _serving_pods(self, deployment: dict[str, Any]) -> list[dict[str, Any]]:
        selector = deployment["spec"]["selector"]["matchLabels"]

        async def pods() -> list[dict[str, Any]] | None:
            found = await self.cluster.list_objects("v1", "pods", **selector)
            return found or None

        found: list[dict[str, Any]] = await eventually(
            pods, POD_TIMEOUT, f"pods of Deployment {deployment['metadata']['name']}"
        )
        return found

    async def ready(self, deployment: dict[str, Any]) -> None:
        """Mark the Deployment's pods Running and Ready."""
        for pod in await self._serving_pods(deployment):
            await self._patch_pod(pod, "Running", {"running": {"startedAt": now()}}, True)


def _stopped(job: dict[str, Any]) -> bool:
    """Stopped by the operator (parallelism 0) after a failure it will not retry: no further pod starts."""
    return (job.get("spec") or {}).get("parallelism") == 0


def _failing(job: dict[str, Any]) -> bool:
    """The Job controller has given up on it (Failed, or FailureTarget while its pods finish)."""
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Failed", "FailureTarget") and c.get("status") == "True" for c in conditions)

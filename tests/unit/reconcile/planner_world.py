"""A run's children as plain Kubernetes-shaped dicts, for driving the planner without an API server.

`World` holds the Jobs, Pods, Deployment and other children of one run as the API server would return them,
turns them into an `Observed` with the operator's own `observe_job`/`observe_deployment` (so observe.py
runs too), applies a plan's actions to itself, and moves Jobs through their lives (start, succeed, fail)
the way the Job controller and the kubelet report them.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from eagle3_contract.api.status import StageProgress
from eagle3_contract.stages import Stage
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.reconcile.actions import Action
from eagle3_operator.reconcile.observe import (
    Observed,
    blocked_by,
    canary_deployment,
    observe_deployment,
    observe_job,
    serving_pods,
    workloads_blocked_by,
)
from eagle3_operator.reconcile.planner import Plan, plan_run
from eagle3_operator.reconcile.server_features import ServerFeatures
from tests import tiny_spec
from tests.harness.results import fake_result
from tests.tiny_spec import apply_merge_patch

RUN = RunRef(name="tiny", namespace="eagle3", uid="00000000-0000-4000-8000-00000000000a")
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"

# The tiny example without regeneration (the operator scenarios' run) and without its evaluation section, so
# without a gate (gate tests here set their own) and without the sweep its tuned speculation length needs
# (serving takes the fixed numSpeculativeTokens; the tuned tests set both).
TINY: dict[str, Any] = tiny_spec.tiny(
    regeneration={"enabled": False}, evaluation=None, serving={"speculationLength": None}
)


def ts(seconds: float) -> str:
    """An RFC 3339 time `seconds` after the epoch of these tests, as the API server writes it."""
    return (EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def tiny(**sections: Any) -> dict[str, Any]:
    """TINY with `sections` merge-patched in (see tests.tiny_spec.derive)."""
    return tiny_spec.derive(TINY, **sections)


def condition(kind: str, reason: str = "", message: str = "", at: str | None = None) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastProbeTime": at,
        "lastTransitionTime": at,
    }


def terminated(
    exit_code: int = 0, reason: str | None = None, message: str | None = None, at: str | None = None
) -> dict[str, Any]:
    term: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason or ("Completed" if exit_code == 0 else "Error"),
    }
    if message is not None:
        term["message"] = message
    if at is not None:
        term["startedAt"] = at
        term["finishedAt"] = at
    return term


def pod_of(job: dict[str, Any], suffix: str, state: dict[str, Any], phase: str) -> dict[str, Any]:
    """A Pod of `job` as the Job controller makes it: the template's labels plus the job-name label."""
    labels = dict(job["spec"]["template"]["metadata"]["labels"])
    labels[JOB_NAME_LABEL] = job["metadata"]["name"]
    container = job["spec"]["template"]["spec"]["containers"][0]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job['metadata']['name']}-{suffix}",
            "namespace": job["metadata"]["namespace"],
            "labels": labels,
        },
        "spec": copy.deepcopy(job["spec"]["template"]["spec"]),
        "status": {
            "phase": phase,
            "containerStatuses": [
                {"name": container, "image": "img", "ready": False, "restartCount": 0, "state": state}
            ],
        },
    }


def job_status(phase: str, at: str) -> dict[str, Any]:
    """A Job's status in `phase`: pending, running, complete(-no-pod), failed or failure-target."""
    if phase == "pending":
        return {}
    if phase == "running":
        return {"startTime": at, "active": 1}
    if phase.startswith("complete"):
        done = [condition("SuccessCriteriaMet", "CompletionsReached", at=at), condition("Complete", at=at)]
        return {"startTime": at, "completionTime": at, "succeeded": 1, "conditions": done}
    failed = [condition("FailureTarget", "BackoffLimitExceeded", "backoff", at)]
    if phase == "failed":
        failed.append(condition("Failed", "BackoffLimitExceeded", "backoff", at))
    return {"startTime": at, "failed": 1, "conditions": failed}


@dataclass
class World:
    """One run and its children; `step()` plans, applies the actions and keeps the status (a reconcile)."""

    spec: dict[str, Any]
    ref: RunRef = RUN
    generation: int = 1
    status: dict[str, Any] | None = None
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    deployment: dict[str, Any] | None = None
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)  # other Deployments, by name
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pod_monitors_served: bool = False
    disruption_budgets_served: bool = False
    clock: float = 0.0
    progress: dict[str, StageProgress] = field(default_factory=dict)  # live, by JobView.progress_key
    features: ServerFeatures = field(default_factory=ServerFeatures)  # what the API server's version offers
    pod_security_floor: str = "restricted"  # the operator's --pod-security-minimum-level

    # --- the planner's view -------------------------------------------------------------------------

    def observed(self, listed: tuple[str, ...] = ()) -> Observed:
        """The children as the watch shows them; the Jobs named in `listed` with their pods as the API
        server lists them (the executor's answer to a plan's `unconfirmed`: here the same pods)."""
        pods = list(self.pods.values())
        return Observed(
            jobs=tuple(observe_job(job, pods, listed=name in listed) for name, job in self.jobs.items()),
            deployment=observe_deployment(self.deployment) if self.deployment is not None else None,
            objects=frozenset(self.objects),
            spec_hashes={
                key: spec_hash
                for key, body in self.objects.items()
                if (spec_hash := body["metadata"].get("annotations", {}).get(names.ANNOTATION_SPEC_HASH))
            },
            pod_monitors_served=self.pod_monitors_served,
            disruption_budgets_served=self.disruption_budgets_served,
            serving_blocked_by=blocked_by(serving_pods(pods)),
            workloads={
                view.stage: view
                for view in (observe_deployment(d) for d in self.workloads.values())
                if view.track != names.TRACK_CANARY
            },
            # serving.canary's Deployment, as the executor observes it
            canary=canary_deployment(self.workloads.values()),
            workload_blocked_by=workloads_blocked_by(pods),
            progress=dict(self.progress),
            features=self.features,
        )

    def plan(self, now: str | None = None) -> Plan:
        """Plan against the current children and status, changing nothing; as the executor, once more with
        the API server's pods of the Jobs the first plan could not confirm."""
        at = now or ts(self.clock)
        floor = self.pod_security_floor
        plan = plan_run(self.ref, self.generation, self.spec, self.status, self.observed(), at, floor)
        if plan.unconfirmed:
            observed = self.observed(listed=plan.unconfirmed)
            plan = plan_run(self.ref, self.generation, self.spec, self.status, observed, at, floor)
        return plan

    def step(self, now: str | None = None) -> Plan:
        """Plan, apply every action and keep the new status (what one reconcile does)."""
        plan = self.plan(now)
        self.apply(plan.actions)
        self.status = plan.status.document()  # what the API server stores
        return plan

    def edit(self, **sections: Any) -> None:
        """A `kubectl apply` of a changed spec: merge `sections` in and bump the generation."""
        for key, value in sections.items():
            self.spec[key] = {**self.spec.get(key, {}), **value} if isinstance(value, dict) else value
        self.generation += 1

    def apply(self, actions: tuple[Action, ...]) -> None:
        for action in actions:
            body = copy.deepcopy(action.body)
            kind, name = body["kind"], body["metadata"]["name"]
            if kind == "Job":
                if action.verb == "create":
                    self.jobs.setdefault(name, body)
                elif action.verb == "delete":
                    self.jobs.pop(name, None)
                    for pod in [
                        p for p, v in self.pods.items() if v["metadata"]["labels"][JOB_NAME_LABEL] == name
                    ]:
                        del self.pods[pod]
            elif kind == "Deployment" and name != names.serving_name(self.ref.name):
                if action.verb == "create":
                    self.workloads.setdefault(name, body)
                elif action.verb == "delete":
                    self.workloads.pop(name, None)
                else:
                    self.workloads[name] = apply_merge_patch(self.workloads[name], body)
            elif kind == "Deployment":
                if action.verb == "delete":
                    self.deployment = None
                elif action.verb == "create" and self.deployment is None:
                    self.deployment = body
                elif action.verb == "patch":
                    self.deployment = apply_merge_patch(self.deployment, body)
            elif action.verb == "create":
                self.objects.setdefault((kind, name), body)
            elif action.verb == "patch":
                self.objects[(kind, name)] = apply_merge_patch(self.objects[(kind, name)], body)
            elif action.verb == "delete":
                self.objects.pop((kind, name), None)
            else:
                raise AssertionError(f"unexpected {action.verb} of {kind} {name}")

    # --- the Job controller and the kubelet ---------------------------------------------------------

    def job(self, stage: str) -> dict[str, Any]:
        """The newest Job of `stage`: the highest attempt, the last created of those."""
        mine = [j for j in self.jobs.values() if j["metadata"]["labels"][names.LABEL_STAGE] == stage]
        assert mine, f"no Job of stage {stage}: {sorted(self.jobs)}"
        return max(reversed(mine), key=lambda j: int(j["metadata"]["labels"][names.LABEL_ATTEMPT]))

    def start(self, stage: str, at: float | None = None) -> dict[str, Any]:
        """The Job's pod is running."""
        job = self.job(stage)
        start = ts(self.clock if at is None else at)
        job["status"] = {"startTime": start, "active": 1, "ready": 1}
        self.pods[job["metadata"]["name"]] = pod_of(job, "a", {"running": {"startedAt": start}}, "Running")
        return job

    def succeed(
        self, stage: str, result: Any = None, seconds: float = 60.0, pod_terminated: bool = True
    ) -> dict[str, Any]:
        """The Job completed; its pod's termination message is `result` (a dict is written as JSON)."""
        job = self.job(stage) if "status" in self.job(stage) else self.start(stage)
        start = job["status"]["startTime"]
        self.clock += seconds
        end = ts(self.clock)
        job["status"] = {
            "startTime": start,
            "completionTime": end,
            "succeeded": 1,
            "conditions": [condition("SuccessCriteriaMet", "CompletionsReached", "", end),
                           condition("Complete", "CompletionsReached", "", end)],
        }  # fmt: skip
        if pod_terminated:
            message = fake_result(stage) if result is None else result
            text = message if isinstance(message, str) else json.dumps(message)
            state = {"terminated": terminated(0, message=text, at=end)}
            self.pods[job["metadata"]["name"]] = pod_of(job, "a", state, "Succeeded")
        return job

    def fail(
        self,
        stage: str,
        reason: str = "BackoffLimitExceeded",
        message: str = "Job has reached the specified backoff limit",
        exit_code: int = 1,
        term_reason: str | None = None,
        last_message: str | None = "Traceback (most recent call last):\nRuntimeError: boom",
    ) -> dict[str, Any]:
        """The Job failed; its (last) pod ended with `exit_code`, `term_reason` and `last_message`."""
        job = self.job(stage) if "status" in self.job(stage) else self.start(stage)
        start = job["status"]["startTime"]
        self.clock += 30
        end = ts(self.clock)
        job["status"] = {
            "startTime": start,
            "failed": 1,
            "conditions": [condition("FailureTarget", reason, message, end),
                           condition("Failed", reason, message, end)],
        }  # fmt: skip
        state = {"terminated": terminated(exit_code, term_reason, last_message, end)}
        self.pods[job["metadata"]["name"]] = pod_of(job, "a", state, "Failed")
        return job

    def available(self, name: str, replicas: int = 1) -> None:
        """The Deployment `name` (producers, Mooncake master) has `replicas` ready and available pods."""
        self.workloads[name]["status"] = {"readyReplicas": replicas, "availableReplicas": replicas}

    def ready(self, replicas: int = 1) -> None:
        """The Deployment's pods are ready."""
        assert self.deployment is not None
        self.deployment["status"] = {"readyReplicas": replicas, "replicas": replicas}

    def run_to(self, stop: str, results: dict[str, Any] | None = None) -> Plan:
        """Step and let each created stage Job succeed, until the Job of `stop` has been created."""
        results = {s.value: fake_result(s) for s in Stage} | (results or {})
        plan = self.step()
        for _ in range(20):
            created = [a.body for a in plan.actions if a.verb == "create" and a.body["kind"] == "Job"]
            if not created:
                return plan
            stage = created[0]["metadata"]["labels"][names.LABEL_STAGE]
            if stage == stop:
                return plan
            self.succeed(stage, results.get(stage))
            plan = self.step()
        raise AssertionError("the run did not get there")


def creates(plan: Plan, kind: str | None = None) -> list[dict[str, Any]]:
    return [a.body for a in plan.actions if a.verb == "create" and (kind is None or a.body["kind"] == kind)]


def keys(plan: Plan) -> list[tuple[str, str, str]]:
    return [a.key for a in plan.actions]


def condition_of(status: dict[str, Any], kind: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in status.get("conditions", []) if c["type"] == kind]
    assert len(found) == 1, f"{kind}: {status.get('conditions')}"
    return found[0]

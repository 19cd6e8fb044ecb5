"""observe.py: what the planner reads from Jobs, Pods and Deployments, and that the slim copies keep it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.status import BlockedBy, StagePhase
from eagle3_contract.exit_codes import OOM_EXIT_CODE
from eagle3_contract.stages import Stage, plan_stages
from eagle3_operator.builders import names
from eagle3_operator.builders.job import build_job
from eagle3_operator.builders.producers import build_producers
from eagle3_operator.builders.serving import build_deployment
from eagle3_operator.reconcile.observe import (
    DeploymentView,
    Termination,
    blocked_by,
    observe_deployment,
    observe_job,
)
from eagle3_operator.reconcile.slim import slim_deployment, slim_job, slim_pod
from tests.unit.builders.builder_cases import TINY_RUN, specs, stage_jobs, tiny_spec
from tests.unit.reconcile.planner_world import condition, job_status, pod_of, terminated, ts

SPEC_CM = "tiny-spec-0123456789ab"


def a_job(stage: Stage = Stage.EXTRACT, attempt: int = 0, budget: int | None = None) -> dict[str, Any]:
    spec = tiny_spec()
    plan = next(p for p in plan_stages(spec) if p.stage == stage)
    return build_job(TINY_RUN, spec, plan, attempt, budget, SPEC_CM)


def with_status(job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(job) | {"status": status}


def a_pod(
    job: dict[str, Any], at: str, exit_code: int = 0, reason: str | None = None, message: str = ""
) -> dict[str, Any]:
    """A pod of `job` whose container terminated at `at`."""
    suffix = at.translate(str.maketrans("", "", "-:TZ"))
    return pod_of(job, suffix, {"terminated": terminated(exit_code, reason, message, at)}, "Failed")


# --- Job phases ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "phase"),
    [
        ({}, StagePhase.PENDING),
        ({"active": 1}, StagePhase.RUNNING),
        ({"startTime": ts(0)}, StagePhase.RUNNING),
        ({"startTime": ts(0), "active": 0, "ready": 0}, StagePhase.RUNNING),
        ({"conditions": [condition("Complete", at=ts(9))]}, StagePhase.SUCCEEDED),
        ({"conditions": [condition("SuccessCriteriaMet", at=ts(9))], "active": 1}, StagePhase.SUCCEEDED),
        ({"conditions": [condition("Failed", "BackoffLimitExceeded", at=ts(9))]}, StagePhase.FAILED),
        (
            {"conditions": [condition("FailureTarget", "PodFailurePolicy", at=ts(9))], "active": 1},
            StagePhase.FAILED,
        ),
        ({"conditions": [condition("Suspended", at=ts(0))]}, StagePhase.PENDING),
        ({"conditions": [condition("Complete") | {"status": "False"}], "active": 1}, StagePhase.RUNNING),
        ({"conditions": [condition("Failed") | {"status": "False"}]}, StagePhase.PENDING),
    ],
)
def test_job_phase_from_conditions(status: dict[str, Any], phase: StagePhase) -> None:
    assert observe_job(with_status(a_job(), status)).phase == phase


def test_a_job_is_read_from_its_labels_annotations_volumes_and_status() -> None:
    job = with_status(a_job(Stage.EXTRACT, attempt=2, budget=256), job_status("running", ts(5)))
    view = observe_job(job)
    assert view.name == job["metadata"]["name"] and view.name.endswith("-r2")
    assert view.stage == "extract"
    assert view.hash == job["metadata"]["labels"][names.LABEL_HASH]
    assert (view.attempt, view.token_budget) == (2, 256)
    assert view.spec_configmap == SPEC_CM
    assert view.start_time == ts(5) and view.completion_time is None
    assert (view.termination, view.pods_seen) == (None, 0)


def test_a_failed_job_reports_its_failure_condition() -> None:
    status = job_status("failed", ts(30)) | {"startTime": ts(1)}
    view = observe_job(with_status(a_job(), status))
    assert view.phase == StagePhase.FAILED
    assert (view.failure_reason, view.failure_message) == ("BackoffLimitExceeded", "backoff")
    assert view.completion_time == ts(30)  # a failed Job has no completionTime: the condition's time
    done = observe_job(with_status(a_job(), job_status("complete", ts(40))))
    assert (done.failure_reason, done.completion_time) == (None, ts(40))


def test_missing_or_malformed_metadata_reads_as_defaults() -> None:
    view = observe_job({})
    assert (view.name, view.stage, view.hash, view.attempt, view.phase) == ("", "", "", 0, StagePhase.PENDING)
    assert view.token_budget is None and view.spec_configmap is None
    job = a_job()
    job["metadata"]["annotations"] = {names.ANNOTATION_TOKEN_BUDGET: "lots"}
    job["metadata"]["labels"][names.LABEL_ATTEMPT] = "x"
    job["spec"]["template"]["spec"]["volumes"] = [{"name": "other", "configMap": {"name": "nope"}}]
    view = observe_job(job)
    assert (view.token_budget, view.attempt, view.spec_configmap) == (None, 0, None)


# --- terminations --------------------------------------------------------------------------------------


def test_the_latest_finished_pod_gives_the_termination() -> None:
    job = with_status(a_job(), job_status("failed", ts(99)))
    first = a_pod(job, ts(10), 137, "OOMKilled")
    last = a_pod(job, ts(50), OOM_EXIT_CODE, "Error", "  CUDA out of memory\n")
    for pods in ([first, last], [last, first]):
        view = observe_job(job, pods)
        assert view.termination == Termination("Error", OOM_EXIT_CODE, "CUDA out of memory", ts(50))
        assert view.pods_seen == 2


def test_only_the_jobs_own_pods_and_container_count() -> None:
    job = with_status(a_job(), job_status("complete", ts(9)))
    mine = a_pod(job, ts(5), 0, message='{"tokens": 1}')
    other_attempt = a_pod(with_status(a_job(attempt=1), {}), ts(8), 1)
    other_stage = a_pod(with_status(a_job(Stage.VOCAB), {}), ts(8), 1)
    sidecar = copy.deepcopy(mine)
    sidecar["status"]["containerStatuses"][0]["name"] = "istio-proxy"
    sidecar["metadata"]["name"] += "-sidecar"
    sidecar["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = ts(9)
    view = observe_job(job, [other_attempt, mine, other_stage, sidecar])
    assert view.termination == Termination("Completed", 0, '{"tokens": 1}', ts(5))
    assert view.pods_seen == 2  # its own pods, whatever their containers


def test_a_running_or_restarted_container_reads_its_last_termination() -> None:
    job = with_status(a_job(), job_status("running", ts(0)))
    running = pod_of(job, "a", {"running": {"startedAt": ts(1)}}, "Running")
    view = observe_job(job, [running])
    assert (view.termination, view.pods_seen) == (None, 1)
    restarted = copy.deepcopy(running)
    restarted["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": terminated(137, "OOMKilled", at=ts(1))
    }
    assert observe_job(job, [restarted]).termination == Termination("OOMKilled", 137, None, ts(1))


def test_an_empty_termination_message_is_none() -> None:
    job = with_status(a_job(), job_status("complete", ts(9)))
    assert observe_job(job, [a_pod(job, ts(5), 0, message="  \n")]).termination == Termination(
        "Completed", 0, None, ts(5)
    )


# --- deployments ---------------------------------------------------------------------------------------


def test_a_deployment_is_read_from_its_annotations_and_status() -> None:
    deployment = build_deployment(TINY_RUN, tiny_spec(), "export/abc")
    view = observe_deployment(deployment | {"status": {"readyReplicas": 2, "replicas": 3}})
    assert view == DeploymentView(
        name=names.serving_name(TINY_RUN.name),
        spec_hash=deployment["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH],
        draft="export/abc",
        replicas=1,
        ready_replicas=2,
    )
    assert observe_deployment({}) == DeploymentView("", None, None, 0, 0)


# --- slim copies (kept in kopf's indexes) keep what observe reads ---------------------------------------

PHASES = st.sampled_from(["pending", "running", "complete", "failed", "failure-target"])
POD_STATES = st.sampled_from(
    [
        {"running": {"startedAt": ts(1)}},
        {"terminated": terminated(0, message='{"a": 1}', at=ts(2))},
        {"terminated": terminated(137, "OOMKilled", at=ts(3))},
        {"waiting": {"reason": "ContainerCreating"}},
        {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}},
    ]
)
POD_PHASES = st.sampled_from(["Pending", "Running", "Failed"])


@settings(max_examples=60, deadline=None)
@given(specs(), st.data())
def test_observing_a_slim_copy_is_observing_the_object(spec: Eagle3RunSpec, data: st.DataObject) -> None:
    for plan, job in stage_jobs(TINY_RUN, spec, attempt=data.draw(st.integers(0, 2))):
        job = with_status(job, job_status(data.draw(PHASES), ts(data.draw(st.integers(0, 100)))))
        pods = [
            pod_of(job, str(i), data.draw(POD_STATES), data.draw(POD_PHASES))
            for i in range(data.draw(st.integers(0, 2)))
        ]
        slim = slim_job(job)
        assert observe_job(slim, [slim_pod(p) for p in pods]) == observe_job(job, pods), plan.stage
        assert "containers" not in slim["spec"]["template"]["spec"]
        assert all(set(slim_pod(p)["status"]) == {"phase", "containerStatuses"} for p in pods)
    deployment = build_deployment(TINY_RUN, spec, "export/x") | {
        "status": {"readyReplicas": 1, "replicas": 1}
    }
    slim = slim_deployment(deployment)
    assert observe_deployment(slim) == observe_deployment(deployment)
    assert set(slim["spec"]["template"]["spec"]) == {"volumes"}  # where a spec ConfigMap would be
    producers = build_producers(TINY_RUN, spec, "abc", "tiny-spec-1") | {
        "status": {"readyReplicas": 1, "availableReplicas": 1}
    }
    slim = slim_deployment(producers)
    assert observe_deployment(slim) == observe_deployment(producers)
    assert observe_deployment(slim).spec_configmap == "tiny-spec-1"
    assert set(slim["spec"]["template"]["spec"]) == {"volumes"}


def test_a_multi_node_stage_takes_node_0s_result() -> None:
    """Every pod of an Indexed train Job ends; node 0's termination message is the stage's result."""
    job = with_status(a_job(), job_status("complete", ts(9)))
    pods = []
    for index, (at, message) in enumerate([(ts(5), '{"rank": 0}'), (ts(6), "node 1 done")]):
        pod = a_pod(job, at, 0, message=message)
        pod["metadata"]["name"] += f"-{index}"
        pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = str(index)
        pods.append(pod)
    view = observe_job(job, pods)
    assert view.termination is not None and view.termination.message == '{"rank": 0}'
    assert observe_job(slim_job(job), [slim_pod(p) for p in pods]) == view


def test_slim_copies_of_sparse_objects() -> None:
    assert observe_job(slim_job({})) == observe_job({})
    assert observe_deployment(slim_deployment({})) == observe_deployment({})
    assert observe_job(slim_job({"status": {"active": 1}}), [slim_pod({})]).phase == StagePhase.RUNNING


def test_slim_run_keeps_identity_spec_and_status_but_not_managed_fields_or_kopf() -> None:
    from eagle3_operator.reconcile.slim import slim_run

    body = {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": "r", "namespace": "n", "uid": "u", "generation": 3, "managedFields": [{"x": 1}]},
        "spec": {"verifier": {"model": "m"}},
        "status": {"phase": "Running", "kopf": {"progress": {}}},
    }
    slim = slim_run(body)
    assert slim == {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": "r", "namespace": "n", "uid": "u", "generation": 3},
        "spec": {"verifier": {"model": "m"}},
        "status": {"phase": "Running"},
    }


# --- pods that do not run --------------------------------------------------------------------------------


def waiting(job: dict[str, Any], reason: str, message: str = "", init: bool = False) -> dict[str, Any]:
    pod = pod_of(job, "w", {"waiting": {"reason": reason, "message": message}}, "Pending")
    if init:
        pod["status"]["initContainerStatuses"] = pod["status"].pop("containerStatuses")
    return pod


def test_a_container_that_cannot_start_blocks_the_stage() -> None:
    job = a_job(Stage.PREPARE)
    pod = waiting(job, "ImagePullBackOff", 'Back-off pulling image "eagle3/pipeline:0.1.0"')
    view = observe_job(with_status(job, {"active": 1}), [pod])
    assert view.phase == StagePhase.RUNNING
    name = pod["metadata"]["name"]
    pull = 'Back-off pulling image "eagle3/pipeline:0.1.0"'
    message = f"pod {name}, container prepare: ImagePullBackOff: {pull}"
    assert view.blocked_by == BlockedBy(reason="ImagePullBackOff", message=message)
    missing_secret = blocked_by(
        [waiting(job, "CreateContainerConfigError", 'secret "hf-token" not found', init=True)]
    )
    assert missing_secret is not None and missing_secret.reason == "CreateContainerConfigError"
    assert missing_secret.message.endswith('CreateContainerConfigError: secret "hf-token" not found')


def test_a_crash_looping_container_says_how_it_last_ended() -> None:
    pod = waiting(a_job(), "CrashLoopBackOff", "back-off 5m0s restarting failed container=vllm")
    pod["status"]["phase"] = "Running"
    last = terminated(1, "Error", "...\ntorch.OutOfMemoryError: CUDA out of memory", ts(5))
    pod["status"]["containerStatuses"][0]["lastState"] = {"terminated": last}
    crash = blocked_by([pod])
    assert crash is not None and crash.reason == "CrashLoopBackOff"
    assert crash.message.endswith(
        "CrashLoopBackOff: back-off 5m0s restarting failed container=vllm; last exit code 1: "
        "...\ntorch.OutOfMemoryError: CUDA out of memory"
    )


def test_an_unschedulable_pod_blocks_the_stage_with_the_schedulers_message() -> None:
    pod = pod_of(a_job(), "u", {}, "Pending")
    del pod["status"]["containerStatuses"]
    message = "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."
    pod["status"]["conditions"] = [condition("PodScheduled", "Unschedulable", message) | {"status": "False"}]
    assert blocked_by([pod]) == BlockedBy(
        reason="Unschedulable",
        message=f"pod {pod['metadata']['name']} is not scheduled (Unschedulable): {message}",
    )


@pytest.mark.parametrize(
    ("state", "phase"),
    [
        ({"waiting": {"reason": "ContainerCreating"}}, "Pending"),  # on its way
        ({"running": {"startedAt": ts(1)}}, "Running"),
        ({"waiting": {"reason": "ImagePullBackOff"}}, "Failed"),  # an ended pod blocks nothing
        ({"terminated": terminated(1, at=ts(2))}, "Failed"),
    ],
)
def test_pods_on_their_way_or_ended_block_nothing(state: dict[str, Any], phase: str) -> None:
    assert blocked_by([pod_of(a_job(), "p", state, phase)]) is None

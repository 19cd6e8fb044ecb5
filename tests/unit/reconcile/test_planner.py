"""plan_run scenario by scenario: Kubernetes-shaped children in, actions and status out (observe.py too)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from eagle3_contract.api.status import RunPhase
from eagle3_contract.api.validation import parse_spec, spec_document
from eagle3_contract.exit_codes import OOM_EXIT_CODE
from eagle3_contract.stages import content_hash, plan_stages
from eagle3_operator.builders import names
from eagle3_operator.builders.serving import build_deployment
from eagle3_operator.reconcile.planner import plan_run
from eagle3_operator.reconcile.stage_walk import MAX_RESULT_ATTEMPT
from tests.harness.results import fake_result
from tests.unit.reconcile.planner_world import (
    RUN,
    World,
    condition_of,
    creates,
    keys,
    pod_of,
    tiny,
    ts,
)


def stage_hash(spec: dict[str, Any], stage: str) -> str:
    return next(p.hash for p in plan_stages(parse_spec(spec)) if p.stage.value == stage)


def job_name(spec: dict[str, Any], stage: str, attempt: int = 0) -> str:
    return names.job_name(RUN.name, stage, stage_hash(spec, stage), attempt)


def plan_spec_hash(world: World) -> str:
    return content_hash(spec_document(parse_spec(world.spec)))


def stage_of(job: dict[str, Any]) -> str:
    return str(job["metadata"]["labels"][names.LABEL_STAGE])


def oom(world: World, stage: str, exit_code: int = OOM_EXIT_CODE) -> None:
    """The stage's container ran out of memory: exit 86 (PodFailurePolicy FailJob) or OOMKilled (137)."""
    if exit_code == OOM_EXIT_CODE:
        world.fail(stage, "PodFailurePolicy", "Container exited with 86", OOM_EXIT_CODE, "Error", "CUDA OOM")
    else:
        world.fail(stage, exit_code=exit_code, term_reason="OOMKilled", last_message=None)


# --- a fresh run and the first stage -------------------------------------------------------------------


def test_a_fresh_run_creates_the_claim_the_spec_configmap_and_the_prepare_job_in_order() -> None:
    world = World(tiny())
    plan = world.plan()
    spec_cm = names.spec_configmap_name(RUN.name, plan_spec_hash(world))
    assert keys(plan) == [
        ("create", "PersistentVolumeClaim", "tiny-artifacts"),
        ("create", "ConfigMap", spec_cm),
        ("create", "Job", job_name(world.spec, "prepare")),
    ]
    [job] = creates(plan, "Job")
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["spec"]["configMap"]["name"] == spec_cm
    status = plan.status.document()
    assert plan.phase == status["phase"] == RunPhase.RUNNING
    assert status["currentStage"] == "prepare"
    assert status["observedGeneration"] == 1
    assert status["stages"]["prepare"] == {
        "phase": "Pending",
        "hash": stage_hash(world.spec, "prepare"),
        "jobName": job_name(world.spec, "prepare"),
        "outputDir": f"prepare/{stage_hash(world.spec, 'prepare')}",
        "attempts": 1,
    }
    assert status["stages"]["generate"]["phase"] == "Skipped"
    assert status["stages"]["verify"]["phase"] == "Skipped"  # it checks pinned drafts only
    assert "export computed" in status["stages"]["verify"]["message"]
    assert status["stages"]["predict"]["phase"] == "Skipped"  # evaluation.predict is off by default
    skipped = ("prepare", "generate", "verify", "predict")
    others = {s["phase"] for k, s in status["stages"].items() if k not in skipped}
    assert others == {"Pending"}
    assert condition_of(status, "SpecValid")["status"] == "True"
    assert condition_of(status, "Progressing")["reason"] == "StageRunning"
    assert condition_of(status, "Ready")["status"] == "False"
    assert condition_of(status, "Failed")["status"] == "False"
    assert plan.finished == () and plan.problems == ()


def test_an_existing_claim_is_not_created() -> None:
    world = World(tiny(storage={"artifacts": {"claimName": "shared-artifacts"}}))
    assert [k for _, k, _ in keys(world.plan())] == ["ConfigMap", "Job"]


def test_a_running_stage_needs_no_action() -> None:
    world = World(tiny())
    world.step()
    assert world.plan().actions == ()  # created, still Pending: nothing more to do
    world.start("prepare")
    plan = world.plan()
    assert plan.actions == ()
    assert plan.status.document()["stages"]["prepare"]["phase"] == "Running"
    assert plan.status.document()["stages"]["prepare"]["startTime"] == ts(0)
    assert plan.phase == RunPhase.RUNNING


def test_a_succeeded_stage_records_its_result_and_starts_the_next() -> None:
    world = World(tiny())
    world.step()
    world.start("prepare")
    world.succeed("prepare", {"samples": 240, "skipped": {"tooLong": 3}}, seconds=90)
    plan = world.step()
    assert keys(plan) == [("create", "Job", job_name(world.spec, "extract"))]
    prepare = plan.status.document()["stages"]["prepare"]
    assert prepare["phase"] == "Succeeded"
    assert prepare["result"] == {"samples": 240, "skipped": {"tooLong": 3}}
    assert (prepare["startTime"], prepare["completionTime"]) == (ts(0), ts(90))
    assert plan.finished == (("prepare", 90.0),)
    assert plan.status.document()["currentStage"] == "extract"
    # reported once: the next reconcile has nothing new to tell the metrics
    assert world.step().finished == ()


def test_a_text_termination_message_is_kept_as_the_message() -> None:
    world = World(tiny())
    world.step()
    world.succeed("prepare", "done, no JSON here")
    assert world.plan().status.document()["stages"]["prepare"]["result"] == {"message": "done, no JSON here"}


def test_a_completed_job_whose_pod_has_not_terminated_is_still_running() -> None:
    world = World(tiny())
    world.step()
    world.start("prepare")
    world.succeed("prepare", pod_terminated=False)  # the Job says Complete; the pod's status lags
    plan = world.plan()
    assert plan.actions == ()
    assert plan.status.document()["stages"]["prepare"]["phase"] == "Running"
    assert plan.status.document()["stages"]["prepare"]["message"] == "waiting for the stage's result"
    assert plan.finished == ()


def test_independent_stages_run_one_after_another_to_export() -> None:
    world = World(tiny())
    order = []
    plan = world.step()
    while jobs := creates(plan, "Job"):
        [job] = jobs
        order.append(stage_of(job))
        world.succeed(stage_of(job))
        plan = world.step()
    assert order == ["prepare", "extract", "vocab", "train", "evaluate", "export"]


# --- failures ------------------------------------------------------------------------------------------


def test_a_failed_job_fails_the_run_with_its_reason_and_last_message() -> None:
    world = World(tiny())
    world.run_to("extract")
    world.fail("extract", last_message="Traceback ...\nValueError: layer 99 does not exist")
    plan = world.step()
    assert plan.actions == ()
    assert plan.phase == plan.status.document()["phase"] == RunPhase.FAILED
    failed = condition_of(plan.status.document(), "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "BackoffLimitExceeded")
    assert "ValueError: layer 99 does not exist" in failed["message"]
    assert "Job has reached the specified backoff limit" in failed["message"]
    assert failed["message"].startswith("stage extract: ")
    assert condition_of(plan.status.document(), "Progressing")["reason"] == "Failed"
    extract = plan.status.document()["stages"]["extract"]
    assert extract["phase"] == "Failed" and "ValueError" in extract["message"]
    assert plan.status.document()["currentStage"] == "extract"
    assert world.step().actions == ()  # stays failed: no retry until the spec changes or the Job is deleted


def test_a_failed_stage_reports_the_error_its_program_wrote_not_the_json_around_it() -> None:
    """Issue 28, item 5: a stage program's termination message is `{"error": ...}` (and more fields); the
    stage's message and the run's condition carry the error itself."""
    world = World(tiny())
    world.step()
    said = "stage prepare: dataset.source /data/x.jsonl: no rows (the file is empty, or every file is)"
    world.fail("prepare", last_message=json.dumps({"error": said, "reason": None}))
    status = world.plan().status.document()
    assert status["stages"]["prepare"]["message"].endswith(
        f"(Job has reached the specified backoff limit): {said}"
    )
    failed = condition_of(status, "Failed")
    assert said in failed["message"] and '{"error"' not in failed["message"]


def test_a_failed_job_without_pods_names_the_job_condition() -> None:
    world = World(tiny())
    world.step()
    world.fail("prepare", reason="DeadlineExceeded", message="Job was active longer than specified deadline")
    world.pods.clear()
    failed = condition_of(world.plan().status.document(), "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    assert "Job was active longer than specified deadline" in failed["message"]
    assert "last message" not in failed["message"]


def test_deleting_a_failed_job_retries_the_stage_as_the_next_attempt() -> None:
    world = World(tiny())
    world.step()
    world.fail("prepare")
    world.step()
    del world.jobs[job_name(world.spec, "prepare")]
    plan = world.step()
    assert keys(plan) == [("create", "Job", job_name(world.spec, "prepare", 1))]
    assert plan.phase == RunPhase.RUNNING
    assert condition_of(plan.status.document(), "Failed")["status"] == "False"


def test_an_out_of_memory_exit_retries_with_half_the_token_budget() -> None:
    world = World(tiny(extraction={"tokenBudget": 1024}))
    world.run_to("extract")
    oom(world, "extract")
    plan = world.step()
    [job] = creates(plan, "Job")
    assert keys(plan) == [("create", "Job", job_name(world.spec, "extract", 1))]
    assert job["metadata"]["name"].endswith("-r1")
    assert job["metadata"]["annotations"][names.ANNOTATION_TOKEN_BUDGET] == "512"
    assert job["metadata"]["labels"][names.LABEL_ATTEMPT] == "1"
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--token-budget", "512"]
    extract = plan.status.document()["stages"]["extract"]
    assert (extract["phase"], extract["attempts"], extract["tokenBudget"]) == ("Pending", 2, 512)
    assert "out of memory at a token budget of 1024; retrying with 512" in extract["message"]
    assert plan.phase == RunPhase.RUNNING
    assert condition_of(plan.status.document(), "Failed")["status"] == "False"


def test_an_oom_killed_container_retries_too() -> None:
    world = World(tiny(extraction={"tokenBudget": 1024}))
    world.run_to("extract")
    oom(world, "extract", exit_code=137)
    [job] = creates(world.step(), "Job")
    assert job["metadata"]["annotations"][names.ANNOTATION_TOKEN_BUDGET] == "512"


def test_repeated_out_of_memory_stops_at_the_sequence_length_floor() -> None:
    # tokenBudget 1024, maxSequenceLength 256: 1024 -> 512 -> 256 -> fail
    world = World(tiny(extraction={"tokenBudget": 1024}, dataset={"maxSequenceLength": 256}))
    world.run_to("extract")
    budgets = []
    for _ in range(5):
        budgets.append(int(world.job("extract")["metadata"]["annotations"][names.ANNOTATION_TOKEN_BUDGET]))
        oom(world, "extract")
        plan = world.step()
        if plan.phase == RunPhase.FAILED:
            break
    assert budgets == [1024, 512, 256]
    assert plan.actions == ()
    failed = condition_of(plan.status.document(), "Failed")
    assert failed["reason"] == "OutOfMemory"
    assert "even at a token budget of 256" in failed["message"]
    assert "halving stops at 256" in failed["message"]
    assert "verifier.tensorParallelSize" in failed["message"]  # says what to do
    assert plan.status.document()["stages"]["extract"]["attempts"] == 3


def test_out_of_memory_in_a_stage_without_a_token_budget_fails_at_once() -> None:
    world = World(tiny())
    world.run_to("train")
    oom(world, "train", exit_code=137)
    plan = world.step()
    assert plan.actions == ()
    assert plan.phase == RunPhase.FAILED
    assert condition_of(plan.status.document(), "Failed")["reason"] == "OutOfMemory"
    assert "tiny-train-" in condition_of(plan.status.document(), "Failed")["message"]


# --- suspend -------------------------------------------------------------------------------------------


def test_a_suspended_run_creates_nothing() -> None:
    world = World(tiny(suspend=True))
    plan = world.plan()
    assert plan.actions == ()
    assert plan.phase == RunPhase.SUSPENDED
    assert condition_of(plan.status.document(), "Progressing")["reason"] == "Suspended"
    assert "spec.suspend" in plan.status.document()["stages"]["prepare"]["message"]


def test_suspending_between_stages_holds_the_next_job_and_resuming_creates_it() -> None:
    world = World(tiny())
    world.step()
    world.succeed("prepare")
    world.edit(suspend=True)
    plan = world.step()
    assert creates(plan, "Job") == []
    assert plan.phase == RunPhase.SUSPENDED
    assert plan.status.document()["stages"]["prepare"]["phase"] == "Succeeded"
    world.edit(suspend=False)
    assert [stage_of(j) for j in creates(world.step(), "Job")] == ["extract"]


def test_a_pod_that_cannot_pull_its_image_is_reported_until_it_runs() -> None:
    world = World(tiny())
    world.run_to("prepare")
    job = world.job("prepare")
    job["status"] = {"startTime": ts(0), "active": 1}
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    world.pods[job["metadata"]["name"]] = pod_of(job, "a", waiting, "Pending")
    plan = world.step()
    assert creates(plan) == [] and plan.phase == RunPhase.RUNNING, "the Job does not fail; the run waits"
    blocked = plan.status.document()["stages"]["prepare"]["blockedBy"]["message"]
    assert plan.status.document()["stages"]["prepare"]["blockedBy"]["reason"] == "ImagePullBackOff"
    assert blocked.endswith("container prepare: ImagePullBackOff: Back-off pulling image")
    progressing = condition_of(plan.status.document(), "Progressing")
    assert (progressing["reason"], progressing["message"]) == ("PodNotRunning", f"stage prepare: {blocked}")
    world.start("prepare")  # the image arrived
    plan = world.step()
    assert "blockedBy" not in plan.status.document()["stages"]["prepare"]
    assert condition_of(plan.status.document(), "Progressing")["reason"] == "StageRunning"


# --- the acceptance gate, export and serving -----------------------------------------------------------


def gated(gate: float = 1.5) -> World:
    return World(tiny(evaluation={"minAcceptanceLength": gate}))


def test_a_draft_below_the_gate_fails_and_is_not_exported() -> None:
    world = gated(2.0)
    world.run_to("evaluate")
    world.succeed("evaluate", {"acceptanceLength": 1.6})
    plan = world.step()
    assert creates(plan) == []
    assert plan.phase == RunPhase.FAILED
    failed = condition_of(plan.status.document(), "Failed")
    assert failed["reason"] == "AcceptanceBelowGate"
    assert "1.600 is below evaluation.minAcceptanceLength 2.0" in failed["message"]
    gate = condition_of(plan.status.document(), "GatePassed")
    assert (gate["status"], gate["reason"]) == ("False", "AcceptanceBelowGate")
    assert plan.status.document()["acceptanceLength"] == 1.6
    assert plan.status.document()["stages"]["export"]["phase"] == "Pending"
    assert plan.status.checkpoint is None and plan.status.serving is None


def test_an_evaluation_without_acceptance_length_cannot_pass_a_gate() -> None:
    world = gated()
    world.run_to("evaluate")
    world.succeed("evaluate", {"acceptanceRate": 0.3})
    plan = world.step()
    assert plan.phase == RunPhase.FAILED
    assert condition_of(plan.status.document(), "Failed")["reason"] == "EvaluationIncomplete"


def test_a_draft_with_an_inconsistent_mapping_fails_even_without_a_gate() -> None:
    world = World(tiny())  # no evaluation.minAcceptanceLength
    world.run_to("evaluate")
    world.succeed("evaluate", {"acceptanceLength": 3.0, "mappingConsistent": False})
    plan = world.step()
    assert creates(plan) == [] and plan.phase == RunPhase.FAILED
    gate = condition_of(plan.status.document(), "GatePassed")
    assert (gate["status"], gate["reason"]) == ("False", "MappingInconsistent")
    assert "re-run stages vocab and train" in condition_of(plan.status.document(), "Failed")["message"]


def test_a_draft_above_the_gate_is_exported_then_served() -> None:
    world = gated(1.5)
    world.run_to("evaluate")
    world.succeed("evaluate", {"acceptanceLength": 1.6})
    plan = world.step()
    assert keys(plan) == [("create", "Job", job_name(world.spec, "export"))]
    assert condition_of(plan.status.document(), "GatePassed")["status"] == "True"
    world.succeed("export", {"sha256": "cd" * 32, "bytes": 4096})
    plan = world.step()
    vllm = names.serving_name(RUN.name)
    assert keys(plan) == [("create", "Deployment", vllm), ("create", "Service", vllm)]
    export_dir = f"export/{stage_hash(world.spec, 'export')}"
    assert plan.status.document()["checkpoint"] == {
        "path": export_dir, "sha256": "cd" * 32, "bytes": 4096, "acceptanceLength": 1.6,
    }  # fmt: skip
    [deployment] = creates(plan, "Deployment")
    assert deployment["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_DRAFT] == export_dir
    [check] = deployment["spec"]["template"]["spec"]["initContainers"]  # the pods check export's digest
    assert check["command"][-2] == "cd" * 32
    assert plan.status.document()["serving"]["draft"] == export_dir
    assert plan.status.document()["serving"]["readyReplicas"] == 0
    assert plan.phase == RunPhase.RUNNING and plan.status.document()["currentStage"] == "serve"
    assert condition_of(plan.status.document(), "Progressing")["reason"] == "StagesComplete"
    world.ready(1)
    plan = world.step()
    assert plan.actions == ()
    assert plan.phase == RunPhase.SERVING
    assert condition_of(plan.status.document(), "Ready")["status"] == "True"
    assert plan.status.document()["serving"]["readyReplicas"] == 1


def test_a_pod_monitor_only_where_the_api_serves_pod_monitors() -> None:
    for served in (False, True):
        world = World(tiny(), pod_monitors_served=served)
        plan = world.run_to("none")
        kinds = [k for _, k, _ in keys(plan)]
        assert ("PodMonitor" in kinds) is served
        assert world.step().actions == ()


def test_a_changed_serving_spec_patches_the_deployment_and_reruns_nothing() -> None:
    world = World(tiny())
    world.run_to("none")
    world.edit(serving={"replicas": 3, "numSpeculativeTokens": 5})
    plan = world.step()
    assert keys(plan) == [("patch", "Deployment", names.serving_name(RUN.name))]
    [patch] = plan.actions
    assert patch.body["spec"]["replicas"] == 3
    assert world.step().actions == ()


def test_removing_placement_removes_it_from_the_deployment() -> None:
    """The patch is a merge patch: keys the new Deployment lacks must be cleared, not left as they were."""
    pool = {
        "nodeSelector": {"pool": "h200"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "affinity": {"podAntiAffinity": {}},
    }
    world = World(tiny(nodePool=pool))
    world.run_to("none")
    assert world.deployment is not None
    assert world.deployment["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "h200"}
    world.edit(nodePool={"nodeSelector": {}, "tolerations": [], "affinity": {}})
    plan = world.step()
    assert keys(plan) == [("patch", "Deployment", names.serving_name(RUN.name))]
    draft = f"export/{stage_hash(world.spec, 'export')}"
    wanted = build_deployment(RUN, parse_spec(world.spec), draft, fake_result("export")["sha256"])
    assert world.deployment["spec"] == wanted["spec"]
    assert world.deployment["metadata"] == wanted["metadata"]
    assert world.step().actions == ()


def test_a_deployment_with_another_spec_hash_is_patched() -> None:
    world = World(tiny())
    world.run_to("none")
    assert world.deployment is not None
    world.deployment["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH] = "0" * 12
    assert keys(world.plan()) == [("patch", "Deployment", names.serving_name(RUN.name))]


def test_disabling_serving_deletes_the_deployment_and_service() -> None:
    world = World(tiny())
    world.run_to("none")
    world.ready(1)
    world.edit(serving={"enabled": False})
    plan = world.step()
    vllm = names.serving_name(RUN.name)
    assert keys(plan) == [("delete", "Deployment", vllm), ("delete", "Service", vllm)]
    assert plan.phase == RunPhase.SUCCEEDED
    assert plan.status.serving is None
    assert condition_of(plan.status.document(), "Ready")["message"] == "serving.enabled is false"
    assert world.step().actions == ()


def test_disabling_serving_deletes_the_pod_monitor_too() -> None:
    world = World(tiny(), pod_monitors_served=True)
    world.run_to("none")
    world.edit(serving={"enabled": False})
    plan = world.step()
    vllm = names.serving_name(RUN.name)
    assert keys(plan) == [
        ("delete", "Deployment", vllm),
        ("delete", "Service", vllm),
        ("delete", "PodMonitor", vllm),
    ]
    assert plan.actions[-1].body["apiVersion"] == "monitoring.coreos.com/v1"
    assert ("PodMonitor", vllm) not in world.objects


def test_a_service_and_pod_monitor_from_an_older_operator_are_patched_once() -> None:
    world = World(tiny(), pod_monitors_served=True)
    world.run_to("none")
    vllm = names.serving_name(RUN.name)
    monitor = world.objects[("PodMonitor", vllm)]
    del monitor["metadata"]["annotations"]  # as an operator before the spec hash made it: no run relabeling
    monitor["spec"]["podMetricsEndpoints"][0].pop("relabelings")
    world.objects[("Service", vllm)]["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH] = "stale"
    plan = world.step()
    assert keys(plan) == [("patch", "Service", vllm), ("patch", "PodMonitor", vllm)]
    [endpoint] = world.objects[("PodMonitor", vllm)]["spec"]["podMetricsEndpoints"]
    assert {r["targetLabel"] for r in endpoint["relabelings"]} == {"run", "namespace", "track"}
    assert keys(world.step()) == [], "converged: nothing more to write"


def test_a_crash_looping_vllm_pod_is_why_the_run_is_not_ready() -> None:
    world = World(tiny())
    world.run_to("none")
    assert world.deployment is not None
    crash = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}
    replica_set = {"metadata": {"name": "tiny-vllm-x", "namespace": RUN.namespace}}
    pod = pod_of(replica_set | {"spec": world.deployment["spec"]}, "a", crash, "Running")  # the pod template
    pod["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 1, "message": "bad args"}
    }
    world.pods["tiny-vllm-x"] = pod
    plan = world.step()
    assert plan.status.document()["serving"]["blockedBy"]["reason"] == "CrashLoopBackOff"
    blocked = plan.status.document()["serving"]["blockedBy"]["message"]
    assert blocked.endswith(
        "CrashLoopBackOff: back-off 40s restarting failed container; last exit code 1: bad args"
    )
    ready = condition_of(plan.status.document(), "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "PodNotRunning", blocked)
    world.ready(1)
    del world.pods["tiny-vllm-x"]
    plan = world.step()
    assert "blockedBy" not in plan.status.document()["serving"]
    assert condition_of(plan.status.document(), "Ready")["status"] == "True"


def test_a_draft_failing_its_gate_leaves_the_serving_deployment_alone() -> None:
    world = gated(1.5)
    world.run_to("none")
    world.ready(1)
    served = copy.deepcopy(world.deployment)
    assert served is not None
    world.edit(training={"learningRate": 0.5})
    world.run_to("evaluate")
    world.succeed("evaluate", {"acceptanceLength": 1.1})
    plan = world.step()
    assert plan.phase == RunPhase.FAILED
    assert [a for a in plan.actions if a.body["kind"] in ("Deployment", "Service")] == []
    assert world.deployment == served
    old_draft = served["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_DRAFT]
    assert plan.status.document()["serving"]["draft"] == old_draft
    assert plan.status.document()["checkpoint"]["path"] == old_draft


def test_a_pinned_checkpoint_without_a_sha256_is_served_without_running_a_stage() -> None:
    pinned = {"path": "/artifacts/export/abc"}
    world = World(tiny(serving={"pinnedCheckpoint": pinned}))
    plan = world.step()
    assert [k for _, k, _ in keys(plan)] == ["PersistentVolumeClaim", "Deployment", "Service"]
    assert plan.status.document()["checkpoint"] == pinned
    assert {s["phase"] for s in plan.status.document()["stages"].values()} == {"Skipped"}
    assert "sha256 is not set" in plan.status.document()["stages"]["verify"]["message"]
    assert "initContainers" not in creates(plan, "Deployment")[0]["spec"]["template"]["spec"]


# --- spec edits: stale Jobs and ConfigMaps -------------------------------------------------------------


def test_an_edit_deletes_the_running_job_of_the_old_hash_and_starts_the_new_one() -> None:
    world = World(tiny())
    world.run_to("train")
    world.start("train")
    old = job_name(world.spec, "train")
    world.edit(training={"learningRate": 3e-4})
    plan = world.step()
    assert keys(plan) == [
        ("create", "ConfigMap", names.spec_configmap_name(RUN.name, plan_spec_hash(world))),
        ("delete", "Job", old),
        ("create", "Job", job_name(world.spec, "train")),
    ]
    assert world.step().actions == ()


def test_an_upstream_edit_deletes_running_jobs_of_later_stages_too() -> None:
    """The walk stops at the first stage to re-run; a later stage's old Job would hold GPUs until then."""
    world = World(tiny())
    world.run_to("train")
    world.start("train")
    old = job_name(world.spec, "train")
    world.edit(dataset={"seed": 7})
    plan = world.step()
    assert ("delete", "Job", old) in keys(plan)
    assert [stage_of(j) for j in creates(plan, "Job")] == ["prepare"]


def test_pinning_a_checkpoint_deletes_the_running_stage_jobs() -> None:
    world = World(tiny())
    world.run_to("train")
    world.start("train")
    world.edit(serving={"pinnedCheckpoint": {"path": "/artifacts/export/abc"}})
    plan = world.step()
    assert ("delete", "Job", job_name(world.spec, "train")) in keys(plan)
    assert creates(plan, "Job") == []


def test_disabling_regeneration_deletes_the_running_generate_job() -> None:
    world = World(tiny(regeneration={"enabled": True}))
    world.run_to("generate")
    world.start("generate")
    running = world.job("generate")["metadata"]["name"]
    world.edit(regeneration={"enabled": False})
    plan = world.step()
    assert ("delete", "Job", running) in keys(plan)
    assert [stage_of(j) for j in creates(plan, "Job")] == ["extract"]  # now reading prepare's output
    assert plan.status.document()["stages"]["generate"]["phase"] == "Skipped"


def test_finished_jobs_of_an_old_hash_are_kept() -> None:
    world = World(tiny())
    world.run_to("vocab")  # extract succeeded, vocab (same hash after the edit) pending
    world.edit(extraction={"dtype": "float16"})
    plan = world.step()
    assert [a for a in plan.actions if a.verb == "delete"] == []
    assert [stage_of(j) for j in creates(plan, "Job")] == ["extract"]


def test_spec_configmaps_no_job_mounts_are_deleted() -> None:
    world = World(tiny())
    world.step()
    mounted = next(name for kind, name in world.objects if kind == "ConfigMap")
    for stale in ("tiny-spec-000000000000", "tiny-spec-111111111111"):
        world.objects[("ConfigMap", stale)] = {"kind": "ConfigMap", "metadata": {"name": stale}}
    plan = world.plan()
    assert keys(plan) == [
        ("delete", "ConfigMap", "tiny-spec-000000000000"),
        ("delete", "ConfigMap", "tiny-spec-111111111111"),
    ]
    assert all(a.body["metadata"]["namespace"] == RUN.namespace for a in plan.actions)
    # an edit that re-runs nothing yet: the old ConfigMap stays while a Job mounts it
    world.apply(plan.actions)
    world.edit(serving={"replicas": 2})
    assert ("delete", "ConfigMap", mounted) not in keys(world.plan())
    del world.jobs[job_name(world.spec, "prepare")]
    world.status = None
    assert ("delete", "ConfigMap", mounted) in keys(world.plan())


# --- status as memory ----------------------------------------------------------------------------------


def test_a_remembered_success_survives_its_job_being_deleted() -> None:
    world = World(tiny())
    world.run_to("vocab")
    for stage in ("prepare", "extract"):
        del world.jobs[job_name(world.spec, stage)]
    world.pods.clear()
    plan = world.step()
    assert creates(plan, "Job") == []
    for stage in ("prepare", "extract"):
        assert plan.status.document()["stages"][stage]["phase"] == "Succeeded"
        assert plan.status.document()["stages"][stage]["result"] == fake_result(stage)
    assert plan.finished == ()


def test_a_remembered_result_survives_the_pods_of_a_kept_job_being_deleted() -> None:
    """Pods of a finished Job may go (pod GC, eviction, a node removed) while the Job stays."""
    world = gated(1.5)
    world.run_to("none")
    world.pods.clear()
    plan = world.step()
    assert plan.actions == ()
    assert plan.phase != RunPhase.FAILED
    assert plan.status.document()["stages"]["evaluate"]["result"] == fake_result("evaluate")
    assert plan.status.document()["checkpoint"]["sha256"] == fake_result("export")["sha256"]


def test_a_status_of_another_spec_hash_is_not_trusted() -> None:
    world = World(tiny())
    world.run_to("extract")
    world.jobs.clear()
    world.pods.clear()
    world.edit(dataset={"seed": 3})
    assert [stage_of(j) for j in creates(world.step(), "Job")] == ["prepare"]


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    world = World(tiny())
    first = world.step(now=ts(0))
    again = world.plan(now=ts(100))
    assert again.status.document()["conditions"] == first.status.document()["conditions"]
    world.fail("prepare")
    failed = world.plan(now=ts(200))
    times = {c["type"]: c["lastTransitionTime"] for c in failed.status.document()["conditions"]}
    assert times == {
        "SpecValid": ts(0),
        "PodSecurity": ts(0),
        "Progressing": ts(200),
        "Ready": ts(0),
        "Failed": ts(200),
    }


def test_an_unreadable_previous_status_counts_as_empty() -> None:
    world = World(tiny())
    world.status = {"phase": "Exploded", "stages": {"prepare": {"phase": 3}}}
    plan = world.plan()
    assert [k for _, k, _ in keys(plan)] == ["PersistentVolumeClaim", "ConfigMap", "Job"]


# --- invalid specs -------------------------------------------------------------------------------------


def test_an_invalid_spec_creates_nothing_and_says_where_it_is_wrong() -> None:
    world = World(tiny(training={"gpus": "two"}))
    plan = world.plan()
    assert plan.actions == ()
    assert plan.phase == plan.status.document()["phase"] == RunPhase.INVALID
    assert plan.problems and plan.problems[0].startswith("spec.training.gpus: ")
    valid = condition_of(plan.status.document(), "SpecValid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert "spec.training.gpus" in valid["message"] and "Fix the spec" in valid["message"]


def test_an_invalid_edit_keeps_what_the_run_did() -> None:
    world = World(tiny())
    world.run_to("extract")
    world.edit(verifier={"tensorParallelSize": 0})
    plan = world.step(now=ts(500))
    assert plan.actions == ()
    assert plan.status.document()["observedGeneration"] == 2
    assert plan.status.document()["stages"]["prepare"]["phase"] == "Succeeded"
    assert condition_of(plan.status.document(), "SpecValid")["lastTransitionTime"] == ts(500)
    assert condition_of(plan.status.document(), "Failed")["status"] == "False"  # kept from before


def test_a_spec_that_is_no_object_is_invalid() -> None:
    plan = plan_run(RUN, 1, None, None, World(tiny()).observed(), ts(0))
    assert plan.phase == RunPhase.INVALID and plan.problems == ("spec: expected an object, got NoneType",)


# --- a completed Job whose result was lost (issue 13, item 15) -------------------------------------------


def _lose_pod(world: World, stage: str) -> None:
    """The stage's Job completed, but its pod went (node scale-down, pod GC) before its result was read."""
    job = world.succeed(stage, pod_terminated=False)
    del world.pods[job["metadata"]["name"]]


def test_a_completed_evaluation_whose_result_was_lost_is_rerun_not_failed() -> None:
    world = gated(1.5)
    world.run_to("evaluate")
    _lose_pod(world, "evaluate")
    plan = world.step()
    assert keys(plan) == [("create", "Job", job_name(world.spec, "evaluate", 1))]
    assert plan.phase != RunPhase.FAILED
    assert condition_of(plan.status.document(), "Failed")["status"] == "False"
    evaluate = plan.status.document()["stages"]["evaluate"]
    assert (evaluate["phase"], evaluate["attempts"]) == ("Pending", 2)
    assert "result could not be read" in evaluate["message"] and "re-reads it" in evaluate["message"]
    assert plan.finished == ()
    world.succeed("evaluate")  # the program finds its output complete and reports its result again
    plan = world.step()
    assert plan.status.document()["stages"]["evaluate"]["result"] == fake_result("evaluate")
    assert condition_of(plan.status.document(), "GatePassed")["status"] == "True"
    assert [stage_of(j) for j in creates(plan, "Job")] == ["export"]


def test_a_lost_result_of_any_stage_reruns_it_before_the_next_stage_starts() -> None:
    world = World(tiny())
    world.step()
    _lose_pod(world, "prepare")
    plan = world.step()
    assert keys(plan) == [("create", "Job", job_name(world.spec, "prepare", 1))]
    assert plan.status.document()["stages"]["prepare"]["phase"] == "Pending"


def test_a_completed_job_the_watch_shows_no_pod_of_is_confirmed_with_the_server_before_a_rerun() -> None:
    """Issue 40: the pod watch may lag behind the Job watch. A completed Job whose pod the watch has not shown
    is not re-run on that view alone: the plan names it (the executor lists the run's pods) and starts
    nothing; with the server's listing, a pod that is there is read, and only a pod that is gone re-runs."""
    world = World(tiny())
    world.step()
    job = world.succeed("prepare")
    pod = world.pods.pop(job["metadata"]["name"])  # not in the watch's view yet
    watched = plan_run(world.ref, world.generation, world.spec, world.status, world.observed(), ts(1))
    assert watched.unconfirmed == (job["metadata"]["name"],)
    assert not creates(watched, "Job"), "no second Job for the stage on the watch's word alone"
    prepare = watched.status.document()["stages"]["prepare"]
    assert (prepare["phase"], prepare["message"]) == ("Running", "waiting for the stage's result")
    world.pods[job["metadata"]["name"]] = pod  # the server's listing has it
    listed = world.observed(listed=watched.unconfirmed)
    plan = plan_run(world.ref, world.generation, world.spec, world.status, listed, ts(1))
    assert plan.unconfirmed == ()
    assert plan.status.document()["stages"]["prepare"]["result"] == fake_result("prepare")
    assert [stage_of(j) for j in creates(plan, "Job")] == ["extract"]
    del world.pods[job["metadata"]["name"]]  # the server's listing has no pod either: it is gone
    gone = plan_run(
        world.ref,
        world.generation,
        world.spec,
        world.status,
        world.observed(listed=watched.unconfirmed),
        ts(1),
    )
    assert keys(gone) == [("create", "Job", job_name(world.spec, "prepare", 1))]


def test_deleting_a_job_remembered_as_succeeded_without_a_result_starts_the_next_attempt() -> None:
    """A status written by an operator that took a lost result for a success: deleting the Job retries."""
    world = gated(1.5)
    world.run_to("evaluate")
    world.succeed("evaluate")
    world.step()
    assert world.status is not None
    world.status["stages"]["evaluate"]["result"] = None  # as the operator before this fix recorded it
    del world.jobs[job_name(world.spec, "evaluate")]
    world.pods.clear()
    plan = world.step()
    assert keys(plan) == [("create", "Job", job_name(world.spec, "evaluate", 1))]
    assert plan.phase != RunPhase.FAILED


def test_results_lost_again_and_again_end_in_a_message_instead_of_endless_attempts() -> None:
    world = World(tiny())
    world.step()
    for attempt in range(1, MAX_RESULT_ATTEMPT + 1):
        _lose_pod(world, "prepare")
        assert keys(world.step()) == [("create", "Job", job_name(world.spec, "prepare", attempt))]
    _lose_pod(world, "prepare")
    plan = world.step()
    prepare = plan.status.document()["stages"]["prepare"]
    assert prepare["phase"] == "Succeeded" and prepare.get("result") is None
    assert "could not be read after" in prepare["message"] and "termination message" in prepare["message"]


# --- the Pod Security floor (issue 42, item 5) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "level"),
    [
        ({}, "restricted"),
        ({"containerSecurityContext": {"allowPrivilegeEscalation": True}}, "baseline"),
        ({"containerSecurityContext": {"privileged": True}}, "privileged"),
        ({"containerSecurityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}, "privileged"),
        ({"securityContext": {"runAsUser": 0, "runAsNonRoot": False}}, "baseline"),
    ],
)
def test_a_spec_below_the_floor_is_refused_before_anything_is_created(
    pod: dict[str, Any], level: str
) -> None:
    """The operator's service account creates the pods for whoever may create an Eagle3Run: by default a
    spec.pod below "restricted" is refused, naming the level, the fields and who may lower the floor."""
    observed = World(tiny()).observed()
    spec = tiny(pod=pod)
    for floor in ("restricted", "baseline", "privileged"):
        plan = plan_run(RUN, 1, spec, None, observed, ts(0), floor)
        below = ("privileged", "baseline", "restricted").index(level) < (
            "privileged",
            "baseline",
            "restricted",
        ).index(floor)
        assert (plan.phase == RunPhase.INVALID) == below, (level, floor)
        if below:
            assert plan.actions == ()
            [problem] = plan.problems
            assert f"at the Pod Security level '{level}', below this operator's minimum '{floor}'" in problem
            assert "spec.pod." in problem and "podSecurity.minimumLevel" in problem
        else:
            assert plan.actions, (level, floor)


def test_pods_that_never_start_are_refused_whatever_the_floor() -> None:
    """runAsUser 0 under the default runAsNonRoot true: the kubelet would refuse every container."""
    spec = tiny(pod={"securityContext": {"runAsUser": 0}})
    plan = plan_run(RUN, 1, spec, None, World(tiny()).observed(), ts(0), "privileged")
    assert plan.phase == RunPhase.INVALID and plan.actions == ()
    assert plan.problems[0].startswith(
        "spec.pod.containerSecurityContext: runAsUser 0 with runAsNonRoot true"
    )


def test_the_exported_checkpoint_carries_evaluates_acceptance_per_category() -> None:
    world = gated(1.5)
    world.run_to("evaluate")
    rows = [
        {"category": "add", "prompts": 3, "acceptanceLength": 2.4, "acceptanceRate": 0.47, "speedup": 1.6},
        {"category": "other", "prompts": 2, "acceptanceLength": 1.2, "acceptanceRate": 0.07, "speedup": 0.9},
    ]
    world.succeed("evaluate", {"acceptanceLength": 1.6, "categories": rows})
    world.step()
    world.succeed("export", {"sha256": "cd" * 32, "bytes": 4096})
    checkpoint = world.step().status.document()["checkpoint"]
    assert checkpoint["categories"] == rows  # as evaluate wrote them, for the canary to compare later

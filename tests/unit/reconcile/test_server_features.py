"""What an older API server lacks, and what the operator does instead (reconcile.server_features)."""

from __future__ import annotations

import json
from typing import Any

from eagle3_contract.api.status import StagePhase
from eagle3_contract.exit_codes import CHECK_FAILED_EXIT_CODE, OOM_EXIT_CODE
from eagle3_operator.builders import names
from eagle3_operator.reconcile.run_report import run_report
from eagle3_operator.reconcile.server_features import ServerFeatures, server_features
from tests.unit.reconcile.planner_world import (
    RUN,
    World,
    condition_of,
    creates,
    keys,
    pod_of,
    terminated,
    tiny,
    ts,
)

KUBE_1_20 = ServerFeatures("v1.20.2", 20)


def test_the_version_is_read_from_the_servers_version_document():
    assert server_features({"major": "1", "minor": "20", "gitVersion": "v1.20.2"}) == KUBE_1_20
    assert server_features({"major": "1", "minor": "28+", "gitVersion": "v1.28.3-gke.1"}).minor == 28
    assert server_features({"major": "1", "minor": "", "gitVersion": "v1.31.0"}).minor == 31
    assert server_features(None) == ServerFeatures()  # no answer: taken for a current server


def test_a_current_or_unknown_server_needs_no_fallback_and_1_20_needs_three():
    assert ServerFeatures().fallbacks() == [] and ServerFeatures("v1.30.1", 30).fallbacks() == []
    assert not KUBE_1_20.pod_failure_policy and not KUBE_1_20.indexed_jobs and not KUBE_1_20.cel
    said = " ".join(KUBE_1_20.fallbacks())
    assert "podFailurePolicy" in said and "Indexed Jobs" in said and "CEL" in said
    assert ServerFeatures("v1.25.0", 25).fallbacks() == [ServerFeatures("v1.20.2", 20).fallbacks()[0]]


def ended_while_running(world: World, stage: str, exit_code: int, message: str) -> dict[str, Any]:
    """The stage's pod ended with `exit_code`; its Job is still active, as a server that ignores the Job's
    podFailurePolicy leaves it (its controller would start the same attempt again)."""
    job = world.start(stage)
    ended = {"terminated": terminated(exit_code, None, message, ts(world.clock))}
    world.pods[job["metadata"]["name"]] = pod_of(job, "a", ended, "Failed")
    return job


def test_without_pod_failure_policy_an_out_of_memory_exit_fails_the_job_here_and_retries_at_half():
    world = World(tiny(extraction={"tokenBudget": 1024}), features=KUBE_1_20)
    world.run_to("extract")
    first = ended_while_running(world, "extract", OOM_EXIT_CODE, "CUDA out of memory")
    plan = world.plan()
    retry = names.job_name(RUN.name, "extract", first["metadata"]["labels"][names.LABEL_HASH], 1)
    assert keys(plan) == [("delete", "Job", first["metadata"]["name"]), ("create", "Job", retry)]
    [job] = creates(plan, "Job")
    assert job["metadata"]["annotations"][names.ANNOTATION_TOKEN_BUDGET] == "512"
    assert plan.failed_here == (first["metadata"]["name"],)
    extract = plan.status.document()["stages"]["extract"]
    assert "out of memory at a token budget of 1024; retrying with 512" in extract["message"]
    report = run_report(RUN, plan, world.observed().jobs, 0.0)
    assert [j.phase for j in report.jobs if j.name == first["metadata"]["name"]] == [StagePhase.FAILED]


def killed_at_the_memory_limit(world: World, stage: str) -> dict[str, Any]:
    job = world.start(stage)
    ended = {"terminated": terminated(137, "OOMKilled", None, ts(world.clock))}
    world.pods[job["metadata"]["name"]] = pod_of(job, "a", ended, "Failed")
    return job


def test_a_pod_killed_at_its_memory_limit_is_retried_at_half_at_once_on_any_server():
    """The kernel's kill (OOMKilled, exit 137) is no exit code a podFailurePolicy can tell from another
    SIGKILL: the operator fails the Job itself, on a new server too, rather than let the Job controller run
    the same budget into the same limit backoffLimit times."""
    for features in (KUBE_1_20, ServerFeatures()):
        world = World(tiny(extraction={"tokenBudget": 1024}), features=features)
        world.run_to("extract")
        first = killed_at_the_memory_limit(world, "extract")
        plan = world.plan()
        retry = names.job_name(RUN.name, "extract", first["metadata"]["labels"][names.LABEL_HASH], 1)
        assert keys(plan) == [("delete", "Job", first["metadata"]["name"]), ("create", "Job", retry)]
        [job] = creates(plan, "Job")
        assert job["metadata"]["annotations"][names.ANNOTATION_TOKEN_BUDGET] == "512"


def test_out_of_memory_at_the_smallest_budget_stops_the_job_and_keeps_it_as_the_record():
    """No next attempt: the Job is stopped (parallelism 0), not deleted, so its pods stay as the failure's
    record and the walk does not read a missing Job as one to run again (found on a real node: a deleted
    last attempt was started again, 22 times)."""
    spec = tiny(extraction={"tokenBudget": 512}, dataset={"maxSequenceLength": 512})
    world = World(spec, features=KUBE_1_20)
    world.run_to("extract")
    job = killed_at_the_memory_limit(world, "extract")
    plan = world.plan()
    assert keys(plan) == [("patch", "Job", job["metadata"]["name"])]
    [patch] = [a.body for a in plan.actions]
    assert patch["spec"] == {"parallelism": 0}
    failed = condition_of(plan.status.document(), "Failed")
    assert failed["reason"] == "OutOfMemory" and "even at a token budget of 512" in failed["message"]
    world.jobs[job["metadata"]["name"]]["spec"]["parallelism"] = 0  # the patch applied
    again = world.plan()
    assert again.actions == ()
    assert condition_of(again.status.document(), "Failed")["reason"] == "OutOfMemory"


def test_a_stage_not_retried_at_half_is_left_to_the_backoff_limit_when_killed_at_its_memory_limit():
    world = World(tiny(), features=KUBE_1_20)
    world.run_to("prepare")
    killed_at_the_memory_limit(world, "prepare")
    assert world.plan().actions == ()


def test_with_pod_failure_policy_the_same_exit_is_the_job_controllers_to_handle():
    world = World(tiny(extraction={"tokenBudget": 1024}))
    world.run_to("extract")
    ended_while_running(world, "extract", OOM_EXIT_CODE, "CUDA out of memory")
    plan = world.plan()
    assert plan.actions == () and plan.failed_here == ()


def test_without_pod_failure_policy_another_exit_is_left_to_the_backoff_limit():
    world = World(tiny(extraction={"tokenBudget": 1024}), features=KUBE_1_20)
    world.run_to("extract")
    ended_while_running(world, "extract", 1, "Traceback: a bug")
    assert world.plan().actions == ()


def test_without_pod_failure_policy_a_failed_check_fails_the_run_at_once():
    world = World(
        tiny(serving={"pinnedCheckpoint": {"path": "export/3f0c2a9d41be", "sha256": "ab" * 32}}),
        features=KUBE_1_20,
    )
    world.step()
    refused = {"error": "sha256 differs", "reason": "ChecksumMismatch", "path": "export/3f0c2a9d41be"}
    job = ended_while_running(world, "verify", CHECK_FAILED_EXIT_CODE, json.dumps(refused))
    plan = world.plan()
    assert keys(plan) == [("patch", "Job", job["metadata"]["name"])]  # stopped and kept: no second run
    assert condition_of(plan.status.document(), "Failed")["reason"] == "ChecksumMismatch"


def test_without_indexed_jobs_a_train_stage_of_several_nodes_is_refused_naming_the_version():
    world = World(tiny(training={"nodes": 2}), features=KUBE_1_20)
    plan = world.run_to("train")
    assert not [j for j in creates(plan, "Job") if j["metadata"]["labels"][names.LABEL_STAGE] == "train"]
    failed = condition_of(plan.status.document(), "Failed")
    assert failed["reason"] == "UnsupportedByCluster"
    assert "needs Indexed Jobs" in failed["message"] and "v1.20.2" in failed["message"]
    assert "set training.nodes to 1" in failed["message"]

"""A draft pinned through git rolls only after verify checked its sha256 where the files are; a mismatch or a
missing file is refused with a clear status, the serving Deployment untouched and nothing retried.

Plain data in: the run's spec, and the verify Job's termination message as `eagle3 stage verify` writes it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from eagle3_contract.api.status import RunPhase
from eagle3_contract.exit_codes import CHECK_FAILED_EXIT_CODE
from eagle3_operator.builders import names
from eagle3_operator.reconcile.verification import check_failure
from tests.harness.verification import mismatch_message
from tests.unit.reconcile.planner_world import RUN, World, condition_of, creates, keys, tiny

GOOD = "ab" * 32
OTHER = "cd" * 32
WRONG = "ef" * 32
PATH = "export/3f0c2a9d41be"
VLLM = names.serving_name(RUN.name)


def pinned(path: str = PATH, sha256: str = GOOD) -> World:
    return World(tiny(serving={"pinnedCheckpoint": {"path": path, "sha256": sha256}}))


def verified(sha256: str = GOOD, path: str = PATH) -> dict[str, Any]:
    return {"path": path, "sha256": sha256, "bytes": 4096, "files": {}, "manifest": True}


def mismatch(expected: str = GOOD, actual: str = WRONG, path: str = PATH) -> str:
    return mismatch_message(expected, actual, path)


def missing(path: str = PATH) -> str:
    error = f"the pinned draft has no model.safetensors at /artifacts/{path}/model.safetensors"
    return json.dumps({"error": error, "reason": "CheckpointMissing", "path": path, "expected": GOOD})


def refuse(world: World, message: str) -> None:
    """The verify Job ends as the Job controller ends it after the FailJob rule of its podFailurePolicy."""
    world.fail(
        "verify",
        reason="PodFailurePolicy",
        message=f"Container verify for pod x failed with exit code {CHECK_FAILED_EXIT_CODE} matching FailJob",
        exit_code=CHECK_FAILED_EXIT_CODE,
        term_reason="Error",
        last_message=message,
    )


def deployment_changes(plan: Any) -> list[tuple[str, str, str]]:
    return [k for k in keys(plan) if k[1] in ("Deployment", "Service", "PodMonitor")]


def test_a_pinned_sha256_is_verified_before_any_deployment() -> None:
    world = pinned()
    plan = world.step()
    assert [(verb, kind) for verb, kind, _ in keys(plan)] == [
        ("create", "PersistentVolumeClaim"), ("create", "ConfigMap"), ("create", "Job"),
    ]  # fmt: skip
    [job] = creates(plan, "Job")
    assert job["metadata"]["labels"][names.LABEL_STAGE] == "verify"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["eagle3", "stage", "verify"]
    assert "resources" not in container or not container["resources"].get("limits")  # no GPU
    rule = job["spec"]["podFailurePolicy"]["rules"][1]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [CHECK_FAILED_EXIT_CODE]
    assert plan.phase == RunPhase.RUNNING and plan.status.document()["currentStage"] == "verify"
    assert plan.status.document()["checkpoint"] == {"path": PATH, "sha256": GOOD}
    assert {k for k, s in plan.status.document()["stages"].items() if s["phase"] == "Skipped"} == {
        "predict", "prepare", "generate", "extract", "vocab", "train", "evaluate", "export",
    }  # fmt: skip
    world.start("verify")
    assert deployment_changes(world.step()) == [], "no rollout while verify runs"


def test_a_matching_sha256_rolls_vllm_to_the_pinned_draft() -> None:
    world = pinned()
    world.step()
    world.succeed("verify", verified())
    plan = world.step()
    assert keys(plan) == [("create", "Deployment", VLLM), ("create", "Service", VLLM)]
    [deployment] = creates(plan, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_DRAFT] == PATH
    [check] = pod["initContainers"]  # the pods check the weights again before vLLM starts
    assert check["command"][-2:] == [GOOD, f"/artifacts/{PATH}/model.safetensors"]
    assert plan.status.document()["stages"]["verify"]["phase"] == "Succeeded"
    assert plan.status.document()["stages"]["verify"]["result"]["sha256"] == GOOD
    world.ready(1)
    plan = world.step()
    assert plan.actions == () and plan.phase == RunPhase.SERVING
    assert condition_of(plan.status.document(), "Ready")["status"] == "True"


def test_a_mismatch_is_refused_with_both_digests_and_what_to_do() -> None:
    world = pinned()
    world.step()
    refuse(world, mismatch())
    plan = world.step()
    assert deployment_changes(plan) == [] and creates(plan, "Job") == []
    assert world.deployment is None
    assert plan.phase == RunPhase.FAILED and plan.status.document()["currentStage"] == "verify"
    failed = condition_of(plan.status.document(), "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "ChecksumMismatch")
    for part in (GOOD, WRONG, f"/artifacts/{PATH}/model.safetensors", "eagle3 promote", "delete Job"):
        assert part in failed["message"], part
    assert failed["message"].startswith("stage verify: ")
    ready = condition_of(plan.status.document(), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ChecksumMismatch")
    assert plan.status.document()["stages"]["verify"]["phase"] == "Failed"
    assert plan.status.serving is None


def test_a_refused_draft_is_not_checked_again_until_the_pin_changes() -> None:
    world = pinned()
    world.step()
    refuse(world, mismatch())
    world.step()
    assert world.step().actions == ()
    world.edit(serving={"replicas": 2})  # an unrelated edit: the same files, the same answer
    assert [k for k in keys(world.step()) if k[1] == "Job"] == []
    world.edit(serving={"pinnedCheckpoint": {"path": PATH, "sha256": WRONG}})  # the pin fixed in git
    plan = world.step()
    [job] = creates(plan, "Job")
    assert job["metadata"]["labels"][names.LABEL_STAGE] == "verify"
    world.succeed("verify", verified(WRONG))
    plan = world.step()
    assert [k[1] for k in keys(plan)] == ["Deployment", "Service"]
    assert plan.phase == RunPhase.RUNNING
    assert condition_of(plan.status.document(), "Failed")["status"] == "False"


def test_deleting_the_refused_verify_job_checks_the_files_again() -> None:
    world = pinned()
    world.step()
    refuse(world, mismatch())
    world.step()
    failed_job = world.job("verify")["metadata"]["name"]
    world.jobs.pop(failed_job)  # the user's `kubectl delete job`, after restoring the files
    world.pods.pop(failed_job)
    [job] = creates(world.step(), "Job")
    assert job["metadata"]["name"] == f"{failed_job}-r1"


def test_a_missing_checkpoint_is_a_clear_error() -> None:
    world = pinned()
    world.step()
    refuse(world, missing())
    plan = world.step()
    failed = condition_of(plan.status.document(), "Failed")
    assert failed["reason"] == "CheckpointMissing"
    assert f"no model.safetensors at /artifacts/{PATH}/model.safetensors" in failed["message"]
    assert "previous draft" in failed["message"]
    assert deployment_changes(plan) == []


def test_a_refused_draft_leaves_the_previous_one_serving() -> None:
    world = pinned()
    world.step()
    world.succeed("verify", verified())
    world.step()
    world.ready(1)
    world.step()
    served = copy.deepcopy(world.deployment)
    assert served is not None
    world.edit(serving={"pinnedCheckpoint": {"path": "export/0000aaaa1111", "sha256": OTHER}})
    plan = world.step()
    assert deployment_changes(plan) == [], "not rolled before the new draft is verified"
    refuse(world, mismatch(OTHER, WRONG, "export/0000aaaa1111"))
    plan = world.step()
    assert deployment_changes(plan) == []
    assert world.deployment == served
    assert plan.phase == RunPhase.FAILED
    assert plan.status.document()["serving"]["draft"] == PATH
    ready = condition_of(plan.status.document(), "Ready")
    assert ready["status"] == "True" and f"serve draft {PATH}" in ready["message"]
    assert "not rolled out (ChecksumMismatch" in ready["message"]
    assert condition_of(plan.status.document(), "Failed")["reason"] == "ChecksumMismatch"


def test_a_verify_job_that_crashed_is_an_ordinary_failure() -> None:
    world = pinned()
    world.step()
    world.fail("verify", last_message="Traceback (most recent call last):\nOSError: [Errno 5] I/O error")
    plan = world.step()
    failed = condition_of(plan.status.document(), "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and "I/O error" in failed["message"]


def test_check_failure_reads_only_a_named_camel_case_reason() -> None:
    assert check_failure("j", None) is None
    assert check_failure("j", {"error": "x"}) is None
    assert check_failure("j", {"error": "x", "reason": "not camel"}) is None
    assert check_failure("j", {"reason": "ChecksumMismatch"}) is None
    reason, message = check_failure("j", {"error": "boom.", "reason": "ChecksumMismatch"}) or ("", "")
    assert reason == "ChecksumMismatch" and message.startswith("boom. vLLM is not rolled")
    assert "delete Job j " in message

"""serving.promotion reviewed: the run trains, its new draft waits in status.candidate, and vLLM serves only
the pinned draft, once verify checked it; promoting the candidate (the pin set to it in git) rolls vLLM to it.

The planner with plain data (planner_world); automatic promotion is tests/unit/reconcile/test_planner.py's
and test_verification.py's, and stays as it was (a test here checks it once more against reviewed).
"""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.speculation import SpeculationTable
from eagle3_contract.api.status import Eagle3RunStatus, RunPhase
from eagle3_contract.reasons import AWAITING_PROMOTION
from eagle3_operator.builders import names
from eagle3_operator.reconcile.news import CANDIDATE_READY, progress_news
from eagle3_operator.reconcile.planner import Plan
from eagle3_operator.reconcile.run_report import ServingDraft, rolled_out_before, unix_time
from tests.harness.results import CHECKPOINT_BYTES, EXPORT_SHA256, fake_result
from tests.unit.reconcile.planner_world import RUN, World, condition_of, creates, keys, tiny, ts

VLLM = names.serving_name(RUN.name)
OLD = {"path": "export/0000aaaa1111", "sha256": "cd" * 32}  # a draft promoted before
TRAINING = ["prepare", "extract", "vocab", "train", "evaluate", "export"]  # the tiny run without generate
PROMOTE = f"eagle3 promote {RUN.name} -n {RUN.namespace}"


def reviewed(pin: dict[str, Any] | None = None, gate: float = 1.5) -> World:
    serving: dict[str, Any] = {"promotion": "reviewed"}
    if pin is not None:
        serving["pinnedCheckpoint"] = pin
    return World(tiny(serving=serving, evaluation={"minAcceptanceLength": gate}))


def job_stages(plan: Plan) -> list[str]:
    return [job["metadata"]["labels"][names.LABEL_STAGE] for job in creates(plan, "Job")]


def deployment_changes(plan: Plan) -> list[tuple[str, str, str]]:
    return [k for k in keys(plan) if k[1] in ("Deployment", "Service", "PodMonitor")]


def served(world: World) -> str | None:
    if world.deployment is None:
        return None
    draft: str = world.deployment["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_DRAFT]
    return draft


def train(world: World, results: dict[str, Any] | None = None) -> Plan:
    """Reconcile, letting each training Job succeed (verify's are left alone), until none waits."""
    for _ in range(20):
        plan = world.step()
        stages = plan.status.document()["stages"]
        started = [
            s for s in TRAINING if stages[s]["phase"] in ("Pending", "Running") and stages[s].get("jobName")
        ]
        if not started:
            return plan
        world.succeed(started[0], (results or {}).get(started[0]))
    raise AssertionError("training did not end")


def table(document: dict[str, Any]) -> SpeculationTable:
    """A speculation table as a model: status leaves out the fields a result writes as null."""
    return SpeculationTable.model_validate(document)


def export_dir(world: World) -> str:
    return str(world.status["stages"]["export"]["outputDir"]) if world.status else ""


def test_without_a_pin_the_exported_draft_waits_and_nothing_serves() -> None:
    world = reviewed()
    plan = train(world)
    assert world.deployment is None and deployment_changes(plan) == []
    candidate = dict(plan.status.document()["candidate"])
    # the sweep's table travels with the candidate, to tune the serving it gets once promoted
    assert table(candidate.pop("speculation")) == table(fake_result("evaluate")["speculation"])
    assert candidate == {
        "path": export_dir(world), "sha256": EXPORT_SHA256, "bytes": CHECKPOINT_BYTES,
        "acceptanceLength": 1.6, "acceptanceRate": 0.2, "method": "eagle3",
    }  # fmt: skip
    assert plan.status.checkpoint is None and plan.status.serving is None
    assert plan.phase == RunPhase.SUCCEEDED and plan.status.document()["progress"] == "awaiting promotion"
    ready = condition_of(plan.status.document(), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", AWAITING_PROMOTION)
    for part in (export_dir(world), "mean acceptance length 1.600", PROMOTE, "reviewed"):
        assert part in ready["message"], part
    assert condition_of(plan.status.document(), "GatePassed")["status"] == "True"
    assert world.step().actions == (), "nothing more to do until the promotion is merged"


def test_while_training_runs_there_is_no_candidate_and_ready_says_why() -> None:
    world = reviewed()
    plan = world.step()
    assert job_stages(plan) == ["prepare"]
    assert plan.status.candidate is None and plan.phase == RunPhase.RUNNING
    ready = condition_of(plan.status.document(), "Ready")
    assert ready["reason"] == "NotServing" and "status.candidate" in ready["message"]


def test_promoting_the_candidate_verifies_it_and_rolls_vllm_without_training_again() -> None:
    world = reviewed()
    candidate = train(world).status.document()["candidate"]
    world.edit(serving={"pinnedCheckpoint": {"path": candidate["path"], "sha256": candidate["sha256"]}})
    plan = world.step()
    assert job_stages(plan) == ["verify"], "the training stages are the same: nothing trains again"
    assert deployment_changes(plan) == [] and plan.status.candidate is None
    assert plan.phase == RunPhase.RUNNING and plan.status.document()["currentStage"] == "verify"
    world.succeed("verify")
    plan = world.step()
    assert deployment_changes(plan) == [("create", "Deployment", VLLM), ("create", "Service", VLLM)]
    assert served(world) == candidate["path"]
    assert plan.status.document()["checkpoint"] == candidate, (
        "the pin carries the figures its export measured"
    )
    assert plan.status.candidate is None
    world.ready(1)
    plan = world.step()
    assert plan.actions == () and plan.phase == RunPhase.SERVING
    ready = condition_of(plan.status.document(), "Ready")
    assert ready["status"] == "True" and "awaits promotion" not in ready["message"]


def test_a_pin_serves_once_verified_while_the_run_trains_its_candidate() -> None:
    world = reviewed(OLD)
    plan = world.step()
    assert sorted(job_stages(plan)) == ["prepare", "verify"], "a pin does not skip training when reviewed"
    assert plan.status.document()["checkpoint"] == OLD
    world.succeed("verify")
    plan = world.step()
    assert deployment_changes(plan) == [("create", "Deployment", VLLM), ("create", "Service", VLLM)]
    assert served(world) == OLD["path"] and plan.status.document()["stages"]["prepare"]["phase"] == "Pending"
    world.ready(1)
    plan = train(world)
    assert deployment_changes(plan) == [] and served(world) == OLD["path"]
    assert plan.status.document()["serving"]["draft"] == OLD["path"]
    assert plan.status.document()["candidate"]["path"] == export_dir(world) != OLD["path"]
    checkpoint = dict(plan.status.document()["checkpoint"])
    assert table(checkpoint.pop("speculation")) == table(fake_result("verify")["speculation"])  # the pin's
    assert checkpoint.pop("method") == fake_result("verify")["method"]  # the pin's, as verify read it
    assert checkpoint == OLD and plan.phase == RunPhase.SERVING
    ready = condition_of(plan.status.document(), "Ready")
    assert ready["status"] == "True" and ready["reason"] == "DeploymentReady"
    assert f"serve draft {OLD['path']}" in ready["message"]
    assert f"candidate draft {export_dir(world)}" in ready["message"] and PROMOTE in ready["message"]


def test_a_training_edit_after_a_promotion_trains_while_the_promoted_draft_keeps_serving() -> None:
    world = reviewed()
    first = train(world).status.document()["candidate"]
    world.edit(serving={"pinnedCheckpoint": {"path": first["path"], "sha256": first["sha256"]}})
    world.step()
    world.succeed("verify")
    world.step()
    world.ready(1)
    world.step()
    world.edit(training={"learningRate": 3e-4})
    plan = world.step()
    assert job_stages(plan) == ["train"] and deployment_changes(plan) == []
    assert "candidate" not in plan.status.document(), "a draft of an earlier spec is no candidate"
    assert condition_of(plan.status.document(), "Ready")["status"] == "True"
    plan = train(world, {"export": {"sha256": "ee" * 32, "bytes": 10}})
    assert deployment_changes(plan) == [] and served(world) == first["path"]
    assert plan.status.document()["candidate"]["path"] == export_dir(world) != first["path"]
    assert plan.status.document()["candidate"]["sha256"] == "ee" * 32
    assert plan.status.document()["checkpoint"]["path"] == first["path"]
    assert plan.status.document()["checkpoint"]["acceptanceLength"] == 1.6, (
        "the figures of the promoted draft stay"
    )


def test_a_candidate_below_the_gate_is_not_one_and_the_pin_keeps_serving() -> None:
    world = reviewed(OLD, gate=1.7)
    world.step()
    world.succeed("verify")
    world.step()
    world.ready(1)
    plan = train(world)
    assert job_stages(plan) == [] and plan.status.candidate is None
    assert plan.status.document()["stages"]["export"]["phase"] == "Pending"
    assert condition_of(plan.status.document(), "GatePassed")["status"] == "False"
    assert plan.phase == RunPhase.FAILED and served(world) == OLD["path"]
    ready = condition_of(plan.status.document(), "Ready")
    assert ready["status"] == "True" and f"serve draft {OLD['path']}" in ready["message"]


def test_a_refused_pin_fails_the_run_but_training_goes_on() -> None:
    world = reviewed(OLD)
    world.step()
    world.fail("verify", last_message='{"reason": "ChecksumMismatch", "error": "another sha256"}')
    plan = world.step()
    assert plan.phase == RunPhase.FAILED and world.deployment is None
    failed = condition_of(plan.status.document(), "Failed")
    assert failed["reason"] == "ChecksumMismatch" and failed["message"].startswith("stage verify: ")
    assert plan.status.document()["currentStage"] == "verify"
    world.succeed("prepare")
    assert job_stages(world.step()) == ["extract"], "the refused pin does not hold training back"


def test_automatic_promotion_is_unchanged_a_pin_trains_nothing_and_an_export_serves_at_once() -> None:
    pinned = World(tiny(serving={"pinnedCheckpoint": OLD}))
    assert job_stages(pinned.step()) == ["verify"]
    world = World(tiny(evaluation={"minAcceptanceLength": 1.5}))
    plan = train(world)
    assert deployment_changes(plan) == [("create", "Deployment", VLLM), ("create", "Service", VLLM)]
    assert "candidate" not in plan.status.document() and plan.status.document()["checkpoint"][
        "path"
    ] == export_dir(world)


def test_a_new_candidate_is_announced_once() -> None:
    world = reviewed()
    before = world.step().status
    plan = train(world)
    waiting = [m for r, m in progress_news(before, plan.status, {}) if r == CANDIDATE_READY]
    assert len(waiting) == 1 and export_dir(world) in waiting[0] and "eagle3 promote" in waiting[0]
    assert [r for r, _ in progress_news(plan.status, world.step().status, {})] == []


def test_the_pinned_draft_rolled_out_when_verify_passed() -> None:
    draft = ServingDraft("export/abc", "ff")
    verify = {"phase": "Succeeded", "outputDir": "verify/123", "completionTime": ts(300)}
    export = {"phase": "Succeeded", "outputDir": "export/abc", "completionTime": ts(100)}
    status = {"checkpoint": {"path": "export/abc"}, "stages": {"export": export, "verify": verify}}
    assert rolled_out_before(Eagle3RunStatus.model_validate(status), draft) == unix_time(ts(300))
    moved = Eagle3RunStatus.model_validate(status | {"checkpoint": {"path": "export/def"}})
    assert rolled_out_before(moved, draft) == unix_time(ts(100))

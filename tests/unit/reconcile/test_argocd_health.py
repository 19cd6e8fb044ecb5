"""examples/gitops/argocd/argocd-cm.yaml: Argo CD's health check of an Eagle3Run, on the planner's statuses.

Argo CD runs resource health checks with gopher-lua (Lua 5.1); lupa's Lua 5.1 runs the same script here on the
status the operator's planner writes at each point of a run, so a change of the conditions or phases that the
script reads fails this test instead of turning every run's health in Argo CD into "Progressing" for ever.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from lupa import lua51

from tests.unit.reconcile.planner_world import World, pod_of, tiny, ts

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "examples" / "gitops" / "argocd" / "argocd-cm.yaml"
KEY = "resource.customizations.health.eagle3.dev_Eagle3Run"


def health(run: dict[str, Any]) -> tuple[str, str]:
    """(status, message) of Argo CD's check for `run`, as Argo CD calls it: the object as the global `obj`."""
    script = yaml.safe_load(CONFIG.read_text())["data"][KEY]
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(run, recursive=True)
    result = lua.execute(script)
    return result["status"], result["message"]


def run_of(world: World) -> dict[str, Any]:
    meta = {"name": world.ref.name, "namespace": world.ref.namespace, "generation": world.generation}
    run = {"apiVersion": "eagle3.dev/v1alpha1", "kind": "Eagle3Run", "metadata": meta, "spec": world.spec}
    return run | ({"status": world.status} if world.status is not None else {})


def test_a_new_run_waits_for_the_operator() -> None:
    assert health(run_of(World(tiny()))) == ("Progressing", "waiting for the operator")


def test_a_running_run_is_progressing_and_names_its_stage() -> None:
    world = World(tiny())
    world.run_to("train")
    assert health(run_of(world)) == ("Progressing", "Running: train")


def test_a_status_older_than_the_spec_is_progressing() -> None:
    world = World(tiny())
    world.run_to("none")
    world.ready(1)
    world.step()
    world.edit(training={"epochs": 2})  # git changed the spec; the operator has not seen it yet
    assert health(run_of(world))[0] == "Progressing"


def test_a_serving_run_is_healthy() -> None:
    world = World(tiny())
    world.run_to("none")
    world.ready(1)
    world.step()
    assert world.status is not None and world.status["phase"] == "Serving"
    status, message = health(run_of(world))
    assert status == "Healthy" and message


def test_a_trained_run_without_serving_is_healthy_once_it_succeeded() -> None:
    world = World(tiny(serving={"enabled": False}))
    world.run_to("none")
    assert health(run_of(world)) == ("Healthy", "trained; serving is disabled")


def test_a_failed_stage_is_degraded_with_the_reason() -> None:
    world = World(tiny())
    world.run_to("extract")
    world.fail("extract")
    world.step()
    status, message = health(run_of(world))
    assert status == "Degraded" and message.startswith("BackoffLimitExceeded: stage extract")


def test_a_draft_below_its_gate_is_degraded() -> None:
    world = World(tiny(evaluation={"minAcceptanceLength": 2.0}))
    world.run_to("evaluate")
    world.succeed("evaluate", {"acceptanceLength": 1.6})
    world.step()
    status, message = health(run_of(world))
    assert status == "Degraded" and message.startswith("AcceptanceBelowGate: mean acceptance length 1.600")


def test_an_invalid_spec_is_degraded() -> None:
    world = World(tiny(training={"epochs": 0}))
    world.step()
    status, message = health(run_of(world))
    assert status == "Degraded" and "training.epochs" in message


def test_a_suspended_run_is_suspended_once_it_would_start_a_job() -> None:
    world = World(tiny())
    world.run_to("extract")
    world.edit(suspend=True)  # the running extract Job finishes; vocab is not started
    world.succeed("extract")
    world.step()
    assert world.status is not None and world.status["phase"] == "Suspended"
    assert health(run_of(world)) == ("Suspended", "spec.suspend is true")


def stalled(world: World, reason: str, message: str, phase: str = "Pending") -> None:
    """The current stage's newest Job gets a pod that does not run (the kubelet's or scheduler's word)."""
    job = world.job(world.status["currentStage"] if world.status else "prepare")
    job["status"] = {"startTime": ts(0), "active": 1}
    pod = pod_of(job, "a", {"waiting": {"reason": reason, "message": message}}, phase)
    if reason == "Unschedulable":
        unscheduled = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        pod["status"] = {"phase": "Pending", "conditions": [unscheduled]}
    world.pods[job["metadata"]["name"]] = pod


def test_a_pod_that_cannot_pull_its_image_is_degraded_with_the_kubelets_message() -> None:
    world = World(tiny())
    world.run_to("prepare")
    stalled(world, "ImagePullBackOff", 'Back-off pulling image "reg/pipeline:1"')
    world.step()
    status, message = health(run_of(world))
    assert status == "Degraded" and message.endswith(
        'ImagePullBackOff: Back-off pulling image "reg/pipeline:1"'
    )


def test_a_pod_waiting_for_a_node_is_progressing_and_says_so() -> None:
    world = World(tiny())
    world.run_to("extract")
    stalled(world, "Unschedulable", "0/8 nodes are available: 8 Insufficient nvidia.com/gpu.")
    world.step()
    status, message = health(run_of(world))
    assert status == "Progressing" and message.endswith("8 Insufficient nvidia.com/gpu.")


def test_a_crash_looping_vllm_is_degraded() -> None:
    world = World(tiny())
    world.run_to("none")
    assert world.deployment is not None
    crash = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}
    replica_set = {"metadata": {"name": "tiny-vllm-x", "namespace": world.ref.namespace}}
    world.pods["tiny-vllm-x"] = pod_of(
        replica_set | {"spec": world.deployment["spec"]}, "a", crash, "Running"
    )
    world.step()
    status, message = health(run_of(world))
    assert status == "Degraded" and "CrashLoopBackOff" in message


def test_a_reviewed_run_waiting_for_its_first_promotion_is_suspended_and_says_what_to_run() -> None:
    world = World(tiny(serving={"promotion": "reviewed"}))
    world.run_to("none")
    status, message = health(run_of(world))
    assert status == "Suspended" and "eagle3 promote tiny" in message
    candidate = world.status["candidate"] if world.status else {}
    world.edit(serving={"pinnedCheckpoint": {"path": candidate["path"], "sha256": candidate["sha256"]}})
    world.step()
    assert health(run_of(world)) == ("Progressing", "Running: verify")
    world.succeed("verify")
    world.step()
    world.ready(1)
    world.step()
    assert health(run_of(world))[0] == "Healthy"

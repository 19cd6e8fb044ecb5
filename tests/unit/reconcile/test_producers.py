"""Online extraction in the planner: producers (and the Mooncake master) around the train stage, and the
headless Service of a multi-node train Job."""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.status import BlockedBy
from eagle3_operator.builders import names
from eagle3_operator.reconcile.run_report import blocked_pods
from tests.unit.reconcile.planner_world import World, condition_of, creates, keys, tiny

PRODUCERS, MASTER = "tiny-producers", "tiny-mooncake"
ONLINE = {"mode": "online", "transfer": "mooncake", "servers": 2}


def online(**extraction: Any) -> World:
    return World(tiny(extraction=ONLINE | extraction, training={"nodes": 2}))


def at_train(world: World) -> World:
    """The run up to the reconcile that would start the train Job."""
    world.run_to("train")
    return world


def train_job_name(world: World) -> str:
    return str(world.job("train")["metadata"]["name"])


def producer_pod(world: World, state: dict[str, Any], phase: str = "Pending", n: int = 0) -> None:
    labels = names.labels(world.ref.name, names.PRODUCERS_STAGE)
    world.pods[f"producer-{n}"] = {
        "metadata": {"name": f"{PRODUCERS}-abc-{n}", "labels": labels},
        "status": {"phase": phase, "containerStatuses": [{"name": "producer", "state": state}]},
    }


def test_producers_and_the_master_come_first_and_the_train_job_waits_for_them() -> None:
    world = online()
    plan = world.run_to("train")
    assert keys(plan) == [  # each Service before its Deployment: its name resolves from the pods' start
        ("create", "Service", MASTER),
        ("create", "Deployment", MASTER),
        ("create", "Service", PRODUCERS),
        ("create", "Deployment", PRODUCERS),
    ]
    train = plan.status.document()["stages"]["train"]
    assert train["phase"] == "Pending" and "jobName" not in train and train["attempts"] == 0
    assert (
        "waiting for the hidden-state producers (0 of 2 available) and the Mooncake master"
        in train["message"]
    )
    producers = plan.status.document()["producers"]
    assert producers["phase"] == "Pending" and producers["replicas"] == 2
    assert producers["endpoint"] == "http://tiny-producers.eagle3.svc:8000/v1"
    assert producers["mooncakeMaster"] == "tiny-mooncake.eagle3.svc:50051"
    assert plan.status.document()["currentStage"] == "train" and plan.phase == "Running"
    assert not creates(world.step(), "Job"), "nothing is available yet"
    world.available(PRODUCERS)
    assert not creates(world.step(), "Job"), "the master is not available yet"
    world.available(MASTER)
    plan = world.step()
    job_name = train_job_name(world)
    assert keys(plan) == [("create", "Service", job_name), ("create", "Job", job_name)]
    assert plan.status.document()["stages"]["train"]["jobName"] == job_name
    assert plan.status.document()["producers"]["phase"] == "Running"
    assert plan.status.document()["producers"]["message"] == "1 of 2 producer(s) available to the train stage"


def test_the_volume_transfer_runs_no_master() -> None:
    world = online(transfer="volume")
    plan = world.run_to("train")
    assert [k for k in keys(plan) if k[1] == "Deployment"] == [("create", "Deployment", PRODUCERS)]
    world.available(PRODUCERS)
    assert creates(world.step(), "Job")
    assert "mooncakeMaster" not in world.status["producers"]


def test_producers_live_while_training_and_go_once_it_succeeded() -> None:
    world = at_train(online())
    world.available(PRODUCERS)
    world.available(MASTER)
    world.step()
    world.start("train")
    assert world.step().actions == ()
    world.succeed("train")
    plan = world.step()
    job_name = train_job_name(world)
    assert keys(plan)[:5] == [
        ("delete", "Deployment", PRODUCERS),
        ("delete", "Service", PRODUCERS),
        ("delete", "Deployment", MASTER),
        ("delete", "Service", MASTER),
        ("create", "Job", keys(plan)[4][2]),  # evaluate
    ]
    assert ("delete", "Service", job_name) in keys(plan), "the headless Service goes with its Job"
    producers = plan.status.document()["producers"]
    assert producers["phase"] == "Deleted" and producers["replicas"] == 0
    assert (
        producers["message"] == "the train stage succeeded: the producers are deleted, their 2 GPU(s) freed"
    )
    assert world.workloads == {}
    later = world.step()
    assert later.status.document()["producers"] == producers and not [
        k for k in keys(later) if k[0] == "delete"
    ]


def test_producers_go_when_the_train_stage_fails_for_good() -> None:
    world = at_train(online())
    world.available(PRODUCERS)
    world.available(MASTER)
    world.step()
    world.fail("train")
    plan = world.step()
    assert ("delete", "Deployment", PRODUCERS) in keys(plan) and plan.phase == "Failed"
    assert plan.status.document()["producers"]["message"].startswith("the train stage failed")


def test_a_producer_that_cannot_start_is_reported_like_a_stage_pod() -> None:
    world = at_train(online(transfer="volume"))
    producer_pod(world, {"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}})
    plan = world.step()
    blocked = plan.status.document()["producers"]["blockedBy"]
    assert blocked["reason"] == "ImagePullBackOff"
    assert blocked["message"] == (
        "pod tiny-producers-abc-0, container producer: ImagePullBackOff: pull access denied"
    )
    progressing = condition_of(plan.status.document(), "Progressing")
    assert progressing["reason"] == "PodNotRunning" and "ImagePullBackOff" in progressing["message"]
    assert blocked_pods(plan.status) == {"producers": BlockedBy.model_validate(blocked)}
    assert "blockedBy" not in plan.status.document()["stages"]["train"], (
        "the train pod is not the one blocked"
    )


def test_no_gpus_for_the_producers_is_the_schedulers_message() -> None:
    world = at_train(online(transfer="volume"))
    labels = names.labels(world.ref.name, names.PRODUCERS_STAGE)
    unschedulable = {
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
    }  # fmt: skip
    world.pods["p"] = {
        "metadata": {"name": "tiny-producers-x", "labels": labels},
        "status": {"phase": "Pending", "conditions": [unschedulable]},
    }
    blocked = world.step().status.document()["producers"]["blockedBy"]
    assert blocked["reason"] == "Unschedulable" and "Insufficient nvidia.com/gpu" in blocked["message"]


def test_a_producer_crash_mid_training_keeps_the_train_job_and_the_producers() -> None:
    world = at_train(online(transfer="volume"))
    world.available(PRODUCERS, 2)
    world.step()
    world.start("train")
    world.step()
    world.available(PRODUCERS, 1)  # one was OOM-killed: its Deployment replaces the pod
    crashed = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    world.pods["producer-1"] = {
        "metadata": {"name": "tiny-producers-abc-1", "labels": names.labels("tiny", names.PRODUCERS_STAGE)},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "producer", "lastState": crashed,
                 "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}},
            ],
        },
    }  # fmt: skip
    plan = world.step()
    assert plan.actions == ()
    producers = plan.status.document()["producers"]
    assert producers["phase"] == "Running" and producers["availableReplicas"] == 1
    assert producers["blockedBy"]["reason"] == "CrashLoopBackOff"
    assert "last exit code 137: OOMKilled" in producers["blockedBy"]["message"]
    assert plan.status.document()["stages"]["train"]["phase"] == "Running"


def test_a_new_train_hash_replaces_the_producers_and_keeps_their_spec_configmap_meanwhile() -> None:
    world = at_train(online(transfer="volume"))
    world.available(PRODUCERS)
    world.step()
    world.start("train")
    world.step()
    mounted = world.workloads[PRODUCERS]["spec"]["template"]["spec"]["volumes"][2]["configMap"]["name"]
    world.edit(training={"learningRate": 0.5})
    plan = world.step()
    assert ("delete", "Deployment", PRODUCERS) in keys(plan)
    assert ("delete", "ConfigMap", mounted) not in keys(plan)
    assert not creates(plan, "Deployment")
    plan = world.step()  # the old producers are gone: new ones, for the new train stage
    [producers] = creates(plan, "Deployment")
    assert producers["metadata"]["labels"][names.LABEL_HASH] == world.status["stages"]["train"]["hash"]


def test_scaling_servers_patches_the_replicas_only() -> None:
    world = at_train(online(transfer="volume"))
    world.edit(extraction={"servers": 3})
    plan = world.step()
    assert keys(plan) == [("patch", "Deployment", PRODUCERS)]
    assert plan.actions[0].body["spec"] == {"replicas": 3}


def test_an_offline_run_has_no_producers() -> None:
    world = World(tiny(training={"nodes": 2}))
    plan = world.run_to("train")
    assert plan.status.producers is None
    job = creates(plan, "Job")[0]
    assert keys(plan)[-2:] == [
        ("create", "Service", job["metadata"]["name"]),
        ("create", "Job", job["metadata"]["name"]),
    ]


def test_a_stale_multi_node_train_job_takes_its_headless_service_along() -> None:
    world = World(tiny(training={"nodes": 2}))
    world.run_to("train")
    old = train_job_name(world)
    world.start("train")
    world.edit(training={"learningRate": 0.5})
    plan = world.step()
    new = train_job_name(world)
    assert new != old
    assert {("delete", "Job", old), ("delete", "Service", old), ("create", "Service", new)} <= set(keys(plan))


def test_a_missing_headless_service_of_a_running_job_is_created_again() -> None:
    world = World(tiny(training={"nodes": 2}))
    world.run_to("train")
    name = train_job_name(world)
    world.start("train")
    del world.objects[("Service", name)]
    assert keys(world.step()) == [("create", "Service", name)]

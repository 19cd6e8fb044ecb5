"""The online producers, the Mooncake master and the multi-node train Job: what each promises."""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.validation import parse_spec
from eagle3_contract.online import (
    ENV_HIDDEN_STATES_ENDPOINT,
    ENV_MOONCAKE_MASTER,
    ENV_NODE_RANK,
    ENV_NODES,
    ENV_RENDEZVOUS,
    MOONCAKE_MASTER_PORT,
    RENDEZVOUS_PORT,
    mooncake_master_argv,
    produce_argv,
)
from eagle3_contract.stages import Stage
from eagle3_operator.builders import names
from eagle3_operator.builders.job import build_job
from eagle3_operator.builders.names import RunRef
from tests.unit.builders.builder_cases import (
    KIMI_ONLINE_SPEC,
    KIMI_RUN,
    configmap_name,
    kimi_online_spec,
    online_objects,
    plan_of,
)

MANAGED = {names.LABEL_MANAGED_BY: names.MANAGED_BY}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_every_online_object_is_labelled_and_owned_by_the_run() -> None:
    for obj in online_objects(KIMI_RUN, kimi_online_spec()):
        meta = obj["metadata"]
        assert meta["labels"].items() >= MANAGED.items()
        assert meta["labels"][names.LABEL_RUN] == KIMI_RUN.name and names.LABEL_STAGE in meta["labels"]
        assert meta["ownerReferences"] == [KIMI_RUN.owner_reference()]


def test_producers_are_servers_replicas_of_the_verifiers_gpus_on_the_pool_reading_the_spec() -> None:
    spec = kimi_online_spec()
    producers, service, *_ = online_objects(KIMI_RUN, spec)
    assert producers["spec"]["replicas"] == 2
    pod = producers["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == produce_argv("/etc/eagle3/run.json", "/artifacts", 8000)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == spec.verifier.tensor_parallel_size
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["spec"]["configMap"]["name"] == configmap_name(KIMI_RUN, spec)
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    assert "readOnly" not in volumes["artifacts"]["persistentVolumeClaim"]  # the volume transfer writes
    assert _env(container)[ENV_MOONCAKE_MASTER] == "kimi-k2-5-mooncake.llm.svc:50051"
    train = plan_of(spec, Stage.TRAIN)
    assert producers["spec"]["template"]["metadata"]["labels"][names.LABEL_HASH] == train.hash
    selector = producers["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    assert selector.items() <= producers["spec"]["template"]["metadata"]["labels"].items()


def test_the_mooncake_master_is_one_cpu_pod_of_the_pipeline_image() -> None:
    _, _, master, service, *_ = online_objects(KIMI_RUN, kimi_online_spec())
    assert master["spec"]["replicas"] == 1 and master["spec"]["strategy"] == {"type": "Recreate"}
    pod = master["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == mooncake_master_argv()
    assert "nvidia.com/gpu" not in container["resources"]["requests"] and "nodeSelector" not in pod
    assert {p["port"] for p in service["spec"]["ports"]} >= {MOONCAKE_MASTER_PORT}


def test_the_multi_node_train_job_is_indexed_behind_its_headless_service() -> None:
    *_, job, service = online_objects(KIMI_RUN, kimi_online_spec())
    name = job["metadata"]["name"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"] == name
    env = _env(job["spec"]["template"]["spec"]["containers"][0])
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env[ENV_NODE_RANK] == {"fieldRef": {"fieldPath": index}}
    assert env[ENV_NODES] == "2"
    assert env[ENV_RENDEZVOUS] == f"{name}-0.{name}:{RENDEZVOUS_PORT}"
    assert env[ENV_HIDDEN_STATES_ENDPOINT] == "http://kimi-k2-5-producers.llm.svc:8000/v1"
    assert env[ENV_MOONCAKE_MASTER] == "kimi-k2-5-mooncake.llm.svc:50051"
    assert job["metadata"]["labels"][names.LABEL_KUEUE_QUEUE] == "gpu-h200"  # one Workload: a gang
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()


def test_a_one_node_offline_train_job_is_unchanged() -> None:
    spec = parse_spec(KIMI_ONLINE_SPEC | {"extraction": {}, "training": {"gpus": 8}})
    job = build_job(KIMI_RUN, spec, plan_of(spec, Stage.TRAIN), 0, None, "cm")
    assert "completionMode" not in job["spec"] and "subdomain" not in job["spec"]["template"]["spec"]
    env = _env(job["spec"]["template"]["spec"]["containers"][0])
    assert not {ENV_HIDDEN_STATES_ENDPOINT, ENV_MOONCAKE_MASTER, ENV_NODE_RANK} & set(env)


def test_volume_transfer_sets_no_mooncake_master() -> None:
    spec = parse_spec(KIMI_ONLINE_SPEC | {"extraction": {"mode": "online", "transfer": "volume"}})
    producers, *_ = online_objects(KIMI_RUN, spec)
    job = build_job(KIMI_RUN, spec, plan_of(spec, Stage.TRAIN), 0, None, "cm")
    for container in (producers["spec"]["template"]["spec"]["containers"][0],
                      job["spec"]["template"]["spec"]["containers"][0]):  # fmt: skip
        assert ENV_MOONCAKE_MASTER not in _env(container)


def test_a_long_run_name_leaves_room_for_the_pod_index_in_the_hostname() -> None:
    run = RunRef(name="r" * 63, namespace="llm", uid="u")
    spec = kimi_online_spec()
    job = build_job(run, spec, plan_of(spec, Stage.TRAIN), 0, None, "cm")
    name = job["metadata"]["name"]
    assert len(f"{name}-1") <= 63
    offline = parse_spec(KIMI_ONLINE_SPEC | {"extraction": {}, "training": {"gpus": 8}})
    assert (
        len(build_job(run, offline, plan_of(offline, Stage.TRAIN), 0, None, "cm")["metadata"]["name"]) == 63
    )

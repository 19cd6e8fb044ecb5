"""Properties every built object has, over generated specs: GPUs, shared memory, placement, ownership."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.validation import parse_spec
from eagle3_contract.stages import plan_stages
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from tests.tiny_spec import derive
from tests.unit.builders.builder_cases import (
    AFFINITY,
    KIMI_RUN,
    KIMI_SPEC,
    STAGES,
    TINY_RUN,
    TINY_SPEC,
    all_objects,
    kimi_spec,
    pinned_spec,
    specs,
    stage_jobs,
    tiny_spec,
)


def pod_of(obj: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = obj["spec"]["template"]["spec"]
    return pod


def container_of(obj: dict[str, Any]) -> dict[str, Any]:
    [container] = pod_of(obj)["containers"]
    out: dict[str, Any] = container
    return out


def has_shm(obj: dict[str, Any]) -> bool:
    volume = {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod_of(obj)["volumes"]
    mount = {"name": "dshm", "mountPath": "/dev/shm"} in container_of(obj)["volumeMounts"]
    assert volume == mount, "the dshm volume and its mount come together"
    return volume


PLACEMENT = ("nodeSelector", "tolerations", "affinity")


@settings(max_examples=60, deadline=None)
@given(specs())
def test_gpu_limits_shm_and_placement_follow_the_plan(spec: Eagle3RunSpec) -> None:
    gpu = spec.node_pool.gpu_resource_name
    wanted_placement = spec.node_pool.model_dump(mode="json", by_alias=True, exclude_none=True)
    for plan, job in stage_jobs(TINY_RUN, spec):
        resources = container_of(job)["resources"]
        if plan.gpus > 0:
            assert resources["limits"][gpu] == plan.gpus
            assert resources["requests"][gpu] == plan.gpus
        else:
            assert gpu not in resources.get("limits", {})
            assert gpu not in resources.get("requests", {})
        assert has_shm(job) == plan.uses_vllm
        pod = pod_of(job)
        for key in PLACEMENT:
            if plan.gpus > 0 and wanted_placement[key]:
                assert pod[key] == wanted_placement[key]
            else:
                assert key not in pod, (plan.stage, key)


@settings(max_examples=30, deadline=None)
@given(specs())
def test_serving_is_gpu_placed_with_tp_gpus_and_shm(spec: Eagle3RunSpec) -> None:
    [deployment] = [o for o in all_objects(TINY_RUN, spec) if o["kind"] == "Deployment"]
    resources = container_of(deployment)["resources"]
    tp = spec.verifier.tensor_parallel_size
    gpu = spec.node_pool.gpu_resource_name
    # the GPUs, and the default CPU and memory per GPU (the memory limit twice the request)
    assert resources == {
        "requests": {gpu: tp, "cpu": str(4 * tp), "memory": f"{16 * tp}Gi"},
        "limits": {gpu: tp, "memory": f"{32 * tp}Gi"},
    }
    assert has_shm(deployment)
    pod = pod_of(deployment)
    assert pod.get("nodeSelector", {}) == spec.node_pool.node_selector
    assert pod.get("affinity", {}) == spec.node_pool.affinity


@settings(max_examples=30, deadline=None)
@given(specs())
def test_stage_override_resources_are_merged(spec: Eagle3RunSpec) -> None:
    for plan, job in stage_jobs(TINY_RUN, spec):
        override = getattr(spec.stages, plan.stage.value)
        resources = container_of(job)["resources"]
        if override is not None:
            assert resources["requests"]["cpu"] == "2"
            assert resources["limits"]["memory"] == "8Gi"
        else:
            assert "cpu" not in resources.get("requests", {})


@settings(max_examples=30, deadline=None)
@given(specs())
def test_hf_token_env_iff_secret(spec: Eagle3RunSpec) -> None:
    for obj in all_objects(TINY_RUN, spec):
        if obj["kind"] not in ("Job", "Deployment"):
            continue
        env = {e["name"]: e for e in container_of(obj)["env"]}
        assert env["HF_HOME"]["value"] == "/models/hf"
        assert env["EAGLE3_RUN"]["value"] == TINY_RUN.name
        if spec.hf_token_secret is None:
            assert "HF_TOKEN" not in env
        else:
            ref = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": spec.hf_token_secret.name, "key": spec.hf_token_secret.key}


CASES = [(TINY_RUN, tiny_spec), (KIMI_RUN, kimi_spec)]


@pytest.mark.parametrize(("run", "make_spec"), CASES, ids=["tiny", "kimi"])
def test_every_object_is_labelled_and_owned(run: RunRef, make_spec: Any) -> None:
    spec = make_spec()
    for obj in all_objects(run, spec):
        meta = obj["metadata"]
        assert meta["namespace"] == run.namespace
        assert meta["labels"][names.LABEL_MANAGED_BY] == names.MANAGED_BY
        assert meta["labels"][names.LABEL_RUN] == run.name
        assert meta["labels"][names.LABEL_STAGE]
        kept = obj["kind"] == "PersistentVolumeClaim" and not spec.storage.artifacts.delete_with_run
        if kept:
            assert "ownerReferences" not in meta
            continue
        [owner] = meta["ownerReferences"]
        assert owner["controller"] is True
        assert owner["uid"] == run.uid
        assert (owner["apiVersion"], owner["kind"], owner["name"]) == (
            "eagle3.dev/v1alpha1",
            "Eagle3Run",
            run.name,
        )


def test_claim_owner_follows_delete_with_run() -> None:
    kept = copy.deepcopy(TINY_SPEC)
    kept["storage"]["artifacts"]["deleteWithRun"] = False
    claims = [o for o in all_objects(TINY_RUN, parse_spec(kept)) if o["kind"] == "PersistentVolumeClaim"]
    assert "ownerReferences" not in claims[0]["metadata"]
    claims = [o for o in all_objects(TINY_RUN, tiny_spec()) if o["kind"] == "PersistentVolumeClaim"]
    assert claims[0]["metadata"]["ownerReferences"] == [TINY_RUN.owner_reference()]


@pytest.mark.parametrize(("run", "make_spec"), CASES, ids=["tiny", "kimi"])
def test_builders_are_deterministic(run: RunRef, make_spec: Any) -> None:
    first = all_objects(run, make_spec())
    second = all_objects(run, make_spec())
    assert first == second
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def test_builders_do_not_alias_spec_data() -> None:
    """Mutating a built object must not leak into the next build: no dict of the spec is shared."""
    spec = parse_spec(KIMI_SPEC | {"nodePool": KIMI_SPEC["nodePool"] | {"affinity": AFFINITY}})
    expected = copy.deepcopy(all_objects(KIMI_RUN, spec))
    for obj in all_objects(KIMI_RUN, spec):
        if obj["kind"] in ("Job", "Deployment") and "nodeSelector" in pod_of(obj):
            pod = pod_of(obj)
            pod["nodeSelector"]["mutated"] = "yes"
            pod["tolerations"][0]["mutated"] = "yes"
            pod["affinity"]["nodeAffinity"]["mutated"] = "yes"
            container_of(obj)["resources"]["limits"]["mutated"] = "1"
            container_of(obj)["args" if "args" in container_of(obj) else "command"].append("--mutated")
    assert all_objects(KIMI_RUN, spec) == expected


def test_every_training_stage_has_a_job_when_regenerating() -> None:
    assert [p.stage.value for p, _ in stage_jobs(KIMI_RUN, kimi_spec())] == STAGES
    without = parse_spec(derive(TINY_SPEC, regeneration={"enabled": False}))
    assert [p.stage.value for p, _ in stage_jobs(TINY_RUN, without)] == [s for s in STAGES if s != "generate"]
    assert [p.stage.value for p in plan_stages(tiny_spec())] == [
        "predict",
        *STAGES,
        "verify",
    ]  # skipped: predict, verify


def test_a_pinned_draft_with_a_sha256_has_only_the_verify_job() -> None:
    assert [p.stage.value for p, _ in stage_jobs(TINY_RUN, pinned_spec())] == ["verify"]
    unchecked = parse_spec(TINY_SPEC | {"serving": {"pinnedCheckpoint": {"path": "export/abc"}}})
    assert stage_jobs(TINY_RUN, unchecked) == []

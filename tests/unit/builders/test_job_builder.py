"""Stage Jobs, the spec ConfigMap and the artifacts claim."""

from __future__ import annotations

import copy
import json
import posixpath
import re
from typing import Any

import pytest

from eagle3_contract.api.spec import DEFAULT_PIPELINE_IMAGE
from eagle3_contract.api.validation import parse_spec
from eagle3_contract.exit_codes import OOM_EXIT_CODE
from eagle3_contract.mounts import ARTIFACTS_MOUNT, SPEC_MOUNT
from eagle3_contract.stages import Stage, plan_stages, stage_argv
from eagle3_operator.builders import build_artifacts_claim, build_job, build_spec_configmap, names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.pod import artifacts_claim
from tests.tiny_spec import derive
from tests.unit.builders.builder_cases import (
    KIMI_RUN,
    TINY_RUN,
    TINY_SPEC,
    configmap_name,
    kimi_spec,
    plan_of,
    spec_hash,
    stage_jobs,
    tiny_spec,
)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LONG_RUN = RunRef(name="r" * 40 + "-" + "x" * 59, namespace="eagle3", uid="uid-long")


def container(job: dict[str, Any]) -> dict[str, Any]:
    [out] = job["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = out
    return result


@pytest.mark.parametrize("attempt", [0, 1, 7])
@pytest.mark.parametrize("budget", [None, 512])
def test_container_command_is_the_stage_argv(attempt: int, budget: int | None) -> None:
    spec = kimi_spec()
    cm = configmap_name(KIMI_RUN, spec)
    for plan in plan_stages(spec):
        job = build_job(KIMI_RUN, spec, plan, attempt, budget, cm)
        assert container(job)["command"] == stage_argv(plan, SPEC_MOUNT, ARTIFACTS_MOUNT, budget)
        assert container(job)["name"] == plan.stage.value
        assert container(job)["image"] == (spec.images.pipeline or DEFAULT_PIPELINE_IMAGE)
        annotations = job["metadata"].get("annotations", {})
        assert annotations.get(names.ANNOTATION_TOKEN_BUDGET) == (None if budget is None else str(budget))


def test_job_names_are_short_and_deterministic_for_a_long_run_name() -> None:
    assert len(LONG_RUN.name) == 100
    spec = kimi_spec()
    seen = set()
    for attempt in range(12):
        jobs = stage_jobs(LONG_RUN, spec, attempt)
        again = [job["metadata"]["name"] for _, job in stage_jobs(LONG_RUN, spec, attempt)]
        assert [job["metadata"]["name"] for _, job in jobs] == again
        for plan, job in jobs:
            name = job["metadata"]["name"]
            assert len(name) <= names.MAX_NAME and DNS_LABEL.match(name), name
            assert name == names.job_name(LONG_RUN.name, plan.stage.value, plan.hash, attempt)
            assert all(len(v) <= names.MAX_NAME for v in job["metadata"]["labels"].values())
            seen.add(name)
    assert len(seen) == 12 * len(stage_jobs(LONG_RUN, spec)), "names differ by stage, hash and attempt"


def test_job_labels_select_run_stage_hash_and_attempt() -> None:
    spec = kimi_spec()
    plan = plan_of(spec, Stage.TRAIN)
    job = build_job(KIMI_RUN, spec, plan, 3, None, configmap_name(KIMI_RUN, spec))
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert pod_labels == names.labels(KIMI_RUN.name, "train") | {
        names.LABEL_HASH: plan.hash,
        names.LABEL_ATTEMPT: "3",
    }
    assert job["metadata"]["labels"] == pod_labels | {names.LABEL_KUEUE_QUEUE: "gpu-h200"}
    assert job["metadata"]["name"].endswith(f"-train-{plan.hash}-r3")
    tiny = build_job(TINY_RUN, tiny_spec(), plan_of(tiny_spec(), Stage.TRAIN), 0, None, "cm")
    assert names.LABEL_KUEUE_QUEUE not in tiny["metadata"]["labels"]


def test_pod_failure_policy_only_for_stages_that_retry_out_of_memory() -> None:
    for plan, job in stage_jobs(KIMI_RUN, kimi_spec()):
        policy = job["spec"].get("podFailurePolicy")
        if not plan.retries_oom:
            assert policy is None, plan.stage
            continue
        ignore, fail = policy["rules"]
        assert ignore["action"] == "Ignore"
        assert ignore["onPodConditions"][0]["type"] == "DisruptionTarget"
        assert fail["action"] == "FailJob"
        assert fail["onExitCodes"] == {
            "containerName": container(job)["name"],
            "operator": "In",
            "values": [OOM_EXIT_CODE],
        }
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_stage_overrides_set_backoff_and_deadline() -> None:
    jobs = {plan.stage: job["spec"] for plan, job in stage_jobs(KIMI_RUN, kimi_spec())}
    assert jobs[Stage.EXTRACT]["activeDeadlineSeconds"] == 172800
    assert jobs[Stage.EXTRACT]["backoffLimit"] == 2
    assert jobs[Stage.TRAIN]["backoffLimit"] == 1
    assert "activeDeadlineSeconds" not in jobs[Stage.TRAIN]
    doc = copy.deepcopy(TINY_SPEC) | {"stages": {"vocab": {"backoffLimit": 0}}}
    vocab = plan_of(parse_spec(doc), Stage.VOCAB)
    assert build_job(TINY_RUN, parse_spec(doc), vocab, 0, None, "cm")["spec"]["backoffLimit"] == 0


def test_spec_volume_puts_the_run_document_at_spec_mount() -> None:
    spec = tiny_spec()
    cm = build_spec_configmap(TINY_RUN, spec, spec_hash(spec))
    _, job = stage_jobs(TINY_RUN, spec)[0]
    pod = job["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if "configMap" in v]
    [mount] = [m for m in container(job)["volumeMounts"] if m["name"] == volume["name"]]
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    [item] = volume["configMap"]["items"]
    assert item["key"] in cm["data"]
    assert posixpath.join(mount["mountPath"], item["path"]) == SPEC_MOUNT
    assert mount["readOnly"] is True


def test_artifacts_volume_and_model_cache() -> None:
    cases: list[tuple[RunRef, Any, dict[str, Any]]] = [
        (TINY_RUN, parse_spec(derive(TINY_SPEC, storage={"modelCache": None})), {"emptyDir": {}}),
        (KIMI_RUN, kimi_spec(), {"persistentVolumeClaim": {"claimName": "hf-model-cache"}}),
    ]
    for run, spec, expected in cases:
        _, job = stage_jobs(run, spec)[0]
        volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
        assert volumes["artifacts"]["persistentVolumeClaim"] == {"claimName": artifacts_claim(run, spec)}
        assert {k: v for k, v in volumes["model-cache"].items() if k != "name"} == expected
        mounts = {m["name"]: m["mountPath"] for m in container(job)["volumeMounts"]}
        assert mounts["artifacts"] == ARTIFACTS_MOUNT
        assert mounts["model-cache"] == "/models"


def test_existing_artifacts_claim_is_used() -> None:
    doc = copy.deepcopy(TINY_SPEC)
    doc["storage"]["artifacts"]["claimName"] = "shared-artifacts"
    spec = parse_spec(doc)
    assert artifacts_claim(TINY_RUN, spec) == "shared-artifacts"
    assert artifacts_claim(TINY_RUN, tiny_spec()) == "tiny-artifacts"


def test_spec_configmap_round_trips_the_spec() -> None:
    for run, spec in ((TINY_RUN, tiny_spec()), (KIMI_RUN, kimi_spec())):
        cm = build_spec_configmap(run, spec, spec_hash(spec))
        assert cm["immutable"] is True
        assert cm["metadata"]["name"] == names.spec_configmap_name(run.name, spec_hash(spec))
        assert cm["metadata"]["labels"][names.LABEL_STAGE] == "spec"
        document = json.loads(cm["data"]["run.json"])
        assert document["metadata"] == {"name": run.name, "namespace": run.namespace}
        assert (document["apiVersion"], document["kind"]) == ("eagle3.dev/v1alpha1", "Eagle3Run")
        assert parse_spec(document["spec"]) == spec


def test_artifacts_claim_spec() -> None:
    claim = build_artifacts_claim(KIMI_RUN, kimi_spec())
    assert claim["metadata"]["name"] == "kimi-k2-5-artifacts"
    assert claim["metadata"]["labels"][names.LABEL_STAGE] == "artifacts"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "2Ti"}},
        "storageClassName": "fsx-lustre",
    }
    assert "storageClassName" not in build_artifacts_claim(TINY_RUN, tiny_spec())["spec"]

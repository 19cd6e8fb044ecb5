"""spec.pod on every pod; vLLM's CPU and memory; the CPU backend; the serving PodDisruptionBudget; the
PodMonitors' labels."""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.validation import parse_spec
from eagle3_contract.stages import Stage, plan_stages
from eagle3_operator.builders import build_deployment, build_job, build_pod_monitor, names
from eagle3_operator.builders.disruption import build_pod_disruption_budget
from eagle3_operator.builders.monitoring import build_stage_pod_monitor
from eagle3_operator.builders.pod import HOME
from eagle3_operator.builders.pod_security import pod_template
from eagle3_operator.builders.producers import build_producers
from eagle3_operator.builders.serving import serving_selector
from tests.tiny_spec import derive
from tests.unit.builders.builder_cases import (
    AFFINITY,
    GPU_TOLERATION,
    KIMI_ONLINE_SPEC,
    KIMI_RUN,
    KIMI_SPEC,
    PINNED_SHA256,
    TINY_RUN,
    TINY_SPEC,
    draft_dir,
)
from tests.unit.builders.test_pod_security import built_pods

USER_TOLERATION = {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
USER_AFFINITY: dict[str, Any] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
POD = {
    "serviceAccountName": "eagle3-runner",
    "imagePullSecrets": [{"name": "registry-creds"}],
    "labels": {"team": "ml", names.LABEL_RUN: "hijack", names.LABEL_STAGE: "hijack"},
    "annotations": {"owner": "ml-platform", "prometheus.io/port": "1"},
    "env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}, {"name": "HF_HOME", "value": "/models/x"}],
    "priorityClassName": "batch-high",
    "tolerations": [USER_TOLERATION],
    "affinity": USER_AFFINITY,
}


def customised(doc: dict[str, Any], **pod: Any) -> Eagle3RunSpec:
    return parse_spec(derive(doc, pod=POD | pod))


def containers(template: Any) -> list[dict[str, Any]]:
    spec = template["spec"]
    out: list[dict[str, Any]] = spec["containers"] + spec.get("initContainers", [])
    return out


def test_pod_settings_reach_every_pod_and_container() -> None:
    spec = customised(KIMI_ONLINE_SPEC)
    pods = built_pods(KIMI_RUN, spec)
    assert {"producers", "mooncake", "deployment+check", "job/train"} <= set(pods)
    for name, obj in pods.items():
        template = pod_template(obj)
        pod = template["spec"]
        assert pod["serviceAccountName"] == "eagle3-runner", name
        assert pod["imagePullSecrets"] == [{"name": "registry-creds"}], name
        assert pod["priorityClassName"] == "batch-high", name
        assert USER_TOLERATION in pod["tolerations"], name
        labels, annotations = template["metadata"]["labels"], template["metadata"]["annotations"]
        assert labels["team"] == "ml" and annotations["owner"] == "ml-platform", name
        # the operator's selector labels win over the user's
        assert labels[names.LABEL_RUN] == "kimi-k2-5" and labels[names.LABEL_STAGE] != "hijack", name
        for container in template["spec"]["containers"]:
            variables = container["env"]
            assert variables[-2:] == POD["env"], (name, container["name"])
            assert [v["name"] for v in variables].count("HF_HOME") == 1, (name, container["name"])
        for guard in template["spec"].get("initContainers", []):  # the operator's own checks: none of them
            assert "env" not in guard, (name, guard["name"])


def test_the_users_variable_replaces_the_operators_of_the_same_name() -> None:
    spec = customised(TINY_SPEC)
    [vllm] = build_deployment(TINY_RUN, spec, draft_dir(spec))["spec"]["template"]["spec"]["containers"]
    homes = [v for v in vllm["env"] if v["name"] == "HF_HOME"]
    assert homes == [{"name": "HF_HOME", "value": "/models/x"}]


def test_prometheus_annotations_of_the_vllm_pods_are_the_operators() -> None:
    spec = customised(KIMI_SPEC)
    template = build_deployment(KIMI_RUN, spec, draft_dir(spec))["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "8000"
    assert template["metadata"]["annotations"]["owner"] == "ml-platform"


def test_pool_pods_add_the_pools_tolerations_and_prefer_its_affinity() -> None:
    spec = customised(derive(KIMI_SPEC, nodePool={"affinity": AFFINITY}))
    pods = built_pods(KIMI_RUN, spec)
    train = pod_template(pods["job/train"])["spec"]
    assert train["tolerations"] == [USER_TOLERATION, GPU_TOLERATION]
    assert train["affinity"] == AFFINITY
    prepare = pod_template(pods["job/prepare"])["spec"]  # no GPU: off the pool
    assert prepare["tolerations"] == [USER_TOLERATION]
    assert prepare["affinity"] == USER_AFFINITY
    assert "nodeSelector" not in prepare


def test_pool_pods_take_the_pods_affinity_when_the_pool_has_none() -> None:
    spec = customised(KIMI_SPEC)
    pods = built_pods(KIMI_RUN, spec)
    assert pod_template(pods["job/train"])["spec"]["affinity"] == USER_AFFINITY
    assert pod_template(pods["deployment"])["spec"]["affinity"] == USER_AFFINITY


def test_unset_pod_settings_leave_the_pods_without_them() -> None:
    pod = pod_template(build_deployment(TINY_RUN, parse_spec(TINY_SPEC), draft_dir(parse_spec(TINY_SPEC))))
    for key in ("serviceAccountName", "imagePullSecrets", "priorityClassName"):
        assert key not in pod["spec"]
    assert set(pod["metadata"]["annotations"]) == {
        "prometheus.io/scrape",
        "prometheus.io/port",
        "prometheus.io/path",
        names.ANNOTATION_DRAFT,
    }


# --- vLLM resources, the CPU backend ------------------------------------------------------------------


def vllm_container(spec: Eagle3RunSpec, sha256: str | None = None) -> dict[str, Any]:
    deployment = build_deployment(KIMI_RUN, spec, draft_dir(spec), sha256)
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def test_vllm_defaults_to_4_cpus_and_16gi_per_gpu() -> None:
    spec = parse_spec(derive(KIMI_SPEC, verifier={"tensorParallelSize": 2}))
    assert vllm_container(spec)["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 2},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": 2},
    }


def test_serving_resources_replace_the_default_and_keep_the_gpus() -> None:
    given = {"requests": {"cpu": "12", "memory": "100Gi"}, "limits": {"cpu": "16"}}
    spec = parse_spec(derive(KIMI_SPEC, serving={"resources": given}))
    assert vllm_container(spec)["resources"] == {
        "requests": {"cpu": "12", "memory": "100Gi", "nvidia.com/gpu": 8},
        "limits": {"cpu": "16", "nvidia.com/gpu": 8},
    }


def test_producers_default_to_the_serving_resources_without_an_extract_override() -> None:
    doc = derive(KIMI_ONLINE_SPEC, stages={"extract": None}, verifier={"tensorParallelSize": 4})
    spec = parse_spec(doc)
    train = next(p for p in plan_stages(spec) if p.stage == Stage.TRAIN)
    producers = build_producers(KIMI_RUN, spec, train.hash, "cm")
    [container] = producers["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": 4},
        "limits": {"memory": "128Gi", "nvidia.com/gpu": 4},
    }


def test_a_cpu_run_asks_no_pod_for_gpus() -> None:
    doc = derive(KIMI_ONLINE_SPEC, nodePool={"device": "cpu"}, stages={"extract": None})
    spec = parse_spec(doc)
    for name, obj in built_pods(KIMI_RUN, spec).items():
        for container in containers(pod_template(obj)):
            resources = container.get("resources", {})
            assert "nvidia.com/gpu" not in resources.get("requests", {}), name
            assert "nvidia.com/gpu" not in resources.get("limits", {}), name
    assert vllm_container(spec)["resources"] == {
        "requests": {"cpu": "4", "memory": "8Gi"},
        "limits": {"memory": "16Gi"},
    }


def test_cpu_serving_runs_the_pipeline_image_eagerly_with_a_small_kv_cache() -> None:
    doc = derive(KIMI_SPEC, nodePool={"device": "cpu"}, images={"pipeline": "registry.local/pipeline-cpu:1"})
    spec = parse_spec(doc)
    container = vllm_container(spec, PINNED_SHA256)
    assert container["image"] == "registry.local/pipeline-cpu:1"
    assert "--enforce-eager" in container["args"]
    assert {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"} in container["env"]
    init = build_deployment(KIMI_RUN, spec, draft_dir(spec), PINNED_SHA256)["spec"]["template"]["spec"]
    assert init["initContainers"][0]["image"] == "registry.local/pipeline-cpu:1"
    # the node pool's placement stays (nodeSelector of the kimi spec)
    assert init["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}


def test_cpu_serving_keeps_a_chosen_vllm_image() -> None:
    doc = derive(KIMI_SPEC, nodePool={"device": "cpu"}, images={"vllm": "my/vllm-cpu:1"})
    assert vllm_container(parse_spec(doc))["image"] == "my/vllm-cpu:1"
    doc = derive(KIMI_SPEC, nodePool={"device": "cpu"}, serving={"image": "my/serving:2"})
    assert vllm_container(parse_spec(doc))["image"] == "my/serving:2"


def test_gpu_serving_runs_the_vllm_image_without_cpu_settings() -> None:
    container = vllm_container(parse_spec(KIMI_SPEC))
    assert container["image"] == "vllm/vllm-openai:v0.32.0"
    assert "--enforce-eager" not in container["args"]
    assert "VLLM_CPU_KVCACHE_SPACE" not in {v["name"] for v in container["env"]}


def test_non_root_vllm_has_a_writable_home_for_its_caches() -> None:
    spec = parse_spec(KIMI_SPEC)
    pod = build_deployment(KIMI_RUN, spec, draft_dir(spec))["spec"]["template"]["spec"]
    [home] = [v for v in pod["volumes"] if v["name"] == "home"]
    assert home == {"name": "home", "emptyDir": {}}
    container = pod["containers"][0]
    assert {"name": "home", "mountPath": HOME} in container["volumeMounts"]
    variables = {v["name"]: v.get("value") for v in container["env"]}
    assert variables["HOME"] == HOME
    for key in ("XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert variables[key].startswith(HOME + "/"), key


# --- the PodDisruptionBudget and the PodMonitors -----------------------------------------------------


def test_the_disruption_budget_selects_the_vllm_pods() -> None:
    spec = parse_spec(derive(KIMI_SPEC, serving={"disruptionBudget": {"maxUnavailable": "25%"}}))
    pdb = build_pod_disruption_budget(KIMI_RUN, spec)
    assert (pdb["apiVersion"], pdb["kind"]) == ("policy/v1", "PodDisruptionBudget")
    assert pdb["metadata"]["name"] == names.serving_name(KIMI_RUN.name)
    assert pdb["metadata"]["ownerReferences"] == [KIMI_RUN.owner_reference()]
    assert pdb["spec"] == {"selector": {"matchLabels": serving_selector(KIMI_RUN)}, "maxUnavailable": "25%"}
    deployment = build_deployment(KIMI_RUN, spec, draft_dir(spec))
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_the_disruption_budget_hash_follows_max_unavailable() -> None:
    def hashed(value: Any) -> str:
        spec = parse_spec(derive(KIMI_SPEC, serving={"disruptionBudget": {"maxUnavailable": value}}))
        pdb = build_pod_disruption_budget(KIMI_RUN, spec)
        assert pdb["spec"]["maxUnavailable"] == value
        out: str = pdb["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH]
        return out

    assert len({hashed(1), hashed(2), hashed("50%")}) == 3


LABELS = {"release": "kube-prometheus-stack", names.LABEL_MANAGED_BY: "someone-else"}


def test_both_pod_monitors_carry_the_pod_monitor_labels_under_the_operators() -> None:
    plain, spec = (
        parse_spec(KIMI_SPEC),
        parse_spec(derive(KIMI_SPEC, monitoring={"podMonitorLabels": LABELS})),
    )
    for build in (build_pod_monitor, build_stage_pod_monitor):
        monitor, before = build(KIMI_RUN, spec), build(KIMI_RUN, plain)
        labels = monitor["metadata"]["labels"]
        assert labels["release"] == "kube-prometheus-stack"
        assert labels == before["metadata"]["labels"] | {"release": "kube-prometheus-stack"}
        assert labels[names.LABEL_MANAGED_BY] == names.MANAGED_BY
        assert monitor["spec"] == before["spec"]
        # a change of the labels changes the hash, so the planner patches the PodMonitor
        hash_key = names.ANNOTATION_SPEC_HASH
        assert monitor["metadata"]["annotations"][hash_key] != before["metadata"]["annotations"][hash_key]


def test_a_stage_job_gets_the_pod_settings() -> None:
    spec = customised(TINY_SPEC)
    plan = next(p for p in plan_stages(spec) if p.stage == Stage.PREPARE)
    job = build_job(TINY_RUN, spec, plan, 0, None, "cm")
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "eagle3-runner"
    assert "team" not in job["metadata"]["labels"]  # pod labels only: the Job keeps the operator's

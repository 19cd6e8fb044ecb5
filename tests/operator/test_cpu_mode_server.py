"""The tiny example in CPU mode passes a real API server's dry run: every object the operator would create
for it (each stage Job, the spec ConfigMap, the artifacts PVC, the serving Deployment and Service, and the
PodMonitor and PodDisruptionBudget where the server serves their APIs), the Eagle3Run itself and the
objects of examples/tiny/models-job.yaml, with no container asking for a GPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_contract.api import parse_spec, spec_document
from eagle3_contract.api.base import API_VERSION, PLURAL
from eagle3_contract.api.defaults import OperatorDefaults, with_operator_defaults
from eagle3_contract.stages import plan_stages
from eagle3_operator.builders import (
    build_artifacts_claim,
    build_canary_deployment,
    build_deployment,
    build_job,
    build_pod_monitor,
    build_service,
    build_spec_configmap,
)
from eagle3_operator.builders.disruption import build_pod_disruption_budget
from eagle3_operator.builders.names import RunRef
from tests.harness.cluster import Cluster
from tests.unit.builders.builder_cases import configmap_name, draft_dir, spec_hash

pytestmark = pytest.mark.apiserver
TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny"
CPU_IMAGE = "registry.example/eagle3/pipeline:0.1.0-cpu"
DEFAULTS = OperatorDefaults(
    pipeline_image="registry.example/eagle3/pipeline:0.1.0", pipeline_cpu_image=CPU_IMAGE
)
PATHS = {
    "Job": ("batch/v1", "jobs"),
    "ConfigMap": ("v1", "configmaps"),
    "Service": ("v1", "services"),
    "PersistentVolumeClaim": ("v1", "persistentvolumeclaims"),
    "Deployment": ("apps/v1", "deployments"),
    "PodMonitor": ("monitoring.coreos.com/v1", "podmonitors"),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
}


@pytest.fixture
def real(backend):
    if not backend.real:
        pytest.skip("server-side validation needs a real API server")
    return backend


async def dry_run(cluster: Cluster, body: dict[str, Any]) -> dict[str, Any]:
    api, plural = PATHS[body["kind"]]
    stored: dict[str, Any] = await cluster._call("POST", cluster.path(api, plural) + "?dryRun=All", body)
    return stored


async def serves(cluster: Cluster, api_version: str, kind: str) -> bool:
    """Whether the server serves `kind` in `api_version` (Kubernetes 1.20 has no policy/v1; the Prometheus
    Operator's CRDs are installed only where it runs)."""
    url = f"{cluster.url}/apis/{api_version}"
    async with cluster.session.get(url, headers=cluster.headers, ssl=False) as resp:
        if resp.status == 404:
            return False
        assert resp.status == 200, f"GET {url}: HTTP {resp.status}"
        found = await resp.json(content_type=None)
    return any(r.get("kind") == kind for r in found.get("resources", []))


def example_run() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((TINY / "eagle3run.yaml").read_text())
    return doc


def tiny_objects(ref: RunRef) -> list[dict[str, Any]]:
    """What the operator builds for the tiny example, with its defaults applied as the executor does."""
    spec = parse_spec(with_operator_defaults(example_run()["spec"], DEFAULTS))
    cm = configmap_name(ref, spec)
    jobs = [build_job(ref, spec, plan, 0, None, cm) for plan in plan_stages(spec)]
    return [
        build_spec_configmap(ref, spec, spec_hash(spec)),
        build_artifacts_claim(ref, spec),
        *jobs,
        build_deployment(ref, spec, draft_dir(spec)),
        build_canary_deployment(ref, spec, draft_dir(spec)),
        build_service(ref),
        build_pod_monitor(ref, spec),
        build_pod_disruption_budget(ref, spec),
    ]


def containers(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    pod = body.get("spec", {}).get("template", {}).get("spec", {})
    yield from pod.get("initContainers", [])
    yield from pod.get("containers", [])


def gpu_requests(body: dict[str, Any]) -> list[str]:
    """`container: resource` for every GPU-like resource a container of `body` requests or limits."""
    return [
        f"{c['name']}: {resource}"
        for c in containers(body)
        for section in ("requests", "limits")
        for resource in c.get("resources", {}).get(section, {})
        if "gpu" in resource.lower() or resource.startswith(("nvidia.com/", "amd.com/"))
    ]


def test_the_tiny_example_is_a_cpu_run_on_a_model_cache_claim() -> None:
    spec = parse_spec(example_run()["spec"])
    assert spec.node_pool.device == "cpu" and spec.storage.model_cache.claim_name == "tiny-models"
    assert spec.images.pipeline is None, "the example relies on the operator's --pipeline-cpu-image"
    assert all(plan.gpus == 0 for plan in plan_stages(spec))


def test_the_gpu_check_sees_a_gpu() -> None:
    """The check below can fail: a GPU run's generate Job asks for the pool's GPU resource."""
    ref = RunRef("tiny", "eagle3", "00000000-0000-0000-0000-000000000003")
    doc = example_run()["spec"] | {"nodePool": {"device": "gpu"}}
    spec = parse_spec(with_operator_defaults(doc, DEFAULTS))
    generate = next(p for p in plan_stages(spec) if p.stage == "generate")
    assert gpu_requests(build_job(ref, spec, generate, 0, None, "cm")) == ["generate: nvidia.com/gpu"] * 2


async def test_the_tiny_examples_cpu_objects_pass_a_server_side_dry_run(real):
    cluster = real.cluster
    ref = RunRef("tiny", cluster.ns, "00000000-0000-0000-0000-000000000003")
    objects = tiny_objects(ref)
    kinds = [o["kind"] for o in objects]
    assert kinds.count("Job") == 9 and {"ConfigMap", "PersistentVolumeClaim", "Deployment", "Service"} <= set(
        kinds
    )
    checked = []
    for body in objects:
        assert not gpu_requests(body), f"{body['kind']} {body['metadata']['name']} requests a GPU"
        if body["kind"] == "Job":
            assert [c["image"] for c in containers(body)] == [CPU_IMAGE], "the operator's CPU image"
        api_version = body["apiVersion"]
        if "/" in api_version and not await serves(cluster, api_version, body["kind"]):
            continue  # 1.20: no policy/v1; no Prometheus Operator CRDs
        stored = await dry_run(cluster, body)
        assert stored["metadata"]["name"] == body["metadata"]["name"]
        assert not gpu_requests(stored), f"{body['kind']}: the server defaulted a GPU request?"
        checked.append(body["kind"])
    assert checked.count("Job") == 9 and checked.count("Deployment") == 2 and "Service" in checked


async def test_the_tiny_run_and_its_models_job_pass_a_server_side_dry_run(real):
    cluster = real.cluster
    run = example_run()
    run["metadata"]["namespace"] = cluster.ns
    stored = await cluster._call("POST", cluster.path(API_VERSION, PLURAL) + "?dryRun=All", run)
    assert stored["spec"] == spec_document(parse_spec(run["spec"])), "pruned or defaulted differently"
    assert stored["spec"]["nodePool"]["device"] == "cpu"
    models = [d for d in yaml.safe_load_all((TINY / "models-job.yaml").read_text()) if d]
    assert [d["kind"] for d in models] == ["PersistentVolumeClaim", "Job"]
    claim = run["spec"]["storage"]["modelCache"]["claimName"]
    assert models[0]["metadata"]["name"] == claim
    volumes = models[1]["spec"]["template"]["spec"]["volumes"]
    assert [v["persistentVolumeClaim"]["claimName"] for v in volumes] == [claim]
    for body in models:
        body["metadata"]["namespace"] = cluster.ns
        assert not gpu_requests(body)
        stored = await dry_run(cluster, body)
        assert stored["metadata"]["name"] == body["metadata"]["name"]

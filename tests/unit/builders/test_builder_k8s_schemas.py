"""The built objects against the Kubernetes OpenAPI schemas (offline, strict: unknown fields are errors)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.validation import parse_spec
from eagle3_operator.builders import build_canary_deployment, build_deployment
from eagle3_operator.builders.disruption import build_pod_disruption_budget
from eagle3_operator.builders.names import RunRef
from tests.contract.api.api_support import valid_specs
from tests.unit.builders.builder_cases import (
    KIMI_RUN,
    PINNED_SHA256,
    TINY_RUN,
    all_objects,
    draft_dir,
    kimi_online_spec,
    kimi_spec,
    online_objects,
    pinned_spec,
    specs,
    stage_jobs,
    tiny_spec,
)

kubernetes_validate = pytest.importorskip("kubernetes_validate")

KUBERNETES_VERSION = "1.31"
# CRDs have no schema in kubernetes-validate.
NOT_IN_SCHEMAS = {"PodMonitor"}


def assert_valid(obj: dict[str, Any], context: str = "") -> None:
    """`obj` passes the Kubernetes schema of its kind, strictly; else the test fails naming the field."""
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(str(p) for p in exc.path)
        pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {path}: {exc.message}{context}")


@pytest.mark.parametrize(
    ("run", "make_spec"), [(TINY_RUN, tiny_spec), (KIMI_RUN, kimi_spec)], ids=["tiny", "kimi"]
)
def test_objects_match_kubernetes_schemas(run: RunRef, make_spec: Any) -> None:
    checked = set()
    for obj in all_objects(run, make_spec()):
        if obj["kind"] in NOT_IN_SCHEMAS:
            continue
        assert_valid(obj)
        checked.add(obj["kind"])
    assert checked == {"ConfigMap", "PersistentVolumeClaim", "Job", "Deployment", "Service"}


def test_the_online_and_multi_node_objects_match_kubernetes_schemas() -> None:
    objects = online_objects(KIMI_RUN, kimi_online_spec())
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    kinds = [o["kind"] for o in objects]
    assert kinds == ["Deployment", "Service", "Deployment", "Service", "Job", "Service"]


def test_the_verify_job_and_a_checked_deployment_match_kubernetes_schemas() -> None:
    spec = pinned_spec()
    [(_, job)] = stage_jobs(TINY_RUN, spec)
    deployment = build_deployment(TINY_RUN, spec, "export/3f0c2a9d41be", PINNED_SHA256)
    for obj in (job, deployment):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@settings(max_examples=8, deadline=None)
@given(specs())
def test_generated_specs_build_valid_objects(spec: Eagle3RunSpec) -> None:
    for obj in all_objects(TINY_RUN, spec):
        if obj["kind"] not in NOT_IN_SCHEMAS:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def every_object(run: RunRef, spec: Eagle3RunSpec) -> list[dict[str, Any]]:
    """Every object the builders can make for a run: its stage Jobs, the serving Deployment with and without
    the draft check, the canary, the PodDisruptionBudget and, online, the producers and Mooncake."""
    out = [*all_objects(run, spec), build_deployment(run, spec, draft_dir(spec), PINNED_SHA256)]
    if spec.serving.canary is not None:
        out.append(build_canary_deployment(run, spec, draft_dir(spec), PINNED_SHA256))
    if spec.serving.disruption_budget.enabled:
        out.append(build_pod_disruption_budget(run, spec))
    if spec.extraction.mode == "online":
        out += online_objects(run, spec)
    return out


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
@given(valid_specs())
def test_every_manifest_the_validator_accepts_builds_objects_the_kubernetes_schemas_accept(
    doc: dict[str, Any],
) -> None:
    """Issue 28 item 9: manifests generated from the CRD's own schema (spec.pod, nodePool, every embedded
    Kubernetes type included) and accepted by the local validator build objects Kubernetes 1.31 accepts:
    nothing the run was accepted with is refused by the API server when the operator creates a pod."""
    spec = parse_spec(doc)
    for obj in every_object(TINY_RUN, spec):
        if obj["kind"] not in NOT_IN_SCHEMAS:
            assert_valid(obj, f"\nspec: {doc}")


def test_strict_validation_catches_a_typo() -> None:
    [job, *_] = [o for o in all_objects(TINY_RUN, tiny_spec()) if o["kind"] == "Job"]
    job["spec"]["template"]["spec"]["containers"][0]["comand"] = ["true"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)

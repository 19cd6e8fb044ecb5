"""A hand edit of a field the operator applied is drift; what the API server adds or normalises is not
(issue 28 item 16)."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from eagle3_contract.quantity import quantity
from eagle3_operator.builders import build_deployment, build_service
from eagle3_operator.builders.monitoring import build_stage_pod_monitor
from eagle3_operator.builders.names import ANNOTATION_APPLIED, ANNOTATION_SPEC_HASH
from eagle3_operator.reconcile.drift import DRIFTED, has_drifted, holds, observed_hash
from eagle3_operator.reconcile.slim import slim_deployment
from tests.unit.builders.builder_cases import TINY_RUN, draft_dir, tiny_spec


def as_stored(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the API server returns it: defaults filled in, quantities normalised, empties dropped."""
    out = copy.deepcopy(obj)
    out["metadata"] |= {"uid": "u", "resourceVersion": "7", "generation": 1}
    spec = out["spec"]
    if out["kind"] == "Deployment":
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        pod = spec["template"]["spec"]
        pod.setdefault("restartPolicy", "Always")
        pod.setdefault("dnsPolicy", "ClusterFirst")
        for c in pod["containers"]:
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("imagePullPolicy", "IfNotPresent")
            limits = c.get("resources", {}).get("limits", {})
            if "cpu" in limits:
                limits["cpu"] = f"{int(quantity(str(limits['cpu'])) * 1000)}m"  # "4" stored as "4000m"
        out["status"] = {"readyReplicas": 1}
    if out["kind"] == "Service":
        spec.setdefault("clusterIP", "10.0.0.1")
        spec.setdefault("sessionAffinity", "None")
        for port in spec["ports"]:
            port.setdefault("protocol", "TCP")
    return out


def deployment() -> dict[str, Any]:
    spec = tiny_spec()
    return build_deployment(TINY_RUN, spec, draft_dir(spec))


@pytest.mark.parametrize(
    "obj",
    [deployment(), build_service(TINY_RUN), build_stage_pod_monitor(TINY_RUN, tiny_spec())],
    ids=["deployment", "service", "pod-monitor"],
)
def test_what_the_api_server_adds_is_no_drift(obj: dict[str, Any]) -> None:
    stored = as_stored(obj)
    assert not has_drifted(stored, ANNOTATION_APPLIED)
    assert (
        observed_hash(stored, ANNOTATION_SPEC_HASH, ANNOTATION_APPLIED)
        == (obj["metadata"]["annotations"][ANNOTATION_SPEC_HASH])
    )


def test_set_image_and_scale_are_drift_and_mark_the_spec_hash() -> None:
    stored = as_stored(deployment())
    edited = copy.deepcopy(stored)
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.invalid/x:1"
    scaled = copy.deepcopy(stored)
    scaled["spec"]["replicas"] = 3
    extra = copy.deepcopy(stored)
    extra["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "s"})
    for obj in (edited, scaled, extra):
        assert has_drifted(obj, ANNOTATION_APPLIED)
        marked = observed_hash(obj, ANNOTATION_SPEC_HASH, ANNOTATION_APPLIED)
        assert marked == f"{stored['metadata']['annotations'][ANNOTATION_SPEC_HASH]}-{DRIFTED}"


def test_the_slim_deployment_carries_the_mark_and_not_the_applied_json() -> None:
    stored = as_stored(deployment())
    stored["spec"]["replicas"] = 3
    slim = slim_deployment(stored)
    annotations = slim["metadata"]["annotations"]
    assert ANNOTATION_APPLIED not in annotations and annotations[ANNOTATION_SPEC_HASH].endswith(DRIFTED)
    assert not slim_deployment(as_stored(deployment()))["metadata"]["annotations"][
        ANNOTATION_SPEC_HASH
    ].endswith(DRIFTED)


def test_an_object_without_or_with_a_broken_applied_annotation_has_not_drifted() -> None:
    stored = as_stored(deployment())
    stored["spec"]["replicas"] = 3
    older = copy.deepcopy(stored)
    del older["metadata"]["annotations"][ANNOTATION_APPLIED]  # written by an operator before this one
    broken = copy.deepcopy(stored)
    broken["metadata"]["annotations"][ANNOTATION_APPLIED] = "{not json"
    assert not has_drifted(older, ANNOTATION_APPLIED) and not has_drifted(broken, ANNOTATION_APPLIED)


@pytest.mark.parametrize(
    ("applied", "observed", "same"),
    [
        ({"a": 1}, {"a": 1, "b": 2}, True),  # an extra field is someone else's
        ({"a": {}}, {}, True),  # an empty value the server omits
        ({"a": False}, {}, True),
        ({"a": 1}, {}, False),
        ([1, 2], [1, 2, 3], False),  # a list is the operator's as a whole
        ("4", "4000m", True),
        ("16Gi", str(16 * 2**30), True),
        ("1.5", "1500m", True),
        ("1", 1, True),
        ("2Gi", "2G", False),
        ("registry/x:1", "registry/x:2", False),
    ],
)
def test_holds(applied: Any, observed: Any, same: bool) -> None:
    assert holds(applied, observed) is same


def test_quantities() -> None:
    assert quantity("500m") == Decimal("0.5") and quantity("1Ki") == 1024 and quantity("1e3") == 1000
    assert quantity("abc") is None and quantity("1Gb") is None

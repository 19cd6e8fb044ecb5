"""The Kubernetes types a spec embeds (spec.pod's affinity, security contexts and env valueFrom, and
spec.nodePool.affinity) are checked against Kubernetes' own schemas when the run is parsed and by the CRD:
a value the API server would refuse in the pod is refused with the run, naming the field (issue 28, items 8
and 9; the old spec kept these as free-form objects and copied anything into every pod)."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_contract.api.crd import PRESERVE_KEY, model_schema
from eagle3_contract.api.kubernetes_types import kubernetes_version, problems, schema_of
from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.validation import InvalidSpecError, parse_spec
from tests.tiny_spec import tiny

AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
            ]
        }
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 10,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app": "vllm"}},
                },
            }
        ]
    },
}
VALUE_FROM = {"secretKeyRef": {"name": "hf", "key": "token"}}
RESOURCE_FIELD = {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}


def _refused(doc: dict[str, Any]) -> str:
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(doc)
    return str(caught.value)


def test_valid_values_of_each_type_are_accepted_as_given() -> None:
    env = [{"name": "HF_TOKEN", "valueFrom": VALUE_FROM}, {"name": "MEM", "valueFrom": RESOURCE_FIELD}]
    pod = {
        "affinity": AFFINITY,
        "env": env,
        "securityContext": {
            "runAsUser": 1000,
            "sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}],
        },
        "containerSecurityContext": {"readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
    }
    spec = parse_spec(tiny(pod=pod, nodePool={"affinity": AFFINITY}))
    assert spec.pod.affinity == AFFINITY and spec.node_pool.affinity == AFFINITY
    assert [v.value_from for v in spec.pod.env] == [VALUE_FROM, RESOURCE_FIELD]
    assert spec.pod.security_context == pod["securityContext"]


@pytest.mark.parametrize(
    ("pod", "field", "said"),
    [
        # a container's field at the pod level: dropped silently before
        ({"securityContext": {"privileged": True}}, "pod.securityContext", "privileged: no such field"),
        ({"containerSecurityContext": {"runAsUser": "root"}}, "pod.containerSecurityContext", "runAsUser: "),
        (
            {"containerSecurityContext": {"capabilities": ["ALL"]}},
            "pod.containerSecurityContext",
            "capabilities",
        ),
        (
            {"containerSecurityContext": {"seccompProfile": {}}},
            "pod.containerSecurityContext",
            "'type' is a ",
        ),
        ({"affinity": {"nodeAfinity": {}}}, "pod.affinity", "nodeAfinity: no such field"),
        (
            {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
            "pod.affinity",
            "'nodeSelectorTerms' is a required property",
        ),
        (
            {"env": [{"name": "A", "valueFrom": {"secretRef": {"name": "x"}}}]},
            "pod.env[0].valueFrom",
            "secretRef",
        ),
        (
            {"env": [{"name": "A", "valueFrom": {"fieldRef": {}}}]},
            "pod.env[0].valueFrom",
            "'fieldPath' is a ",
        ),
    ],
)
def test_a_value_the_kubernetes_schema_refuses_is_refused_naming_the_field(
    pod: dict[str, Any], field: str, said: str
) -> None:
    message = _refused(tiny(pod=pod))
    assert f"spec.{field}" in message and said in message, message
    assert f"the {kubernetes_version()} schema" in message


def test_node_pool_affinity_is_checked_too() -> None:
    message = _refused(tiny(nodePool={"affinity": {"podAffinity": {"required": []}}}))
    assert "spec.nodePool.affinity.podAffinity.required: no such field" in message, message


def test_explicit_nulls_are_dropped_as_the_api_server_prunes_them() -> None:
    doc = tiny()  # not merge-patched: a patch's null removes the key
    doc["pod"] = {
        "securityContext": {"runAsUser": None, "seccompProfile": None},
        "affinity": {"nodeAffinity": None},
    }
    spec = parse_spec(doc)
    assert spec.pod.security_context == {} and spec.pod.affinity == {}


def test_problems_names_every_unknown_field_and_wrong_type_with_its_path() -> None:
    found = problems("SecurityContext", {"bogus": 1, "other": 2, "capabilities": {"add": "ALL"}})
    assert found == [
        (".bogus", "no such field"),
        (".capabilities.add", "'ALL' is not of type 'array'"),
        (".other", "no such field"),
    ]


def test_the_crd_carries_each_kubernetes_schema_not_a_free_form_object() -> None:
    schema = model_schema(Eagle3RunSpec)
    pod = schema["properties"]["pod"]["properties"]
    embedded = {
        "pod.affinity": (pod["affinity"], "Affinity"),
        "pod.securityContext": (pod["securityContext"], "PodSecurityContext"),
        "pod.containerSecurityContext": (pod["containerSecurityContext"], "SecurityContext"),
        "pod.env[].valueFrom": (pod["env"]["items"]["properties"]["valueFrom"], "EnvVarSource"),
        "nodePool.affinity": (schema["properties"]["nodePool"]["properties"]["affinity"], "Affinity"),
    }
    for where, (node, type_name) in embedded.items():
        assert PRESERVE_KEY not in node, where
        assert set(node["properties"]) == set(schema_of(type_name)["properties"]), where
        assert node["description"].startswith("A core/v1") or "core/v1" in node["description"], where

"""Specs the API server would refuse in the objects the operator creates from them are refused when the spec
is parsed, naming the field: each case here was accepted before, and the API server then
refused the Job, Deployment, claim or PodDisruptionBudget made from it (a run that said nothing of why no
stage started). The CRD carries the same rules where a structural schema can state them, so `kubectl apply`
refuses them too; the rest (and everything, on a server without CEL) is the operator's SpecValid condition.
"""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_contract.api import InvalidSpecError, parse_spec
from eagle3_contract.api.kubernetes_types import problems
from eagle3_contract.api.rules import RULES
from tests.contract.api.api_support import cel_holds, crd_validator, defaulted, spec_schema
from tests.tiny_spec import minimal

NODE_TERM = "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"


def _affinity(requirement: dict[str, Any]) -> dict[str, Any]:
    term = {"matchExpressions": [requirement]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def _pod_affinity(term: dict[str, Any]) -> dict[str, Any]:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


SECRET = {"secretKeyRef": {"name": "hf", "key": "token"}}
FIELD = {"fieldRef": {"fieldPath": "metadata.name"}}
# (the spec's sections, the field the problem is reported at, what else the message says, the CRD refuses it)
CASES: dict[str, tuple[dict[str, Any], str, str, bool]] = {
    # storage
    "size 0": ({"storage": {"artifacts": {"size": "0"}}}, "spec.storage.artifacts.size", "more than 0", True),
    "size -1Gi": (
        {"storage": {"artifacts": {"size": "-1Gi"}}},
        "spec.storage.artifacts.size",
        "more than 0",
        True,
    ),
    "size 0 (integer)": ({"storage": {"artifacts": {"size": 0}}}, "spec.storage.artifacts.size", "", True),
    "size 0.0Gi": ({"storage": {"artifacts": {"size": "0.0Gi"}}}, "spec.storage.artifacts.size", "", True),
    # env
    "env value and valueFrom": (
        {"pod": {"env": [{"name": "A", "value": "x", "valueFrom": SECRET}]}},
        "spec.pod.env",
        "both value and valueFrom",
        False,  # a CEL rule of the CRD (rules.py), not its structural schema
    ),
    "env empty valueFrom": (
        {"pod": {"env": [{"name": "A", "valueFrom": {}}]}},
        "spec.pod.env[0].valueFrom",
        "exactly one of configMapKeyRef, fieldRef, resourceFieldRef, secretKeyRef",
        True,
    ),
    "env two sources": (
        {"pod": {"env": [{"name": "A", "valueFrom": {**SECRET, **FIELD}}]}},
        "spec.pod.env[0].valueFrom",
        "exactly one of",
        True,
    ),
    # tolerations
    "toleration without key, operator Equal": (
        {"pod": {"tolerations": [{"operator": "Equal", "value": "x"}]}},
        "spec.pod.tolerations",
        "no key",
        False,  # CEL (rules.py)
    ),
    "toleration without key or operator": (
        {"nodePool": {"tolerations": [{"effect": "NoSchedule"}]}},
        "spec.nodePool.tolerations",
        "no key",
        False,
    ),
    "toleration key not a label key (pod)": (
        {"pod": {"tolerations": [{"key": "a b", "operator": "Exists"}]}},
        "spec.pod.tolerations[0].key",
        "",
        True,
    ),
    "toleration key not a label key (nodePool)": (
        {"nodePool": {"tolerations": [{"key": "-gpu", "operator": "Exists"}]}},
        "spec.nodePool.tolerations[0].key",
        "",
        True,
    ),
    "toleration value not a label value (pod)": (
        {"pod": {"tolerations": [{"key": "gpu", "operator": "Equal", "value": "a b"}]}},
        "spec.pod.tolerations[0].value",
        "",
        True,
    ),
    "toleration value not a label value (nodePool)": (
        {"nodePool": {"tolerations": [{"key": "gpu", "value": "x" * 64}]}},
        "spec.nodePool.tolerations[0].value",
        "",
        True,
    ),
    # ids
    "runAsUser -1": (
        {"pod": {"securityContext": {"runAsUser": -1}}},
        "spec.pod.securityContext.runAsUser",
        "less than the minimum of 0",
        True,
    ),
    "runAsGroup 2147483648": (
        {"pod": {"securityContext": {"runAsGroup": 2147483648}}},
        "spec.pod.securityContext.runAsGroup",
        "greater than the maximum of 2147483647",
        True,
    ),
    "fsGroup -1": (
        {"pod": {"securityContext": {"fsGroup": -1}}},
        "spec.pod.securityContext.fsGroup",
        "minimum",
        True,
    ),
    "fsGroup 2147483648": (
        {"pod": {"securityContext": {"fsGroup": 2147483648}}},
        "spec.pod.securityContext.fsGroup",
        "maximum",
        True,
    ),
    "container runAsUser 2147483648": (
        {"pod": {"containerSecurityContext": {"runAsUser": 2147483648}}},
        "spec.pod.containerSecurityContext.runAsUser",
        "maximum",
        True,
    ),
    "container runAsGroup -1": (
        {"pod": {"containerSecurityContext": {"runAsGroup": -1}}},
        "spec.pod.containerSecurityContext.runAsGroup",
        "minimum",
        True,
    ),
    # names and selectors
    "priorityClassName not a DNS subdomain": (
        {"pod": {"priorityClassName": "High Priority"}},
        "spec.pod.priorityClassName",
        "",
        True,
    ),
    "nodeSelector key not a label key": (
        {"nodePool": {"nodeSelector": {"gpu type": "a100"}}},
        "spec.nodePool.nodeSelector",
        "",
        False,  # CEL (rules.py): a structural schema cannot constrain a map's keys
    ),
    "nodeSelector value not a label value": (
        {"nodePool": {"nodeSelector": {"gpu": "a 100"}}},
        "spec.nodePool.nodeSelector.gpu",
        "",
        True,
    ),
    "images.pipeline with spaces around it": (
        {"images": {"pipeline": " registry/pipeline:1 "}},
        "spec.images.pipeline",
        "",
        True,
    ),
    "images.vllm with a space after it": (
        {"images": {"vllm": "vllm/vllm-openai:v0.32.0 "}},
        "spec.images.vllm",
        "",
        True,
    ),
    "serving.image with a space before it": (
        {"serving": {"image": " vllm/vllm-openai:v0.32.0"}},
        "spec.serving.image",
        "",
        True,
    ),
    # affinity
    "empty nodeSelectorTerms": (
        {
            "pod": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}
                    }
                }
            }
        },
        f"spec.pod.affinity.{NODE_TERM}",
        "should be non-empty",
        True,
    ),
    "node selector operator Maybe": (
        {"nodePool": {"affinity": _affinity({"key": "pool", "operator": "Maybe", "values": ["gpu"]})}},
        f"spec.nodePool.affinity.{NODE_TERM}[0].matchExpressions[0].operator",
        "'Maybe' is not one of",
        True,
    ),
    "node selector In without values": (
        {"pod": {"affinity": _affinity({"key": "pool", "operator": "In"})}},
        f"spec.pod.affinity.{NODE_TERM}[0].matchExpressions[0].values",
        "operator In",
        False,  # depends on the operator: the operator's own check (SpecValid)
    ),
    "node selector Gt with no number": (
        {"pod": {"affinity": _affinity({"key": "cores", "operator": "Gt", "values": ["many"]})}},
        f"spec.pod.affinity.{NODE_TERM}[0].matchExpressions[0].values",
        "an integer",
        False,
    ),
    "node selector key not a label key": (
        {"pod": {"affinity": _affinity({"key": "a b", "operator": "Exists"})}},
        f"spec.pod.affinity.{NODE_TERM}[0].matchExpressions[0].key",
        "qualified name",
        True,
    ),
    "pod affinity label selector operator Gt": (
        {
            "pod": {
                "affinity": _pod_affinity(
                    {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {
                            "matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]
                        },
                    }
                )
            }
        },
        "spec.pod.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
        ".labelSelector.matchExpressions[0].operator",
        "'Gt' is not one of",
        True,
    ),
    "pod affinity without topologyKey": (
        {"pod": {"affinity": _pod_affinity({"topologyKey": ""})}},
        "spec.pod.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey",
        "",
        True,
    ),
    "preferred weight 0": (
        {
            "pod": {
                "affinity": {
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]
                    }
                }
            }
        },
        "spec.pod.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
        "minimum of 1",
        True,
    ),
    # resources
    "negative CPU request": (
        {"stages": {"train": {"resources": {"requests": {"cpu": "-1"}}}}},
        "spec.stages.train.resources.requests.cpu",
        "",
        True,
    ),
    "negative memory limit (integer)": (
        {"serving": {"resources": {"limits": {"memory": -5}}}},
        "spec.serving.resources.limits.memory",
        "",
        True,
    ),
    "memory request above its limit": (
        {"serving": {"resources": {"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}}},
        "spec.serving.resources",
        "requests.memory (64Gi) is more than limits.memory (32Gi)",
        False,  # quantities compared: the operator's own check (SpecValid)
    ),
    # PDB
    "maxUnavailable 150%": (
        {"serving": {"disruptionBudget": {"maxUnavailable": "150%"}}},
        "spec.serving.disruptionBudget.maxUnavailable",
        "",
        True,
    ),
    "maxUnavailable -1": (
        {"serving": {"disruptionBudget": {"maxUnavailable": -1}}},
        "spec.serving.disruptionBudget.maxUnavailable",
        "",
        True,
    ),
    # Prometheus
    "prometheusUrl with no host": (
        {"serving": {"canary": {"prometheusUrl": "http://:9090"}}},
        "spec.serving.canary.prometheusUrl",
        "",
        True,
    ),
    "prometheusUrl with a user and no host": (
        {"serving": {"canary": {"prometheusUrl": "http://user@:9090/x"}}},
        "spec.serving.canary.prometheusUrl",
        "",
        True,
    ),
}


@pytest.mark.parametrize(("sections", "field", "said", "_"), list(CASES.values()), ids=list(CASES))
def test_a_value_the_api_server_would_refuse_is_refused_naming_its_field(
    sections: dict[str, Any], field: str, said: str, _: bool
) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(minimal() | sections)
    assert any(p.startswith(f"{field}: ") for p in caught.value.problems), caught.value.problems
    assert said in str(caught.value), caught.value


@pytest.mark.parametrize(("sections", "field", "_", "crd"), list(CASES.values()), ids=list(CASES))
def test_the_crd_refuses_the_same_values(sections: dict[str, Any], field: str, _: str, crd: bool) -> None:
    """By its structural schema where one can state the rule, else by a CEL rule (rules.py); the rest (an
    operator-dependent list, quantities compared) only the operator checks, and says so in SpecValid."""
    stored = defaulted(minimal() | sections)
    schema_errors = list(crd_validator(spec_schema()).iter_errors(stored))
    broken = [rule for rule in RULES if not cel_holds(rule.rule, stored)]
    if crd:
        assert schema_errors, f"the CRD's schema accepts {field}"
    elif field.rsplit(".", 1)[-1] in ("env", "tolerations", "nodeSelector"):
        assert not schema_errors and [f"spec{rule.field_path}" for rule in broken] == [field]
    else:
        assert not schema_errors and not broken  # only the operator's own check refuses it


GOOD: dict[str, dict[str, Any]] = {
    "sizes": {"storage": {"artifacts": {"size": "1"}}},
    "a decimal size": {"storage": {"artifacts": {"size": "0.5Ti"}}},
    "an integer size": {"storage": {"artifacts": {"size": 1}}},
    "requests at their limits": {
        "serving": {
            "resources": {
                "requests": {"cpu": "2", "memory": "1Gi"},
                "limits": {"cpu": "2000m", "memory": "1024Mi"},
            }
        }
    },
    "a zero request": {"stages": {"train": {"resources": {"requests": {"cpu": 0}, "limits": {"cpu": "1"}}}}},
    "env value": {
        "pod": {"env": [{"name": "A", "value": "x"}, {"name": "B", "value": "", "valueFrom": SECRET}]}
    },
    "tolerate everything": {"pod": {"tolerations": [{"operator": "Exists"}]}},
    "tolerations": {
        "nodePool": {
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"},
                {"key": "gpu", "value": ""},
            ]
        }
    },
    "ids at the bounds": {
        "pod": {"securityContext": {"runAsUser": 2147483647, "runAsGroup": 0, "fsGroup": 0}}
    },
    "a DNS-subdomain priority class": {"pod": {"priorityClassName": "system-node-critical.example.com"}},
    "node selector": {
        "nodePool": {"nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb", "pool": ""}}
    },
    "every node selector operator": {
        "pod": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "a", "operator": "In", "values": ["x"]},
                                    {"key": "b", "operator": "NotIn", "values": ["x", "y"]},
                                    {"key": "c", "operator": "Exists"},
                                    {"key": "d", "operator": "DoesNotExist", "values": []},
                                    {"key": "e", "operator": "Gt", "values": ["7"]},
                                    {"key": "f", "operator": "Lt", "values": ["-3"]},
                                ],
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
                                ],
                            }
                        ]
                    }
                }
            }
        }
    },
    "a percentage of 100": {"serving": {"disruptionBudget": {"maxUnavailable": "100%"}}},
    "a Prometheus by address": {"serving": {"canary": {"prometheusUrl": "http://[::1]:9090/prom"}}},
    "a Prometheus with a user": {"serving": {"canary": {"prometheusUrl": "https://u:p@prom.example:443"}}},
}


@pytest.mark.parametrize("sections", list(GOOD.values()), ids=list(GOOD))
def test_values_the_api_server_takes_are_taken(sections: dict[str, Any]) -> None:
    parse_spec(minimal() | sections)
    stored = defaulted(minimal() | sections)
    assert not list(crd_validator(spec_schema()).iter_errors(stored))
    assert all(cel_holds(rule.rule, stored) for rule in RULES)


def test_every_problem_of_an_embedded_type_is_named_once_at_its_path() -> None:
    affinity = _affinity({"key": "pool", "operator": "NotIn"})
    affinity["podAffinity"] = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "topologyKey": "zone",
                "labelSelector": {
                    "matchLabels": {"bad key": "v"},
                    "matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}],
                },
            }
        ]
    }
    found = problems("Affinity", affinity)
    assert [path for path, _ in found] == [
        ".nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]"
        ".values",
        ".podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].values",
        ".podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchLabels",
    ], found

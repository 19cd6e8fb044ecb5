"""contract/eagle3_contract/api/kubernetes_schemas.json is what devtools/kubernetes_schemas.py renders from
kubernetes-validate's 1.31 schemas (the ones the built objects are checked with), and the rendering keeps
what a value is checked against."""

from __future__ import annotations

from typing import Any

import pytest
from devtools import kubernetes_schemas

from eagle3_contract.api.kubernetes_types import kubernetes_version, schema_of
from tests.unit.builders.test_builder_k8s_schemas import KUBERNETES_VERSION

pytest.importorskip("kubernetes_validate")


def test_the_committed_schemas_are_current() -> None:
    stale = kubernetes_schemas.GENERATOR.stale()
    assert not stale, f"{stale} is stale: run `{kubernetes_schemas.MAKE_TARGET}` and commit the result"


def test_they_follow_the_version_the_built_objects_are_checked_against() -> None:
    assert kubernetes_version() == f"{KUBERNETES_VERSION}.0" == kubernetes_schemas.KUBERNETES_VERSION


def test_refs_are_inlined_and_strictness_kept() -> None:
    affinity = schema_of("Affinity")
    term = affinity["properties"]["nodeAffinity"]["properties"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["required"] == ["nodeSelectorTerms"] and term["additionalProperties"] is False
    assert "$ref" not in str(affinity)
    divisor = schema_of("EnvVarSource")["properties"]["resourceFieldRef"]["properties"]["divisor"]
    assert {k: v for k, v in divisor.items() if k != "description"} == kubernetes_schemas.INT_OR_STRING


def test_descriptions_are_kubernetes_own_the_fields_over_their_types() -> None:
    """Every node keeps its Kubernetes description (what `kubectl explain` shows); where a field refers to a
    type, the field's own description wins over the type's."""
    defs = kubernetes_schemas.definitions()
    affinity = schema_of("Affinity")
    assert affinity["description"] == defs["io.k8s.api.core.v1.Affinity"]["description"]
    node_affinity = affinity["properties"]["nodeAffinity"]
    field = defs["io.k8s.api.core.v1.Affinity"]["properties"]["nodeAffinity"]["description"]
    assert node_affinity["description"] == field != defs["io.k8s.api.core.v1.NodeAffinity"]["description"]
    divisor = schema_of("EnvVarSource")["properties"]["resourceFieldRef"]["properties"]["divisor"]
    assert divisor["description"].startswith("Specifies the output format of the exposed resources")

    def undescribed(node: dict[str, Any], path: str) -> list[str]:
        found = []
        for name, sub in node.get("properties", {}).items():
            if not sub.get("description"):
                found.append(f"{path}.{name}")
            found += undescribed(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            found += undescribed(node["items"], f"{path}[]")
        return found

    for name in kubernetes_schemas.TYPES:
        assert undescribed(schema_of(name), name) == []


def test_a_recursive_definition_is_refused_rather_than_inlined_forever() -> None:
    defs = {"A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}}
    with pytest.raises(ValueError, match="recursive"):
        kubernetes_schemas.converted(defs["A"], defs, ("A",))

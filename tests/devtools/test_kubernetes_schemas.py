"""contract/eagle3_contract/api/kubernetes_schemas.json is what devtools/kubernetes_schemas.py renders from
kubernetes-validate's 1.31 schemas (the ones the built objects are checked with), and the rendering keeps
what a value is checked against."""

from __future__ import annotations

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
    assert "$ref" not in str(affinity) and "description" not in str(affinity)
    divisor = schema_of("EnvVarSource")["properties"]["resourceFieldRef"]["properties"]["divisor"]
    assert divisor == kubernetes_schemas.INT_OR_STRING


def test_a_recursive_definition_is_refused_rather_than_inlined_forever() -> None:
    defs = {"A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}}
    with pytest.raises(ValueError, match="recursive"):
        kubernetes_schemas.converted(defs["A"], defs, ("A",))

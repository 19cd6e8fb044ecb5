"""Kubernetes types a spec embeds (an Affinity, a security context, an EnvVarSource), checked against the
Kubernetes schemas of the objects they are copied into.

The schemas are kubernetes-validate's strict Kubernetes 1.31 definitions, with the rules of Kubernetes' own
validation that a structural schema can state merged in (kubernetes_rules.SCHEMA_RULES), committed in
kubernetes_schemas.json (`devtools/kubernetes_schemas.py` writes it; `make crds`). The same schema is the
field's JSON Schema, so the CRD carries it too (the API server checks it when the run is applied), and
jsonschema checks it here when a spec is parsed: a value the API server would refuse when the operator
creates a pod is refused with the run, naming the field. The rules no schema can state (a selector's values
by its operator) are checked here after the schema (kubernetes_rules.semantic_problems). Explicit nulls are
dropped first, as the API server prunes them. The schemas keep Kubernetes' descriptions, so `kubectl explain
eagle3run.spec.pod.affinity` explains every field below it as it does a pod's; the field's own description
(the model's) replaces the type's at the top.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any

from jsonschema import Draft202012Validator
from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from eagle3_contract.api.kubernetes_rules import PATTERN_WORDS, semantic_problems

SCHEMAS_FILE = "kubernetes_schemas.json"
# The pydantic error type of a value its Kubernetes schema refuses; its context's `findings` are the
# (path inside the value, what is wrong) pairs, which parse_spec reports one per line at their full path.
ERROR_TYPE = "kubernetes_schema"


@functools.cache
def _document() -> dict[str, Any]:
    text = resources.files("eagle3_contract.api").joinpath(SCHEMAS_FILE).read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    return document


def kubernetes_version() -> str:
    """The Kubernetes version whose schemas the embedded types follow."""
    return str(_document()["kubernetesVersion"])


def schema_of(type_name: str) -> dict[str, Any]:
    """The committed schema of one embedded type (a copy), Kubernetes' descriptions included."""
    return copy.deepcopy(_document()["types"][type_name])


def embedded_type(node: dict[str, Any]) -> str | None:
    """The embedded Kubernetes type a schema node is (the committed schema's, or the CRD's node made from it),
    known by its fields; None for any other node. The API reference links such a node to the Kubernetes
    reference instead of repeating Kubernetes' tables."""
    fields = set(node.get("properties") or {})
    if not fields:
        return None
    types: dict[str, Any] = _document()["types"]
    return next((name for name, schema in types.items() if set(schema.get("properties", {})) == fields), None)


@functools.cache
def _validator(type_name: str) -> Draft202012Validator:
    return Draft202012Validator(schema_of(type_name))


def without_nulls(value: Any) -> Any:
    """`value` without explicit nulls at any depth (the API server prunes them from a custom resource)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def _said(error: Any) -> str:
    """jsonschema's message, in words where it would print a regular expression or a bare count."""
    if error.validator == "pattern" and error.validator_value in PATTERN_WORDS:
        return f"{error.instance!r} is not {PATTERN_WORDS[error.validator_value]}"
    bounds = (error.schema.get("minProperties"), error.schema.get("maxProperties"))
    if error.validator in ("minProperties", "maxProperties") and bounds == (1, 1):
        return f"set exactly one of {', '.join(sorted(error.schema.get('properties', {})))}"
    return str(error.message)


def problems(type_name: str, value: Any) -> list[tuple[str, str]]:
    """What Kubernetes refuses in a `type_name` value: (path inside the value, what is wrong) pairs, sorted;
    none when it is valid. The schema first (an unknown field is named by its own path), then, on a value
    the schema accepts, the rules no schema can state."""
    found = []
    for error in _validator(type_name).iter_errors(value):
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            known = error.schema.get("properties", {})
            found += [(f"{path}.{name}", "no such field") for name in error.instance if name not in known]
        else:
            found.append((path, _said(error)))
    return sorted(found) or semantic_problems(type_name, value)


@dataclass(frozen=True)
class KubernetesSchema:
    """The marker of a field holding a core/v1 `type_name`: the value is checked against that type's
    Kubernetes schema, and the field's JSON Schema (so the CRD's) is that schema."""

    type_name: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return schema_of(self.type_name)

    def check(self, value: dict[str, Any]) -> dict[str, Any]:
        value = without_nulls(value)
        found = problems(self.type_name, value)
        if found:
            raise PydanticCustomError(
                ERROR_TYPE,
                "not a valid Kubernetes {type_name} (the {version} schema): {problems}",
                {
                    "type_name": self.type_name,
                    "version": kubernetes_version(),
                    "problems": "; ".join(
                        f"{path.lstrip('.') or '(the object)'}: {what}" for path, what in found
                    ),
                    "findings": found,
                },
            )
        return value


Affinity = Annotated[dict[str, Any], KubernetesSchema("Affinity")]
EnvVarSource = Annotated[dict[str, Any], KubernetesSchema("EnvVarSource")]
PodSecurityContext = Annotated[dict[str, Any], KubernetesSchema("PodSecurityContext")]
SecurityContext = Annotated[dict[str, Any], KubernetesSchema("SecurityContext")]

"""The Kubernetes types a spec embeds, as committed schemas (`make crds`).

spec.pod.affinity, spec.nodePool.affinity, spec.pod.securityContext, spec.pod.containerSecurityContext and
spec.pod.env[].valueFrom are copied into the pods a run creates. They are checked against the Kubernetes 1.31
OpenAPI schemas the built objects are checked with (kubernetes-validate's strict schemas): this renders those
types' definitions, every `$ref` inlined, with the rules of Kubernetes' own validation a structural
schema can state merged in (eagle3_contract.api.kubernetes_rules.SCHEMA_RULES), into
contract/eagle3_contract/api/kubernetes_schemas.json, in the dialect the CRD generator reads (one type per
node, no nulls, an int-or-string marked as the CRD wants it and checked as JSON Schema can). Each node keeps
Kubernetes' own description (a field's own description over its type's, as `kubectl explain pod.spec.affinity`
shows it), so the CRD explains the embedded fields as it explains ours. The contract loads the file: the local
validator and the CRD use the same schemas, and the contract needs no 100 MB schema package at run time
(kubernetes-validate is a development dependency).

python -m devtools.kubernetes_schemas            # rewrite the file
python -m devtools.kubernetes_schemas --check    # exit 1 naming it when it differs
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from devtools.generated import Generator
from eagle3_contract.api.kubernetes_rules import tightened

KUBERNETES_VERSION = "1.31.0"
OUTPUT = "contract/eagle3_contract/api/kubernetes_schemas.json"
MAKE_TARGET = "make crds"
# The embedded types: the name the contract asks for -> the OpenAPI definition.
TYPES = {
    "Affinity": "io.k8s.api.core.v1.Affinity",
    "EnvVarSource": "io.k8s.api.core.v1.EnvVarSource",
    "PodSecurityContext": "io.k8s.api.core.v1.PodSecurityContext",
    "SecurityContext": "io.k8s.api.core.v1.SecurityContext",
}
INT_OR_STRING = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],
}
# Kept as they are: the description (what `kubectl explain` shows) and what a value is checked against; the
# rest (list and map markers, patch strategies) is neither.
_KEPT = ("description", "type", "format", "enum", "required")


def definitions() -> dict[str, Any]:
    """kubernetes-validate's strict 1.31 definitions."""
    base = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    path = base / f"v{KUBERNETES_VERSION}-local-strict" / "_definitions.json"
    found: dict[str, Any] = json.loads(path.read_text())["$defs"]
    return found


def converted(node: dict[str, Any], defs: dict[str, Any], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """One definition node with its refs inlined, in the contract's dialect; a `$ref`'s own description (the
    field's) wins over the referenced type's."""
    ref = node.get("$ref")
    if ref is not None:
        name = ref.rsplit("/", 1)[-1]
        if name in seen:
            raise ValueError(f"{' > '.join(seen)}: {name} is recursive; a structural schema cannot inline it")
        inlined = tightened(name, converted(defs[name], defs, (*seen, name)))
        if "description" in node:
            inlined["description"] = node["description"]
        return inlined
    if "oneOf" in node:  # IntOrString, Quantity: a string or a number
        described = {"description": node["description"]} if "description" in node else {}
        return described | INT_OR_STRING
    out: dict[str, Any] = {}
    for key in _KEPT:
        if key in node:
            value = node[key]
            if key == "type" and isinstance(value, list):
                (value,) = [t for t in value if t != "null"]
            out[key] = value
    if "enum" in out:
        out["enum"] = [v for v in out["enum"] if v is not None]
    if "items" in node:
        out["items"] = converted(node["items"], defs, seen)
    if "properties" in node:
        out["properties"] = {k: converted(v, defs, seen) for k, v in sorted(node["properties"].items())}
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out["additionalProperties"] = converted(extra, defs, seen)
    elif extra is False:
        out["additionalProperties"] = False  # strict: an unknown field is an error (the CRD prunes it)
    return out


def render(_: Path) -> str:
    defs = definitions()
    schemas = {name: tightened(full, converted(defs[full], defs, (full,))) for name, full in TYPES.items()}
    source = "kubernetes-validate, with eagle3_contract.api.kubernetes_rules.SCHEMA_RULES"
    document = {"kubernetesVersion": KUBERNETES_VERSION, "source": source, "types": schemas}
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


GENERATOR = Generator(
    outputs={OUTPUT: render},
    prog="python -m devtools.kubernetes_schemas",
    doc=__doc__,
    stale_message=f"is stale: run `{MAKE_TARGET}`",
)

if __name__ == "__main__":
    raise SystemExit(GENERATOR.main())

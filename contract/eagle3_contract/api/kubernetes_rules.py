"""Kubernetes' own validation rules for the types a spec embeds, which its OpenAPI schemas do not carry.

The API server checks a pod against more than its OpenAPI schema (k8s.io/kubernetes pkg/apis/core/validation
and apimachinery's validation): label keys and values, selector operators, id ranges, one source per env
valueFrom. A spec that passed the bare schema was copied into a pod the API server then refused, and the run
said nothing. Two parts:

* `SCHEMA_RULES`: what a structural schema can state (pattern, minimum/maximum, minItems/maxItems, enum,
  minProperties/maxProperties), by OpenAPI definition. `devtools/kubernetes_schemas.py` merges them into the
  committed schemas (`make crds`), so the CRD carries them (`kubectl apply` refuses such a run on any
  Kubernetes version, 1.20 included) and jsonschema checks them when a spec is parsed.
* `semantic_problems`: what depends on another field (a selector's values on its operator) or on a map's
  keys, which a structural schema cannot state and whose CEL would be costly over nested lists: checked in
  Python where the spec is parsed (`eagle3 run`, the operator's SpecValid condition).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from eagle3_contract.api.fields import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    DNS_SUBDOMAIN_MAX,
    ID_MAX,
    LABEL_VALUE,
    LABEL_VALUE_MAX,
    QUALIFIED_NAME,
    QUALIFIED_NAME_MAX,
)

NODE_SELECTOR_OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
LABEL_SELECTOR_OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist"]
# The one field a node field selector (matchFields) may name, and its operators
NODE_FIELD_KEYS = ["metadata.name"]
NODE_FIELD_OPERATORS = ["In", "NotIn"]

_LABEL_KEY: dict[str, Any] = {"pattern": QUALIFIED_NAME, "maxLength": QUALIFIED_NAME_MAX}
_LABEL_VALUE: dict[str, Any] = {"pattern": LABEL_VALUE, "maxLength": LABEL_VALUE_MAX}
_ID: dict[str, Any] = {"minimum": 0, "maximum": ID_MAX}
_WEIGHT: dict[str, Any] = {"minimum": 1, "maximum": 100}
_CORE = "io.k8s.api.core.v1."
_META = "io.k8s.apimachinery.pkg.apis.meta.v1."

# OpenAPI definition -> property ("" for the definition's own node) -> keywords merged into its schema (a
# nested "properties" or "items" merges one level down).
SCHEMA_RULES: dict[str, dict[str, dict[str, Any]]] = {
    # ValidateNodeSelector: "must have at least one node selector term"
    f"{_CORE}NodeSelector": {"nodeSelectorTerms": {"minItems": 1}},
    # ValidateNodeSelectorRequirement: the key is a label name, the operator one of six
    f"{_CORE}NodeSelectorRequirement": {"key": _LABEL_KEY, "operator": {"enum": NODE_SELECTOR_OPERATORS}},
    # ValidateNodeFieldSelectorRequirement: metadata.name only, In or NotIn, exactly one node name
    f"{_CORE}NodeSelectorTerm": {
        "matchFields": {
            "items": {
                "properties": {
                    "key": {"enum": NODE_FIELD_KEYS},
                    "operator": {"enum": NODE_FIELD_OPERATORS},
                    "values": {
                        "minItems": 1,
                        "maxItems": 1,
                        "items": {"pattern": DNS_SUBDOMAIN, "maxLength": DNS_SUBDOMAIN_MAX},
                    },
                }
            }
        }
    },
    # validatePreferredSchedulingTerms, validateWeightedPodAffinityTerms: "must be in the range 1-100"
    f"{_CORE}PreferredSchedulingTerm": {"weight": _WEIGHT},
    f"{_CORE}WeightedPodAffinityTerm": {"weight": _WEIGHT},
    # validatePodAffinityTerm: a topology key (a label name, not empty), namespaces by name
    f"{_CORE}PodAffinityTerm": {
        "topologyKey": _LABEL_KEY,
        "namespaces": {"items": {"pattern": DNS_LABEL, "maxLength": 63}},
        "matchLabelKeys": {"items": _LABEL_KEY},
        "mismatchLabelKeys": {"items": _LABEL_KEY},
    },
    # ValidateLabelSelector: label values (the keys: semantic_problems)
    f"{_META}LabelSelector": {"matchLabels": {"additionalProperties": _LABEL_VALUE}},
    # ValidateLabelSelectorRequirement: a label name, one of four operators, label values
    f"{_META}LabelSelectorRequirement": {
        "key": _LABEL_KEY,
        "operator": {"enum": LABEL_SELECTOR_OPERATORS},
        "values": {"items": _LABEL_VALUE},
    },
    # ValidatePodSecurityContext, ValidateSecurityContext: user and group ids are 0 to 2^31 - 1
    f"{_CORE}PodSecurityContext": {
        "runAsUser": _ID,
        "runAsGroup": _ID,
        "fsGroup": _ID,
        "supplementalGroups": {"items": _ID},
    },
    f"{_CORE}SecurityContext": {"runAsUser": _ID, "runAsGroup": _ID},
    # validateEnvVarValueFrom: "must specify one of ..." and "may not have more than one field specified"
    f"{_CORE}EnvVarSource": {"": {"minProperties": 1, "maxProperties": 1}},
}

# What a pattern of the rules asks, in words (jsonschema would print the regular expression).
PATTERN_WORDS = {
    QUALIFIED_NAME: "a qualified name (a label key): an optional DNS-subdomain prefix and '/', then at most "
    "63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
    LABEL_VALUE: "a label value: at most 63 letters, digits, '-', '_' or '.', starting and ending with a "
    "letter or digit (or empty)",
    DNS_SUBDOMAIN: "a DNS subdomain: lowercase letters, digits, '-' and '.', starting and ending with a "
    "letter or digit",
    DNS_LABEL: "a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter "
    "or digit",
}


def merge(node: dict[str, Any], rules: dict[str, Any]) -> dict[str, Any]:
    """`node` with `rules` merged in: "properties" per property, "items" and "additionalProperties" into
    the node they hold, any other keyword set."""
    out = dict(node)
    for key, value in rules.items():
        if key == "properties":
            props = dict(out.get("properties", {}))
            for name, sub in value.items():
                props[name] = merge(props[name], sub)
            out["properties"] = props
        elif key in ("items", "additionalProperties"):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def tightened(definition: str, node: dict[str, Any]) -> dict[str, Any]:
    """A converted definition with its SCHEMA_RULES merged in (unchanged where it has none)."""
    rules = SCHEMA_RULES.get(definition)
    if rules is None:
        return node
    out = merge(node, rules.get("", {}))
    properties = {name: sub for name, sub in rules.items() if name}
    return merge(out, {"properties": properties}) if properties else out


def _qualified(key: str) -> bool:
    return len(key) <= QUALIFIED_NAME_MAX and re.fullmatch(QUALIFIED_NAME, key) is not None


def _integer(text: str) -> bool:
    return re.fullmatch(r"[+-]?[0-9]{1,18}", text) is not None


def _requirement(path: str, requirement: dict[str, Any], numeric: bool) -> Iterator[tuple[str, str]]:
    """A node or label selector requirement's values, as its operator needs them."""
    operator, values = requirement.get("operator"), requirement.get("values") or []
    if operator in ("In", "NotIn") and not values:
        yield f"{path}.values", f"operator {operator} needs at least one value"
    elif operator in ("Exists", "DoesNotExist") and values:
        yield f"{path}.values", f"operator {operator} takes no values"
    elif numeric and operator in ("Gt", "Lt") and not (len(values) == 1 and _integer(values[0])):
        yield f"{path}.values", f"operator {operator} takes exactly one value, an integer"


def _node_terms(path: str, terms: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    for i, term in enumerate(terms):
        for j, requirement in enumerate(term.get("matchExpressions") or []):
            yield from _requirement(f"{path}[{i}].matchExpressions[{j}]", requirement, numeric=True)


def _label_selector(path: str, selector: dict[str, Any] | None) -> Iterator[tuple[str, str]]:
    if not selector:
        return
    for j, requirement in enumerate(selector.get("matchExpressions") or []):
        yield from _requirement(f"{path}.matchExpressions[{j}]", requirement, numeric=False)
    bad = [key for key in selector.get("matchLabels") or {} if not _qualified(key)]
    if bad:
        yield f"{path}.matchLabels", f"keys {bad} are not {PATTERN_WORDS[QUALIFIED_NAME]}"


def _pod_terms(path: str, terms: list[dict[str, Any]], weighted: bool) -> Iterator[tuple[str, str]]:
    for i, item in enumerate(terms):
        where, term = (
            (f"{path}[{i}].podAffinityTerm", item.get("podAffinityTerm") or {})
            if weighted
            else (
                f"{path}[{i}]",
                item,
            )
        )
        yield from _label_selector(f"{where}.labelSelector", term.get("labelSelector"))
        yield from _label_selector(f"{where}.namespaceSelector", term.get("namespaceSelector"))


def _affinity(value: dict[str, Any]) -> Iterator[tuple[str, str]]:
    node = value.get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    path = ".nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    yield from _node_terms(path, required.get("nodeSelectorTerms") or [])
    for i, preferred in enumerate(node.get("preferredDuringSchedulingIgnoredDuringExecution") or []):
        path = f".nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference"
        for j, requirement in enumerate((preferred.get("preference") or {}).get("matchExpressions") or []):
            yield from _requirement(f"{path}.matchExpressions[{j}]", requirement, numeric=True)
    for kind in ("podAffinity", "podAntiAffinity"):
        section = value.get(kind) or {}
        required_terms = section.get("requiredDuringSchedulingIgnoredDuringExecution") or []
        yield from _pod_terms(
            f".{kind}.requiredDuringSchedulingIgnoredDuringExecution", required_terms, False
        )
        preferred_terms = section.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        yield from _pod_terms(
            f".{kind}.preferredDuringSchedulingIgnoredDuringExecution", preferred_terms, True
        )


def semantic_problems(type_name: str, value: dict[str, Any]) -> list[tuple[str, str]]:
    """What the API server refuses in a `type_name` value that its schema (with SCHEMA_RULES) accepted:
    (path inside the value, what is wrong) pairs, sorted; none when it is valid."""
    if type_name == "Affinity":
        return sorted(_affinity(value))
    return []

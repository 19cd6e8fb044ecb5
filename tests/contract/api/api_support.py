"""Shared helpers of the API tests: the CRD schema, API-server-like defaulting and CEL values, strategies.

The strategies are generated from the CRD's own structural schema (which is generated from the models), so a
field added to the models is generated, mutated and checked without touching the tests.
"""

from __future__ import annotations

import copy
import functools
import string
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import celpy
import jsonschema
from celpy import celtypes
from hypothesis import strategies as st

from eagle3_contract.api import spec as spec_module
from eagle3_contract.api.crd import build_crd
from eagle3_contract.api.fields import NON_NEGATIVE_QUANTITY, POSITIVE_QUANTITY, duration_seconds
from eagle3_contract.api.rules import RULES, CrossFieldRule
from eagle3_contract.api.spec import Eagle3RunSpec

Path = tuple[str | int, ...]
PRESERVE = "x-kubernetes-preserve-unknown-fields"
INT_OR_STRING = "x-kubernetes-int-or-string"


@functools.cache
def root_schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def spec_schema() -> dict[str, Any]:
    return root_schema()["properties"]["spec"]  # type: ignore[no-any-return]


# --- what the API server does to a stored object -------------------------------------------------------


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as kube-apiserver does it: absent properties get their default, then recurse."""
    if isinstance(value, dict):
        if "properties" in schema:
            for name, sub in schema["properties"].items():
                if name not in value and "default" in sub:
                    value[name] = copy.deepcopy(sub["default"])
                if name in value:
                    apply_defaults(sub, value[name])
        elif isinstance(schema.get("additionalProperties"), dict):
            for item in value.values():
                apply_defaults(schema["additionalProperties"], item)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            apply_defaults(schema["items"], item)
    return value


def defaulted(doc: dict[str, Any]) -> dict[str, Any]:
    """A spec document as stored by the API server (CRD defaults applied)."""
    return apply_defaults(spec_schema(), copy.deepcopy(doc))  # type: ignore[no-any-return]


def _int_or_string(validator: Any, flag: Any, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    if flag and (isinstance(instance, bool) or not isinstance(instance, int | str)):
        yield jsonschema.ValidationError(f"{instance!r} is neither an integer nor a string")


# OpenAPI v3.0 (boolean exclusiveMinimum...) is draft 4, plus the Kubernetes int-or-string extension.
_CrdValidator = jsonschema.validators.extend(jsonschema.Draft4Validator, {INT_OR_STRING: _int_or_string})


def crd_validator(schema: dict[str, Any]) -> Any:
    """A validator of documents against a (part of the) CRD schema, as the API server checks types/ranges."""
    return _CrdValidator(schema)


def to_cel(schema: dict[str, Any], value: Any) -> Any:
    """A JSON value as the API server hands it to CEL: typed by the schema (a `number` is a double)."""
    if value is None:
        return None  # CEL null (only inside preserve-unknown-fields objects: the server prunes other nulls)
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", {})
        return celtypes.MapType(
            {celtypes.StringType(k): to_cel(props.get(k, extra), v) for k, v in value.items()}
        )
    if isinstance(value, list):
        return celtypes.ListType([to_cel(schema.get("items", {}), v) for v in value])
    if isinstance(value, int) and schema.get("type") != "number":
        return celtypes.IntType(value)
    if isinstance(value, int | float):
        return celtypes.DoubleType(float(value))
    if isinstance(value, str):
        return celtypes.StringType(value)
    raise TypeError(f"not a JSON value: {value!r}")


_CEL = celpy.Environment()


@functools.cache
def cel_program(expression: str) -> Any:
    return _CEL.program(_CEL.compile(expression))


def cel_holds(expression: str, stored_spec: dict[str, Any]) -> bool:
    """Evaluate a rule on `self` = a stored (defaulted) spec, as the API server does."""
    result = cel_program(expression).evaluate({"self": to_cel(spec_schema(), stored_spec)})
    assert isinstance(result, celtypes.BoolType), f"{expression!r} gave {result!r}, not a bool"
    return bool(result)


@contextmanager
def _rules_off() -> Iterator[None]:
    with mock.patch.object(spec_module, "check_cross_field_rules", lambda spec: None):
        yield


def unchecked_spec(doc: dict[str, Any]) -> Eagle3RunSpec:
    """The spec with every field check but without the cross-field rules (to ask `holds` about it)."""
    with _rules_off():
        return Eagle3RunSpec.model_validate(doc)


def python_holds(rule: CrossFieldRule, doc: dict[str, Any]) -> bool:
    return rule.holds(unchecked_spec(doc))


# --- paths ----------------------------------------------------------------------------------------------


def get_path(doc: Any, path: Path) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def set_path(doc: Any, path: Path, value: Any) -> None:
    get_path(doc, path[:-1])[path[-1]] = value


def problem_path(path: Path) -> str:
    """`spec.a.b[0].c`: how InvalidSpecError names a field."""
    return "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def subschema(schema: dict[str, Any], path: Path) -> dict[str, Any]:
    for part in path:
        if isinstance(part, int):
            schema = schema["items"]
        elif "properties" in schema:
            schema = schema["properties"][part]
        else:
            schema = schema["additionalProperties"]
    return schema


def walk_values(schema: dict[str, Any], value: Any, path: Path = ()) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every (path, schema) of a value present in `value`, parents before children (the root excluded)."""
    if path:
        yield path, schema
    if schema.get(PRESERVE):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key, schema.get("additionalProperties"))
            if isinstance(sub, dict):
                yield from walk_values(sub, item, (*path, key))
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from walk_values(schema["items"], item, (*path, index))


# --- strategies from a structural schema ---------------------------------------------------------------

# qualified names (an optional DNS-subdomain prefix, then a name), as label and annotation keys must be
LABEL_KEYS = st.from_regex(
    r"([a-z0-9]{1,6}(\.[a-z0-9]{1,6})?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,6}[A-Za-z0-9])?", fullmatch=True
)
JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.text(max_size=8)
QUANTITIES = st.integers(1, 2**40) | st.sampled_from(["1", "500m", "2Gi", "500Gi", "1.5", "64Mi"])
_QUANTITY_PATTERNS = (NON_NEGATIVE_QUANTITY, POSITIVE_QUANTITY)


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid against a structural schema (the subset the CRD generator emits)."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if schema.get(INT_OR_STRING):
        if schema.get("pattern", NON_NEGATIVE_QUANTITY) not in _QUANTITY_PATTERNS:
            # an int-or-string of its own grammar (a percentage): a count or a string of the pattern
            return st.integers(0, 1000) | st.from_regex(schema["pattern"], fullmatch=True)
        return QUANTITIES
    if schema.get(PRESERVE):
        return st.dictionaries(
            st.text(string.ascii_letters, min_size=1, max_size=6), JSON_SCALARS, max_size=3
        )
    kind = schema["type"]
    builder = _BUILDERS[kind]
    return builder(schema)


def _object(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "additionalProperties" in schema:
        return st.dictionaries(LABEL_KEYS, from_schema(schema["additionalProperties"]), max_size=3)
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    if (schema.get("minProperties"), schema.get("maxProperties")) == (1, 1) and not required:
        # one property of several (an EnvVarSource: exactly one source)
        return st.sampled_from(sorted(props)).flatmap(
            lambda name: st.fixed_dictionaries({name: from_schema(props[name])})
        )
    return st.fixed_dictionaries(
        {name: from_schema(sub) for name, sub in props.items() if name in required},
        optional={name: from_schema(sub) for name, sub in props.items() if name not in required},
    )


def _array(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    low = schema.get("minItems", 0)
    return st.lists(
        from_schema(schema["items"]), min_size=low, max_size=min(schema.get("maxItems", 3), low + 3)
    )


def _integer(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    return st.integers(schema.get("minimum", -(2**31)), schema.get("maximum", 2**31))


def _number(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    return st.floats(
        schema.get("minimum", -1e6),
        schema.get("maximum", 1e6),
        exclude_min=bool(schema.get("exclusiveMinimum")),
        exclude_max=bool(schema.get("exclusiveMaximum")),
    )


def _string(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    low, high = schema.get("minLength", 0), schema.get("maxLength", 24)
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: low <= len(s) <= high)
    return st.text(string.ascii_letters + string.digits + "-_./: ", min_size=low, max_size=min(high, 24))


_BUILDERS: dict[str, Callable[[dict[str, Any]], st.SearchStrategy[Any]]] = {
    "object": _object,
    "array": _array,
    "integer": _integer,
    "number": _number,
    "string": _string,
    "boolean": lambda _: st.booleans(),
}


def repair(doc: dict[str, Any]) -> dict[str, Any]:
    """Make a schema-valid spec satisfy the cross-field rules, by lowering/raising the shared bound."""
    eff = defaulted(doc)
    pool = doc.setdefault("nodePool", {})
    pool["gpusPerNode"] = max(
        eff["training"]["gpus"], eff["verifier"]["tensorParallelSize"], eff["nodePool"]["gpusPerNode"]
    )
    layers = doc.get("extraction", {}).get("layers")
    if layers is not None:
        doc["extraction"]["layers"] = list(dict.fromkeys(layers))
    bounds = [eff["training"]["sequenceLength"], eff["extraction"]["tokenBudget"]]
    bounds += [eff["verifier"]["maxModelLen"]] if "maxModelLen" in eff["verifier"] else []
    doc["dataset"]["maxSequenceLength"] = min(eff["dataset"]["maxSequenceLength"], *bounds)
    if "pinnedCheckpoint" in eff["serving"]:
        doc["serving"]["enabled"] = True
    if eff["dataset"].get("format") == "prompts":
        doc.setdefault("regeneration", {})["enabled"] = True
    for section in ("pod", "nodePool"):
        for toleration in doc.get(section, {}).get("tolerations", []):
            if not toleration.get("key"):
                toleration["operator"] = "Exists"  # no key: every taint, with Exists only
            if toleration.get("operator") == "Exists":
                toleration.pop("value", None)
            if "tolerationSeconds" in toleration:
                toleration["effect"] = "NoExecute"
        _repair_selectors(doc.get(section, {}).get("affinity"))
    overrides = [o for o in (doc.get("stages") or {}).values() if isinstance(o, dict)]
    for resources in [doc.get("serving", {}).get("resources"), *(o.get("resources") for o in overrides)]:
        for name, limit in ((resources or {}).get("limits") or {}).items():
            if name in (resources.get("requests") or {}):
                resources["requests"][name] = limit  # a request at most its limit
    for var in doc.get("pod", {}).get("env", []):
        if "valueFrom" in var:
            var.pop("value", None)
    canary = eff["serving"].get("canary")
    if canary is not None and duration_seconds(canary["timeout"]) <= duration_seconds(canary["duration"]):
        doc["serving"]["canary"].update(
            duration="10m", timeout="2h"
        )  # a later timeout may not fit the pattern
    return doc


def _repair_selectors(node: Any) -> None:
    """Every selector requirement in an Affinity given the values its operator needs (kubernetes_rules'
    semantic_problems: In/NotIn at least one, Exists/DoesNotExist none, Gt/Lt one integer)."""
    if isinstance(node, list):
        for item in node:
            _repair_selectors(item)
    elif isinstance(node, dict):
        if "operator" in node and "key" in node and node["key"] != "metadata.name":
            values = node.get("values") or []
            if node["operator"] in ("In", "NotIn") and not values:
                node["values"] = ["a"]
            elif node["operator"] in ("Exists", "DoesNotExist"):
                node.pop("values", None)
            elif node["operator"] in ("Gt", "Lt"):
                node["values"] = ["1"]
        for value in node.values():
            _repair_selectors(value)


def _all_rules_hold(doc: dict[str, Any]) -> bool:
    spec = unchecked_spec(doc)
    return all(rule.holds(spec) for rule in RULES)


@functools.cache
def valid_specs() -> st.SearchStrategy[dict[str, Any]]:
    """Spec documents that parse: schema-valid, then repaired for the cross-field rules."""
    return from_schema(spec_schema()).map(repair).filter(_all_rules_hold)

"""Drift: a child the operator serves with (Deployment, Service, PodMonitor, PodDisruptionBudget) edited by
hand since the operator wrote it.

The spec in git is the truth. Each such child carries what the operator applied (`eagle3.dev/applied`, the
canonical JSON of the body its spec hash hashes); the indexes compare it with the object as the API server
has it and, where a field the operator wrote now holds another value, report the child's spec hash as
drifted, so the planner patches the desired object back (the same merge patch an operator upgrade gets).
Only the operator's own fields count: what the API server adds (defaults, status) and what others add (an
annotation, a label of their own) is left alone. The comparison reads values as the API server stores
them: a quantity is compared by its value ("1000m" is "1"), and a false, zero or empty value the server
omits counts as equal to its absence.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from eagle3_contract.quantity import quantity

DRIFTED = "drifted"


def _empty(value: Any) -> bool:
    return value is None or value is False or value == 0 or value in ("", {}, [])


def holds(applied: Any, observed: Any) -> bool:
    """Whether `observed` still holds every value of `applied`: maps by key (extra keys allowed), lists
    item by item (same length), quantities by value, the rest equal."""
    if isinstance(applied, Mapping):
        if not isinstance(observed, Mapping):
            return _empty(applied) and observed is None
        return all(
            holds(value, observed[key]) if key in observed else _empty(value)
            for key, value in applied.items()
        )
    if isinstance(applied, list):
        if not isinstance(observed, list):
            return _empty(applied) and observed is None
        return len(applied) == len(observed) and all(
            holds(a, o) for a, o in zip(applied, observed, strict=True)
        )
    if applied == observed:
        return True
    if isinstance(applied, str) and isinstance(observed, str | int):
        number = quantity(applied)
        return number is not None and number == quantity(str(observed))
    return False


def observed_body(obj: Mapping[str, Any], applied: Mapping[str, Any]) -> dict[str, Any]:
    """The part of `obj` that `applied` describes: its spec, and its labels where `applied` has them."""
    meta = obj.get("metadata") or {}
    if set(applied) == {"labels", "spec"}:
        return {"labels": meta.get("labels") or {}, "spec": obj.get("spec") or {}}
    return dict(obj.get("spec") or {})


def has_drifted(obj: Mapping[str, Any], annotation: str) -> bool:
    """Whether a field of `obj` the operator applied (its `annotation`'s JSON) holds another value now; an
    object without the annotation (written by an older operator) or with an unreadable one has not."""
    text = (obj.get("metadata") or {}).get("annotations", {}).get(annotation)
    if not text:
        return False
    try:
        applied = json.loads(text)
    except ValueError:
        return False
    return isinstance(applied, dict) and not holds(applied, observed_body(obj, applied))


def observed_hash(obj: Mapping[str, Any], hash_annotation: str, applied_annotation: str) -> str | None:
    """The spec hash the planner compares with the desired one: the object's own, or, when it drifted,
    one that no desired object has (so the planner patches it back)."""
    found = (obj.get("metadata") or {}).get("annotations", {}).get(hash_annotation)
    spec_hash = str(found) if found is not None else None
    if spec_hash is not None and has_drifted(obj, applied_annotation):
        return f"{spec_hash}-{DRIFTED}"
    return spec_hash

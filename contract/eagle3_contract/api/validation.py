"""Turning untrusted documents into a spec, with errors that name the field and say what to do."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from eagle3_contract.api.defaults import OperatorDefaults, with_operator_defaults
from eagle3_contract.api.kubernetes_types import ERROR_TYPE as KUBERNETES_SCHEMA_ERROR
from eagle3_contract.api.spec import Eagle3RunSpec


class InvalidSpecError(ValueError):
    """A spec the operator cannot run. `problems` are `spec.<camelCase path>: <what is wrong>` lines."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid Eagle3Run spec: " + "; ".join(problems))


def _path(loc: tuple[int | str, ...]) -> str:
    # built part by part: a key may itself hold '.[' (a typo'd key '[bold]loud' is reported as written)
    return "spec" + "".join(f"[{item}]" if isinstance(item, int) else f".{item}" for item in loc)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _int64_problems(value: Any, loc: tuple[int | str, ...] = ()) -> list[str]:
    """Integers the API server cannot store (it decodes JSON integers as int64 and refuses the rest), at
    any depth, so a manifest runs locally only if the cluster would take it."""
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in _int64_problems(item, (*loc, str(key)))]
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in _int64_problems(item, (*loc, index))]
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        return [f"{_path(loc)}: {value} does not fit a 64-bit integer ({INT64_MIN} to {INT64_MAX})"]
    return []


def parse_spec(spec: Any) -> Eagle3RunSpec:
    """Validate a spec document (camelCase, as in a manifest) or raise InvalidSpecError."""
    if not isinstance(spec, dict):
        raise InvalidSpecError([f"spec: expected an object, got {type(spec).__name__}"])
    too_big = _int64_problems(spec)
    if too_big:  # the API server refuses these while decoding, before any schema check: so here too
        raise InvalidSpecError(too_big)
    try:
        # Strict JSON validation by alias is what the API server does: "5" is no integer, and a snake_case
        # key is unknown (the server would prune it silently; here it is an error).
        return Eagle3RunSpec.model_validate_json(json.dumps(spec), strict=True, by_alias=True, by_name=False)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            msg = str(err["msg"]).removeprefix("Value error, ")
            if not err["loc"] and msg.startswith("spec"):
                problems.extend(msg.split("; "))
            elif err["type"] == KUBERNETES_SCHEMA_ERROR:
                context = err.get("ctx") or {}
                kind = f"(a Kubernetes {context['type_name']}, the {context['version']} schema)"
                field = _path(tuple(err["loc"]))
                problems += [f"{field}{inner}: {what} {kind}" for inner, what in context["findings"]]
            else:
                problems.append(f"{_path(tuple(err['loc']))}: {msg}")
        raise InvalidSpecError(problems) from None


def with_pipeline_image(spec: Any, image: str | None) -> Any:
    """The spec with the operator's default pipeline image where it names none (a copy; else as given)."""
    if not image or not isinstance(spec, dict):
        return spec
    return with_operator_defaults(spec, OperatorDefaults(pipeline_image=image))


def spec_document(spec: Eagle3RunSpec) -> dict[str, Any]:
    """The spec as the API server stores it after defaulting: camelCase, unset optionals omitted."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)

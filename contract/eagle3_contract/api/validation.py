"""Turning untrusted documents into a spec, with errors that name the field and say what to do."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from eagle3_contract.api.spec import Eagle3RunSpec


class InvalidSpecError(ValueError):
    """A spec the operator cannot run. `problems` are `spec.<camelCase path>: <what is wrong>` lines."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid Eagle3Run spec: " + "; ".join(problems))


def _path(loc: tuple[int | str, ...]) -> str:
    parts = ["spec"]
    for item in loc:
        parts.append(f"[{item}]" if isinstance(item, int) else f".{item}")
    return "".join(parts).replace(".[", "[")


def parse_spec(spec: Any) -> Eagle3RunSpec:
    """Validate a spec document (camelCase, as in a manifest) or raise InvalidSpecError."""
    if not isinstance(spec, dict):
        raise InvalidSpecError([f"spec: expected an object, got {type(spec).__name__}"])
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
            else:
                problems.append(f"{_path(tuple(err['loc']))}: {msg}")
        raise InvalidSpecError(problems) from None


def with_pipeline_image(spec: Any, image: str | None) -> Any:
    """The spec with the operator's default pipeline image where it names none (a copy; else as given)."""
    if not image or not isinstance(spec, dict):
        return spec
    images = spec.get("images")
    if isinstance(images, dict) and images.get("pipeline"):
        return spec
    return {**spec, "images": {**(images if isinstance(images, dict) else {}), "pipeline": image}}


def spec_document(spec: Eagle3RunSpec) -> dict[str, Any]:
    """The spec as the API server stores it after defaulting: camelCase, unset optionals omitted."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)

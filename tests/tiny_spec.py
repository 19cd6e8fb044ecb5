"""The one tiny spec of the tests: the spec of examples/tiny/eagle3run.yaml, the run users start with.

Tests that need a small valid run start from `tiny()` and name at the call what they change (no regeneration,
no gate, another token budget), so a test that depends on a value says so where it depends on it, and the
example stays the spec the tests exercise.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny" / "eagle3run.yaml"


@functools.cache
def _example_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["spec"]
    return spec


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, section 2, as written there (what the API server does with a merge patch); returns a copy."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


def derive(spec: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """A copy of `spec` with `sections` merge-patched in: a dict merges at every depth, None removes the key,
    anything else (a list, a number) replaces it."""
    result: dict[str, Any] = apply_merge_patch(spec, sections)
    return result


def tiny(**sections: Any) -> dict[str, Any]:
    """The tiny example's spec (a fresh copy) with `sections` merge-patched in, as `derive`."""
    return derive(_example_spec(), **sections)


def minimal() -> dict[str, Any]:
    """The tiny spec's required fields only (the verifier's model, the dataset's source): every other field
    takes the API's default."""
    spec = tiny()
    return {
        "verifier": {"model": spec["verifier"]["model"]},
        "dataset": {"source": spec["dataset"]["source"]},
    }

"""The base of every API model: camelCase on the wire, snake_case in Python, no unknown fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

GROUP = "eagle3.dev"
VERSION = "v1alpha1"
KIND = "Eagle3Run"
PLURAL = "eagle3runs"
SINGULAR = "eagle3run"
SHORT_NAMES = ("e3r",)
# `kubectl get all` and `kubectl get eagle3` list runs too
CATEGORIES = ("all", "eagle3")
API_VERSION = f"{GROUP}/{VERSION}"


class ApiModel(BaseModel):
    """Frozen, camelCase, rejects unknown fields (a typo in a manifest is an error, not a silent default)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        # JSON has no NaN or infinity (YAML's .nan/.inf cannot reach the API server): "must be finite"
        allow_inf_nan=False,
        use_attribute_docstrings=False,
    )

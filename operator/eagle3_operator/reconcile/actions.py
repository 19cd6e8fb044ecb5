"""What the planner asks of the API server: one write each, carried out in order by the executor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from eagle3_operator.builders.names import RunRef


@dataclass(frozen=True)
class Action:
    """One API write: `create` tolerates AlreadyExists, `delete` NotFound; `patch` is a merge patch."""

    verb: Literal["create", "patch", "delete"]
    body: dict[str, Any]

    @property
    def key(self) -> tuple[str, str, str]:
        return self.verb, self.body.get("kind", ""), self.body.get("metadata", {}).get("name", "")


def object_ref(api_version: str, kind: str, name: str, run: RunRef) -> dict[str, Any]:
    """The minimal body that names an object (for deletes)."""
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": run.namespace}}

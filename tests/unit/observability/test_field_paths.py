"""The Eagle3Run fields the alerts, their runbooks (docs/troubleshooting.md, its `code` spans) and the
dashboard's panels name exist in the CRD.

A reader follows a runbook to the field it names; a wrong name (a runbook once said `generation.tokenBudget`
for `regeneration.tokenBudget`) sends them nowhere. Paths without `spec.`/`status.` are spec paths.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import pytest
from devtools.generated import REPO_ROOT

from eagle3_contract.api.crd import build_crd
from eagle3_operator.observability.alerts import build_rule_groups
from eagle3_operator.observability.dashboard import build_dashboard

# A dotted lower-camel path not inside another word, URL or label (`eagle3.dev/run`, `$labels.stage`);
# a stage's name stands as `<stage>` or `{{ $labels.stage }}`.
STAGE = r"<stage>|\{\{ \$labels\.stage \}\}"
PATH = re.compile(rf"(?<![\w./{{$-])([a-z][A-Za-z]*(?:\.(?:[a-z][A-Za-z0-9]*|{STAGE}))+)")


def _texts(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [
            t
            for k, v in value.items()
            for t in ([v] if k == "description" and isinstance(v, str) else _texts(v))
        ]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


@functools.cache
def named_paths() -> list[str]:
    texts = [a for g in build_rule_groups()["groups"] for r in g["rules"] for a in r["annotations"].values()]
    texts += _texts(build_dashboard())
    texts += re.findall(r"`([^`]+)`", (REPO_ROOT / "docs" / "troubleshooting.md").read_text())
    return sorted({path for text in texts for path in PATH.findall(text)})


def resolves(path: str) -> bool:
    schema: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    segments = re.sub(STAGE, "<stage>", path).split(".")
    if segments[0] not in ("spec", "status"):
        segments.insert(0, "spec")
    for segment in segments:
        if segment == "<stage>":
            children = schema.get("properties") or {}
            schema = children.get("extract") or schema.get("additionalProperties") or {}
        elif "properties" not in schema and isinstance(schema.get("additionalProperties"), dict):
            schema = schema["additionalProperties"]  # a map's key (status.stages.evaluate)
        else:
            schema = (schema.get("properties") or {}).get(segment, {})
        if not schema:
            return False
    return True


def test_the_texts_name_fields() -> None:
    assert "regeneration.tokenBudget" in named_paths()  # the pattern finds the paths at all


@pytest.mark.parametrize("path", named_paths())
def test_a_named_field_exists(path: str) -> None:
    assert resolves(path), f"{path} is not a field of Eagle3Run"


def test_a_wrong_name_is_caught() -> None:
    assert not resolves("generation.tokenBudget") and not resolves("spec.stages.<stage>.deadline")

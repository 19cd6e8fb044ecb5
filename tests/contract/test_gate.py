"""The acceptance gate's verdict, shared by the operator and the local runner."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_contract.gate import judge_evaluation
from eagle3_contract.results import EvaluateResult


@pytest.mark.parametrize(
    ("result", "required", "passed", "reason"),
    [
        ({"acceptanceLength": 2.5}, 2.0, True, "AcceptanceAboveGate"),
        ({"acceptanceLength": 2.0}, 2.0, True, "AcceptanceAboveGate"),  # reaching the gate is enough
        ({"acceptanceLength": 1.99}, 2.0, False, "AcceptanceBelowGate"),
        # an older evaluate wrote its own verdict: the current gate decides, not that
        ({"acceptanceLength": 1.25, "gatePassed": False}, 1.2, True, "AcceptanceAboveGate"),  # gate lowered
        ({"acceptanceLength": 1.25, "gatePassed": True}, 1.5, False, "AcceptanceBelowGate"),  # gate raised
        ({"acceptanceLength": 1.0}, None, True, "NoGate"),
        ({"acceptanceLength": 3.0, "mappingConsistent": False}, None, False, "MappingInconsistent"),
        ({"acceptanceLength": 3.0, "mappingConsistent": False}, 1.5, False, "MappingInconsistent"),
        ({"acceptanceLength": 3.0, "mappingConsistent": True}, 1.5, True, "AcceptanceAboveGate"),
        ({}, 1.5, False, "EvaluationIncomplete"),
        (None, 1.5, False, "EvaluationIncomplete"),
        ({"acceptanceLength": True}, 1.0, False, "EvaluationIncomplete"),  # a bool is not a measurement
        ({"acceptanceLength": "2.5"}, 1.0, False, "EvaluationIncomplete"),
    ],
)
def test_the_verdict_follows_the_current_gate_and_the_mapping(
    result: dict[str, Any] | None, required: float | None, passed: bool, reason: str
) -> None:
    """Each result is read as the operator reads evaluate's termination message (a bad type is dropped)."""
    verdict = judge_evaluation(EvaluateResult.parse(result), required)
    assert (verdict.passed, verdict.reason) == (passed, reason)
    assert verdict.message


def test_a_failed_verdict_says_what_was_measured_and_what_keeps_serving() -> None:
    verdict = judge_evaluation(EvaluateResult(acceptance_length=1.6), 2.0)
    assert verdict.message == (
        "mean acceptance length 1.600 is below evaluation.minAcceptanceLength 2.0; "
        "the previous draft (if any) keeps serving"
    )

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


def test_a_chosen_draft_is_named_with_its_margin_over_the_runner_up() -> None:
    """Issue 31: with draft.candidates (or checkpoint selection) GatePassed says which won and by how much."""
    checkpoints = [
        {"epoch": 4, "checkpoint": f"candidates/{m}/checkpoints/checkpoint_best", "method": m,
         "acceptanceLength": length, "outputTokensPerSecond": speed}
        for m, length, speed in (("eagle3", 3.1, 410.0), ("dflash", 2.4, 520.0), ("peagle", 2.8, 480.0))
    ]  # fmt: skip
    choice = {"by": "outputTokensPerSecond", "epoch": 4, "checkpoint": checkpoints[1]["checkpoint"]}
    result = EvaluateResult.model_validate(
        {"acceptanceLength": 2.4, "checkpointSelection": choice | {"checkpoints": checkpoints}}
    )
    verdict = judge_evaluation(result, 2.0)
    assert verdict.passed and verdict.reason == "AcceptanceAboveGate"
    assert verdict.message == (
        "mean acceptance length 2.400 reaches evaluation.minAcceptanceLength 2.0; dflash ships: output "
        "tokens/s 520.000 against peagle's 480.000 (1.08x)"
    )
    epochs = {
        "by": "acceptance", "epoch": 4, "checkpoint": "checkpoints/4", "valLossEpoch": 5,
        "checkpoints": [
            {"epoch": 4, "checkpoint": "checkpoints/4", "acceptanceLength": 3.1},
            {"epoch": 5, "checkpoint": "checkpoints/5", "acceptanceLength": 2.9},
        ],
    }  # fmt: skip
    below = judge_evaluation(
        EvaluateResult.model_validate({"acceptanceLength": 3.1, "checkpointSelection": epochs}), 3.5
    )
    assert not below.passed and below.message.endswith(
        "epoch 4 ships: acceptance length 3.100 against epoch 5's 2.900 (1.07x)"
    )

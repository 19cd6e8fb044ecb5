"""The acceptance gate: whether an evaluated draft may be exported and served.

One verdict for the operator (after an evaluate Job) and for the local runner (after the evaluate stage),
so a manifest gates the same way in a cluster and on a laptop; it is the only verdict (evaluate's result
carries the figures, not a verdict). It is judged from evaluate's result against the *current* spec's
`evaluation.minAcceptanceLength`: the gate is not part of evaluate's content hash, so a reused evaluation
may have been measured under another gate. A draft whose d2t/t2d mapping
disagrees fails whatever the gate: its proposals land on the wrong tokens; so does one that draft.candidates'
bake-off found no faster than a training-free rival (or no speculation) with its interval clear.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_contract.results import RIVAL_NOT_BEATEN, EvaluateResult


@dataclass(frozen=True)
class GateVerdict:
    """`reason` is a condition reason (CamelCase); `message` says what was measured and what follows."""

    passed: bool
    reason: str
    message: str


def judge_evaluation(result: EvaluateResult | None, required: float | None) -> GateVerdict:
    """The gate's verdict on one evaluate result (None: none was reported) for `required` (None: no gate);
    when evaluate chose the draft (draft.candidates, training.checkpointSelection acceptance), the message
    says which won and by how much."""
    verdict = _judged(result, required)
    choice = result.checkpoint_selection if result is not None else None
    if choice is None:
        return verdict
    if verdict.passed and choice.verdict == RIVAL_NOT_BEATEN:
        return GateVerdict(
            False,
            "RivalNotBeaten",
            f"{choice.margin()}: a training-free method serves as well without a trained draft; the "
            "previous draft (if any) keeps serving (train longer, or serve the rival)",
        )
    return GateVerdict(verdict.passed, verdict.reason, f"{verdict.message}; {choice.margin()}")


def _judged(result: EvaluateResult | None, required: float | None) -> GateVerdict:
    measured = result.acceptance_length if result is not None else None
    if result is not None and result.mapping_consistent is False:
        return GateVerdict(
            False,
            "MappingInconsistent",
            "evaluate found the draft's d2t and t2d mappings inconsistent, so its proposals land on the "
            "wrong tokens; re-run stages vocab and train. The previous draft (if any) keeps serving",
        )
    if required is None:
        return GateVerdict(True, "NoGate", "evaluation.minAcceptanceLength is unset: every draft may serve")
    if measured is None:
        return GateVerdict(
            False,
            "EvaluationIncomplete",
            "evaluate reported no acceptanceLength, so evaluation.minAcceptanceLength cannot be checked",
        )
    if measured < required:
        return GateVerdict(
            False,
            "AcceptanceBelowGate",
            f"mean acceptance length {measured:.3f} is below evaluation.minAcceptanceLength {required}; "
            "the previous draft (if any) keeps serving",
        )
    return GateVerdict(
        True,
        "AcceptanceAboveGate",
        f"mean acceptance length {measured:.3f} reaches evaluation.minAcceptanceLength {required}",
    )

"""status.plan.prediction: the predict stage's result (evaluation.predict), as the status shows it."""

from __future__ import annotations

from collections.abc import Mapping

from eagle3_contract.api.status import Prediction, PredictionRow, StageStatus
from eagle3_contract.results import PredictResult, parse_result
from eagle3_contract.stages import Stage


def prediction_of(result: PredictResult | None) -> Prediction | None:
    """The status's prediction from the predict stage's result; None without one (or without figures)."""
    if result is None or not result.acceptance_lengths or result.speedup is None:
        return None
    tokens = result.tokens_per_second or []
    rows = [
        PredictionRow(
            acceptance_length=length.acceptance_length,
            source=length.source,
            speedup=list(result.speedup[i]) if i < len(result.speedup) else [],
            tokens_per_second=list(tokens[i]) if i < len(tokens) else [],
        )
        for i, length in enumerate(result.acceptance_lengths)
        if length.acceptance_length is not None
    ]
    return Prediction(
        method=result.method,
        num_speculative_tokens=result.num_speculative_tokens,
        concurrencies=list(result.concurrencies or []),
        baseline_tokens_per_second=list(result.baseline_tokens_per_second or []),
        lengths=rows,
        break_even=list(result.break_even or []),
        verdict=result.verdict,
    )


def plan_prediction(stages: Mapping[str, StageStatus]) -> Prediction | None:
    """status.plan.prediction from the stages' statuses (the predict stage's result, once it succeeded)."""
    stage = stages.get(Stage.PREDICT.value)
    if stage is None or stage.result is None:
        return None
    parsed = parse_result(Stage.PREDICT, stage.result)
    return prediction_of(parsed if isinstance(parsed, PredictResult) else None)

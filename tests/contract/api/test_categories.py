"""evaluation.categories and the figures per category: bounded, in the result and the status alike."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from eagle3_contract.api.categories import MAX_CATEGORIES, CategoryFigures
from eagle3_contract.api.spec import Evaluation
from eagle3_contract.api.status import Checkpoint
from eagle3_contract.results import EvaluateResult

ROW = {
    "category": "add", "prompts": 3, "drafts": 40, "acceptedTokens": 56, "acceptanceLength": 2.4,
    "acceptanceRate": 0.47, "outputTokens": 96, "outputTokensPerSecond": 180.0, "speedup": 1.6,
}  # fmt: skip


def test_evaluation_categories_are_bounded_names() -> None:
    assert Evaluation.model_validate({"categories": ["code", "math"]}).categories == ["code", "math"]
    assert Evaluation().categories is None
    names = [f"c{i}" for i in range(MAX_CATEGORIES + 1)]
    for bad in (names, [""], [" padded"], ["x" * 64]):
        with pytest.raises(ValidationError):
            Evaluation.model_validate({"categories": bad})


def test_the_result_and_the_checkpoint_carry_the_same_rows() -> None:
    result = EvaluateResult.parse({"acceptanceLength": 1.6, "categories": [ROW]})
    assert result is not None and result.categories == [CategoryFigures.model_validate(ROW)]
    checkpoint = Checkpoint(path="export/x", categories=result.categories)
    assert checkpoint.document()["categories"] == [ROW]
    assert EvaluateResult.parse({"acceptanceLength": 1.6}).categories is None  # type: ignore[union-attr]

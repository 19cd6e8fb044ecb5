"""The prediction before training: step-cost arithmetic, break-even, the params' hashing, the result model,
`eagle3 plan`'s table, status.plan.prediction and `eagle3 status`'s lines."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from rich.console import Console

from eagle3_cli.status import plain_table, prediction_lines
from eagle3_contract.acceptance_references import REFERENCES, acceptance_lengths_for
from eagle3_contract.api.status import Eagle3RunStatus, RunPhase, RunPlan, StageStatus
from eagle3_contract.api.validation import parse_spec
from eagle3_contract.results import PredictResult, check_result, parse_result
from eagle3_contract.stages import NO_PREDICTION, Stage, plan_stages
from eagle3_operator.reconcile.prediction import plan_prediction, prediction_of
from eagle3_pipeline.local.plan import plan_lines, plan_table, with_lengths
from eagle3_pipeline.stage_main import TERMINATION_LIMIT
from eagle3_pipeline.stages.predict.prediction import (
    STEP_COST_NOTE,
    break_even,
    interpolate,
    step_cost_tokens_per_second,
    verdict,
)
from eagle3_pipeline.stages.predict.program import ServerRun, step_cost_table
from tests.tiny_spec import minimal

# What the program writes for an unknown verifier (two published ends, a target) at concurrencies 1 and 8:
# the untrained draft ran at 80 and 200 tokens/s with acceptance 1.0, the verifier alone at 100 and 400.
CANNED: dict[str, Any] = {
    "method": "step-cost",
    "methodNote": "step-cost: ...",
    "modelClass": "unknown",
    "numSpeculativeTokens": 3,
    "maxTokens": 64,
    "concurrencies": [1, 8],
    "acceptanceLengths": [
        {
            "acceptanceLength": 2.0,
            "source": "evaluation.targetAcceptanceLength",
            "published": None,
            "clamped": False,
        },
        {"acceptanceLength": 2.88, "source": "dense low", "published": 2.88, "clamped": False},
        {
            "acceptanceLength": 4.0,
            "source": "dense high; 5.08 published, clamped to k+1=4",
            "published": 5.08,
            "clamped": True,
        },
    ],
    "tokensPerSecond": [[160.0, 400.0], [230.4, 576.0], [320.0, 800.0]],
    "speedup": [[1.6, 1.0], [2.304, 1.44], [3.2, 2.0]],
    "baselineTokensPerSecond": [100.0, 400.0],
    "draftTokensPerSecond": [80.0, 200.0],
    "measuredAcceptanceLength": [1.0, 1.0],
    "breakEven": [1.25, 2.0],
    "verdict": "a draft pays off at concurrency 1 from acceptance length 1.25, concurrency 8 from 2.00",
    "prompts": 16,
    "promptsSource": "first user turns of /models/datasets/tiny-chat.jsonl",
    "failedRequests": 0,
    "serverStartSeconds": {"baseline": 41.0, "draft": 44.5},
    "seconds": 120.5,
    "message": None,
}


def canned() -> PredictResult:
    parsed = parse_result(Stage.PREDICT, json.dumps(CANNED))
    assert isinstance(parsed, PredictResult)
    return parsed


# --- arithmetic ---------------------------------------------------------------------------------------------


def test_step_cost_scales_the_measured_tokens_by_l_over_l0() -> None:
    assert step_cost_tokens_per_second(80.0, 1.0, 2.88) == pytest.approx(230.4)
    assert step_cost_tokens_per_second(100.0, 1.25, 2.5) == pytest.approx(200.0)
    with pytest.raises(ValueError, match="not positive"):
        step_cost_tokens_per_second(80.0, 0.0, 2.0)
    measured = ServerRun(tokens_per_second=[80.0, 200.0, None], acceptance_length=[1.0, 1.25, 1.0])
    table = step_cost_table(measured, [2.0, 4.0])
    assert table[2.0] == [160.0, 320.0, None] and table[4.0] == [320.0, 640.0, None]


def test_break_even_is_where_the_speedup_crosses_one() -> None:
    assert break_even([2.0, 2.88, 4.0], [1.6, 2.304, 3.2], 3) == pytest.approx(1.25)  # extrapolated down
    assert break_even([2.0, 3.0], [0.8, 1.2], 3) == pytest.approx(2.5)  # interpolated
    assert break_even([2.0, 3.0], [0.5, 0.6], 3) is None  # would need 7: above k + 1
    assert break_even([2.0, 3.0], [0.5, 0.6], 7) == pytest.approx(7.0)
    assert break_even([2.0], [0.5], 3) == pytest.approx(4.0)  # one point: proportional
    assert break_even([2.0, 3.0], [None, None], 3) is None
    assert break_even([2.0, 3.0], [3.0, 4.0], 3) == 1.0  # at least 1: any draft pays


def test_interpolation_is_exact_for_a_proportional_speedup() -> None:
    points = [(2.0, 1.6), (4.0, 3.2)]
    assert interpolate(points, 3.0) == pytest.approx(2.4)
    assert interpolate(points, 5.0) == pytest.approx(4.0)
    assert interpolate([(2.0, 1.0)], 3.0) == pytest.approx(1.5)
    assert interpolate([], 3.0) is None


def test_the_verdict_names_where_a_draft_pays_and_where_it_cannot() -> None:
    line = verdict([1, 8, 32], [1.4, 2.1, None], 3)
    assert (
        "concurrency 1 from acceptance length 1.40" in line
        and "concurrency 8 from acceptance length 2.10" in line
    )
    assert "not at concurrency 32: it would need more than k+1 = 4" in line


# --- params -------------------------------------------------------------------------------------------------


def test_predict_is_skipped_and_hashes_nothing_unless_asked() -> None:
    doc = minimal()
    off = {p.stage: p for p in plan_stages(parse_spec(doc))}[Stage.PREDICT]
    assert off.skipped == NO_PREDICTION and off.uses_vllm and off.inputs == {}
    edited = copy.deepcopy(doc) | {"evaluation": {"targetAcceptanceLength": 3.0, "concurrencies": [1, 2]}}
    assert {p.stage: p for p in plan_stages(parse_spec(edited))}[Stage.PREDICT].hash == off.hash
    on = copy.deepcopy(doc) | {"evaluation": {"predict": True}}
    planned = {p.stage: p for p in plan_stages(parse_spec(on))}[Stage.PREDICT]
    assert planned.skipped is None and planned.hash != off.hash
    for field, value in [("targetAcceptanceLength", 3.0), ("concurrencies", [1, 2]), ("maxTokens", 7)]:
        other = copy.deepcopy(on)
        other["evaluation"][field] = value
        assert {p.stage: p for p in plan_stages(parse_spec(other))}[Stage.PREDICT].hash != planned.hash, field


# --- the result, the table, the status ----------------------------------------------------------------------


def test_the_canned_result_is_what_the_program_may_commit() -> None:
    assert check_result(Stage.PREDICT, CANNED) == CANNED
    result = canned()
    assert result.document() == CANNED and result.model_extra == {}
    assert result.acceptance_lengths is not None and result.acceptance_lengths[2].clamped is True


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize(
    "model",
    ["meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.3-70B-Instruct", "moonshotai/Kimi-K2-Instruct",
     "moonshotai/Kimi-K2.5", "moonshotai/Kimi-K2.6", "/models/tiny"],
)  # fmt: skip
def test_a_prediction_with_its_sources_fits_a_termination_message(model: str, k: int) -> None:
    """Kubernetes keeps 4 KiB of the predict stage's termination message: its result at three concurrencies,
    every source in full (URL and date), the longest method note and verdict, still fits whole."""
    found, lengths = acceptance_lengths_for(model, k, target=float(k) + 0.5)
    rows = [
        {"acceptanceLength": p.acceptance_length, "source": p.source, "published": p.published,
         "clamped": p.clamped}
        for p in lengths
    ]  # fmt: skip
    result = {
        "method": "step-cost", "methodNote": STEP_COST_NOTE, "modelClass": found, "numSpeculativeTokens": k,
        "maxTokens": 4096, "concurrencies": [1, 64, 1024], "acceptanceLengths": rows,
        "tokensPerSecond": [[12345.67, 23456.78, 34567.89]] * len(rows),
        "speedup": [[1.2345, 2.3456, 0.9876]] * len(rows), "baselineTokensPerSecond": [1234.56] * 3,
        "draftTokensPerSecond": [1234.56] * 3, "measuredAcceptanceLength": [1.2345] * 3,
        "breakEven": [1.234, 2.345, None], "verdict": verdict([1, 64, 1024], [1.234, 2.345, None], k),
        "prompts": 2048, "promptsSource": "first user turns of /models/datasets/a-long-dataset-name.jsonl",
        "failedRequests": 0, "serverStartSeconds": {"baseline": 123.4, "draft": 234.5}, "seconds": 1234.5,
        "message": None,
    }  # fmt: skip
    assert len(json.dumps(result, sort_keys=True, separators=(",", ":")).encode()) <= TERMINATION_LIMIT


def render(result: PredictResult) -> str:
    console = Console(width=200, record=True)
    console.print(plan_table(result))
    return console.export_text()


def test_the_plan_table_has_every_cell_and_the_break_even() -> None:
    text = render(canned())
    assert "concurrency 1" in text and "concurrency 8" in text
    assert "1.60x (160 tok/s)" in text and "2.00x (800 tok/s)" in text and "1.44x (576 tok/s)" in text
    assert "100 tok/s" in text and "400 tok/s" in text  # the verifier alone
    assert "1.25" in text and "2.00" in text and "clamped to k+1=4" in text
    lines = plan_lines(canned())
    assert lines[0].startswith("a draft pays off at concurrency 1 from acceptance length 1.25")
    assert any("untrained draft's own acceptance length" in line for line in lines)


def published(model: str, k: int) -> PredictResult:
    """The canned result with the rows a verifier of `model`'s class gets: its published figures' sources."""
    found, lengths = acceptance_lengths_for(model, k)
    rows = [
        {"acceptanceLength": p.acceptance_length, "source": p.source, "published": p.published,
         "clamped": p.clamped}
        for p in lengths
    ]  # fmt: skip
    doc = CANNED | {
        "modelClass": found, "numSpeculativeTokens": k, "acceptanceLengths": rows,
        "tokensPerSecond": [[100.0 * p.acceptance_length, 400.0] for p in lengths],
        "speedup": [[p.acceptance_length, 1.0] for p in lengths],
    }  # fmt: skip
    parsed = parse_result(Stage.PREDICT, json.dumps(doc))
    assert isinstance(parsed, PredictResult)
    return parsed


def test_the_plan_prints_each_published_figure_with_its_source() -> None:
    """Beside each figure `eagle3 plan` prints where it is published: the benchmark, k, the temperature, the
    draft's model id, the URL and the date (whole, never folded at a usual width)."""
    console = Console(width=400, record=True)
    console.print(plan_table(published("meta-llama/Llama-3.3-70B-Instruct", 7)))
    lines = console.export_text().splitlines()
    refs = [r for r in REFERENCES if r.model_class == "Llama-3.3-70B"]
    assert len(refs) == 9
    for ref in refs:
        figure = f"{ref.acceptance_length:.2f}"
        row = next(
            (
                line
                for line in lines
                if [c.strip() for c in line.split("│")[1:2]] == [figure] and ref.label in line
            ),
            None,
        )
        assert row is not None, ref.label
        assert ref.citation.url in row and ref.model_id in row and ref.benchmark in row
    text = "\n".join(lines)
    assert "verifier class Llama-3.3-70B" in text
    assert "RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3 at https://huggingface.co/nebius/" in text
    assert "stronger" not in text


def test_extra_lengths_are_read_off_the_measured_rows() -> None:
    result = with_lengths(canned(), [1.5, 3.0])
    assert result.acceptance_lengths is not None and result.speedup is not None
    values = [a.acceptance_length for a in result.acceptance_lengths]
    assert values == [1.5, 2.0, 2.88, 3.0, 4.0]
    assert result.speedup[0] == pytest.approx([1.2, 0.75])
    assert result.tokens_per_second is not None and result.tokens_per_second[3] == pytest.approx(
        [240.0, 600.0]
    )
    assert result.break_even == pytest.approx([1.25, 2.0])
    assert "--acceptance-length" in render(result)


def test_status_plan_prediction_from_the_stage_result() -> None:
    prediction = prediction_of(canned())
    assert prediction is not None and prediction.method == "step-cost"
    assert [r.acceptance_length for r in prediction.lengths] == [2.0, 2.88, 4.0]
    assert prediction.lengths[1].speedup == [2.304, 1.44] and prediction.break_even == [1.25, 2.0]
    stages = {"predict": StageStatus(phase="Succeeded", result=CANNED)}
    assert plan_prediction(stages) == prediction
    assert plan_prediction({"predict": StageStatus(phase="Running")}) is None
    assert plan_prediction({}) is None and prediction_of(None) is None


def test_eagle3_status_shows_the_prediction() -> None:
    prediction = prediction_of(canned())
    assert prediction is not None
    status = Eagle3RunStatus(phase=RunPhase.RUNNING, plan=RunPlan(prediction=prediction))
    lines = prediction_lines(status)
    assert lines[0] == "predicted speedup (step-cost, k=3) at concurrency 1 / 8:"
    assert "acceptance length 2.88: 2.30x / 1.44x" in lines[2]
    assert lines[-2] == "  break-even acceptance length: 1.25 / 2.00"
    assert "predicted speedup" in plain_table("Eagle3Run default/tiny", status)
    assert prediction_lines(Eagle3RunStatus(phase=RunPhase.RUNNING)) == []

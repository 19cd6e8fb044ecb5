"""The stage result models: what each program writes, what a reader gets from a termination message."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from eagle3_contract.gate import judge_evaluation
from eagle3_contract.results import (
    RESULT_MODELS,
    EvaluateResult,
    PredictedAcceptance,
    PrepareResult,
    ResultModel,
    SampledAcceptance,
    ServerStartSeconds,
    StageResult,
    TrainEpoch,
    TrainResult,
    VerifiedFile,
    check_result,
    parse_message,
    parse_result,
    result_of,
)
from eagle3_contract.stages import Stage
from tests import tiers
from tests.harness.results import FAKE_RESULTS, fake_model, fake_result

# What each program returns, key for key: the one fake table's results as programs write them (a test below
# checks that the fakes set every key their model declares).
PROGRAM_RESULTS: dict[Stage, dict[str, Any]] = {stage: r.document() for stage, r in FAKE_RESULTS.items()}
# The modules whose source writes each stage's keys (prepare and generate return write_prepared's stats).
PROGRAMS: dict[Stage, list[str]] = {
    Stage.PREPARE: ["stages.prepare.program", "stages.prepare.generation", "data.prepared"],
    Stage.GENERATE: ["stages.generate.program", "data.prepared"],
    Stage.EXTRACT: ["stages.extract.program"],
    Stage.VOCAB: ["stages.vocab.program"],
    Stage.TRAIN: ["stages.train.program", "stages.train.metrics"],
    Stage.EVALUATE: ["stages.evaluate.program", "stages.evaluate.summary"],
    Stage.EXPORT: ["stages.export.program"],
    Stage.VERIFY: ["stages.verify.program"],
    Stage.PREDICT: ["stages.predict.program"],
}


def test_the_fakes_set_every_key_their_models_declare() -> None:
    """So the table is a whole program-shaped result of each stage (vocab times nothing: no seconds)."""
    for stage, result in FAKE_RESULTS.items():
        unset = set(type(result).model_fields) - result.model_fields_set
        assert unset == ({"seconds"} if stage == Stage.VOCAB else set()), (stage, unset)
    train = FAKE_RESULTS[Stage.TRAIN]
    assert isinstance(train, TrainResult) and train.epochs
    assert all(set(TrainEpoch.model_fields) == e.model_fields_set for e in train.epochs)


def test_every_stage_has_a_model() -> None:
    assert set(RESULT_MODELS) == set(Stage) == set(FAKE_RESULTS) == set(PROGRAM_RESULTS)
    assert all(stage == model.STAGE for stage, model in RESULT_MODELS.items())


@pytest.mark.parametrize("stage", list(Stage))
def test_a_program_shaped_result_parses_and_commits_unchanged(stage: Stage) -> None:
    written = PROGRAM_RESULTS[stage]
    assert check_result(stage, written) == written  # result.json's keys are the program's
    parsed = parse_result(stage, json.dumps(written))
    assert isinstance(parsed, RESULT_MODELS[stage]) and parsed.model_extra == {}
    assert parsed.document() == written


def test_prepares_early_return_parses() -> None:
    """With regeneration on and a dataset without answers, prepare writes four keys only."""
    early = {"format": "prompts", "conversations": 4, "samples": 0, "seconds": 0.1}
    assert check_result(Stage.PREPARE, early) == early
    assert PrepareResult.parse(early) == PrepareResult(
        format="prompts", conversations=4, samples=0, seconds=0.1
    )


def _source(module: str) -> str:
    spec = importlib.util.find_spec(f"eagle3_pipeline.{module}")
    if spec is None or spec.origin is None:
        tiers.missing("pipeline", "eagle3_pipeline is not installed (`make test` installs the dev extra)")
    return Path(spec.origin).read_text()


NESTED: tuple[type[ResultModel], ...] = (
    TrainEpoch, ServerStartSeconds, VerifiedFile, SampledAcceptance, PredictedAcceptance,
)  # fmt: skip


def _keys(model: type[ResultModel]) -> set[str]:
    """Every camelCase key `model` declares, its nested models' included."""
    keys = set()
    for name, field in model.model_fields.items():
        keys.add(field.alias or name)
        for nested in NESTED:
            if nested.__name__ in repr(field.annotation):
                keys |= _keys(nested)
    return keys


@pytest.mark.parametrize("stage", list(Stage))
def test_the_keys_a_model_declares_are_those_its_program_writes(stage: Stage) -> None:
    """A guard against a renamed key: its readers would silently see nothing."""
    source = "".join(_source(m) for m in PROGRAMS[stage])
    missing = sorted(k for k in _keys(RESULT_MODELS[stage]) if f'"{k}"' not in source)
    assert missing == [] or (stage == Stage.VOCAB and missing == ["seconds"]), missing  # vocab times nothing


def test_the_fake_results_are_what_a_program_could_write() -> None:
    for stage, result in FAKE_RESULTS.items():
        assert check_result(stage, result.document()) == result.document()
        assert check_result(stage, result) == result.document()  # a program may return its model too
    assert fake_result("evaluate", acceptance_length=1.05)["acceptanceLength"] == 1.05
    assert fake_result("evaluate")["acceptanceLength"] == 1.6  # the table itself is not changed


def test_a_program_returning_a_wrong_type_fails_loudly() -> None:
    with pytest.raises(ValidationError, match="acceptanceLength"):
        check_result(Stage.EVALUATE, {"acceptanceLength": "1.6"})
    with pytest.raises(ValidationError, match="epochs"):
        check_result(Stage.TRAIN, {"epochs": 2})
    with pytest.raises(TypeError, match="not a TrainResult"):
        check_result(Stage.TRAIN, fake_model(Stage.EVALUATE))


def test_a_result_cut_to_its_scalars_parses() -> None:
    """stage_main drops list and dict values from a termination message over 4 KiB."""
    full = PROGRAM_RESULTS[Stage.TRAIN]
    cut = {k: v for k, v in full.items() if not isinstance(v, dict | list)}
    parsed = parse_result(Stage.TRAIN, json.dumps(cut, sort_keys=True))
    assert isinstance(parsed, TrainResult)
    assert parsed.epochs is None and parsed.best_val_loss == 2.1 and parsed.tokens_processed is None


@pytest.mark.parametrize(
    "junk",
    [
        "Traceback (most recent call last):\nRuntimeError: boom",
        "[1, 2]",
        "null",
        '"text"',
        '{"acceptanceLength": true, "acceptanceRate": "0.2", "epochs": {"a": 1}}',
        '{"serverStartSeconds": [1], "accepted_tokens_by_position": "x", "files": 3}',
        '{"path": 1, "files": {"model.safetensors": {"bytes": "x"}}, "manifest": "yes"}',
        "{" * 5000,
    ],
)
def test_junk_never_raises(junk: str) -> None:
    for stage in Stage:
        parsed = parse_result(stage, junk)
        assert isinstance(parsed, RESULT_MODELS[stage])
        assert parsed.tokens_processed is None
        json.dumps(parsed.document())  # the status stays a JSON document


def test_text_is_kept_as_the_message_and_nothing_is_none() -> None:
    assert parse_result(Stage.PREPARE, "done, no JSON here") == PrepareResult.model_validate(
        {"message": "done, no JSON here"}
    )
    assert parse_message("x" * 3000) == {"message": "x" * 2000}
    assert parse_message("[1]") == {"value": [1]}
    assert parse_result(Stage.PREPARE, "") is None and parse_result(Stage.PREPARE, None) is None
    assert parse_result("serve", "{}") is None  # not a stage of this version


def test_a_value_of_the_wrong_type_is_dropped_and_the_rest_kept() -> None:
    parsed = parse_result(Stage.EVALUATE, {"acceptanceLength": True, "acceptanceRate": 0.2, "newKey": [1]})
    assert parsed is not None and parsed.document() == {"acceptanceRate": 0.2, "newKey": [1]}


def test_keys_of_a_newer_program_survive() -> None:
    parsed = parse_result(Stage.EXPORT, {"sha256": "ab" * 32, "signature": "sig"})
    assert parsed is not None and parsed.model_extra == {"signature": "sig"}
    assert parsed.document() == {"sha256": "ab" * 32, "signature": "sig"}


def test_tokens_processed_per_stage() -> None:
    tokens = {stage: parse_result(stage, PROGRAM_RESULTS[stage]) for stage in Stage}
    assert {s: r.tokens_processed for s, r in tokens.items() if r is not None} == {
        Stage.PREPARE: 48_000,  # tokenized conversation tokens
        Stage.GENERATE: 9_000,  # tokens the verifier generated
        Stage.EXTRACT: 48_000,  # tokens whose hidden states are stored
        Stage.VOCAB: None,
        Stage.TRAIN: 2 * 43_200,  # the epochs' trainTokens
        Stage.EVALUATE: 480,  # tokens generated with the draft
        Stage.EXPORT: None,
        Stage.VERIFY: None,
        Stage.PREDICT: None,
    }
    partials: list[dict[str, Any]] = [{"epochs": [{"trainTokens": 10}, {}]}, {"epochs": []}]
    for partial in partials:
        parsed = TrainResult.parse(partial)
        assert parsed is not None and parsed.tokens_processed is None


def test_the_summary_shows_each_stages_figures() -> None:
    prepared = PrepareResult.parse(PROGRAM_RESULTS[Stage.PREPARE])
    assert prepared is not None and prepared.summary() == {
        "samples": 240, "skippedTotal": 3, "tokens": 48_000, "assistantTokens": 20_000,
        "tokensPerSecond": 32_000.0,
    }  # fmt: skip
    assert EvaluateResult(acceptance_length=1.6).summary() == {"acceptanceLength": 1.6}
    assert all(set(m.SUMMARY) <= set(m.model_fields) for m in RESULT_MODELS.values())


def test_the_gate_takes_the_model() -> None:
    evaluated = fake_model(Stage.EVALUATE)
    assert isinstance(evaluated, EvaluateResult)
    assert judge_evaluation(evaluated, 1.5).passed
    assert judge_evaluation(evaluated, 1.7).reason == "AcceptanceBelowGate"
    broken = evaluated.model_copy(update={"mapping_consistent": False})
    assert judge_evaluation(broken, None).reason == "MappingInconsistent"
    assert judge_evaluation(None, 1.5).reason == "EvaluationIncomplete"


def test_result_of_picks_a_stage_typed() -> None:
    results: dict[Stage, StageResult] = {s: fake_model(s) for s in (Stage.TRAIN, Stage.EVALUATE)}
    assert result_of(results, EvaluateResult) is results[Stage.EVALUATE]
    assert result_of(results, PrepareResult) is None

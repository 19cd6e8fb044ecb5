"""The evaluate stage: vLLM's spec-decode counters, the acceptance arithmetic, prompts, the gate, and the
local executor stopping at a failed gate.

Most tests use Prometheus text and results written by hand; the `vllm` tests serve the tiny verifier with a
quickly fitted draft (three vLLM servers in all: the draft and the verifier alone, then a draft whose d2t is
shuffled, which fails the gate).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.gate import GateVerdict, judge_evaluation
from eagle3_contract.results import EvaluateResult
from eagle3_contract.stages import Stage, plan_stages
from eagle3_pipeline.local.run import LocalOptions, LocalRunError, gate_failure, run_local
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.degenerate import Degeneracy, Screening
from eagle3_pipeline.serving.requests import Measurement, request_options
from eagle3_pipeline.serving.spec_metrics import (
    Acceptance,
    SpecDecodeCounters,
    consistency_problems,
    parse_counters,
)
from eagle3_pipeline.stage_main import run_stage
from eagle3_pipeline.stages.evaluate.prompts import HeldOut, answered, held_out_prompts, prompt_of
from eagle3_pipeline.stages.evaluate.summary import Evaluation, summarize
from tests.pipeline.draft_support import (
    evaluate_spec,
    shared_draft,
    shuffle_mapping,
    write_data_stage,
    write_train_stage,
)
from tests.pipeline.manifests import write_manifest
from tests.pipeline.test_vllm_server import vllm_or_skip

Row = dict[str, Any]


def metrics_page(
    drafts: float, tokens: float, accepted: float, per_pos: list[float], engine: str = "0"
) -> str:
    """A /metrics page as vLLM writes it: counters with `_total` and `_created` samples, labels per engine."""
    labels = f'engine="{engine}",model_name="verifier"'
    lines = []
    for name, value in (("drafts", drafts), ("draft_tokens", tokens), ("accepted_tokens", accepted)):
        metric = f"vllm:spec_decode_num_{name}"
        lines += [f"# HELP {metric}_total x", f"# TYPE {metric}_total counter"]
        lines += [f"{metric}_total{{{labels}}} {value}", f"{metric}_created{{{labels}}} 1.7e9"]
    metric = "vllm:spec_decode_num_accepted_tokens_per_pos"
    lines += [f"# HELP {metric}_total x", f"# TYPE {metric}_total counter"]
    lines += [f'{metric}_total{{{labels},position="{i}"}} {v}' for i, v in enumerate(per_pos)]
    lines += ["# HELP vllm:generation_tokens_total x", "# TYPE vllm:generation_tokens_total counter"]
    lines += [f"vllm:generation_tokens_total{{{labels}}} {tokens + drafts}"]
    return "\n".join(lines) + "\n"


BASELINE_PAGE = """# HELP vllm:num_requests_running x
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="verifier"} 0.0
"""


# --- counters and acceptance --------------------------------------------------------------------------------


def test_counters_are_summed_over_engines_for_the_served_model_only() -> None:
    text = metrics_page(10, 30, 12, [8, 3, 1]) + metrics_page(5, 15, 3, [3, 0, 0], engine="1")
    text += metrics_page(100, 300, 300, [100, 100, 100]).replace(
        'model_name="verifier"', 'model_name="other"'
    )
    counters = parse_counters(text, "verifier")
    assert counters == SpecDecodeCounters(15, 45, 15, (11, 3, 1), generation_tokens=60)


def test_a_page_without_spec_decode_counters_has_none() -> None:
    assert parse_counters(BASELINE_PAGE, "verifier") is None


def test_acceptance_from_the_difference_of_two_pages() -> None:
    before = parse_counters(metrics_page(4, 12, 2, [2, 0, 0]), "verifier")
    after = parse_counters(metrics_page(104, 312, 152, [82, 50, 20]), "verifier")
    assert before is not None and after is not None
    delta = after - before
    assert delta == SpecDecodeCounters(100, 300, 150, (80, 50, 20), generation_tokens=400)
    assert consistency_problems(delta, 3) == []
    acceptance = Acceptance.from_counters(delta)
    assert acceptance.rate == pytest.approx(150 / 300)
    assert acceptance.length == pytest.approx(1 + 150 / 100)  # tokens per verifier step, not k
    assert acceptance.by_position == pytest.approx((0.8, 0.5, 0.2))
    assert 1 + sum(acceptance.by_position) == pytest.approx(acceptance.length)


def test_acceptance_without_drafts_is_undefined() -> None:
    with pytest.raises(ValueError, match="no drafts were verified"):
        Acceptance.from_counters(SpecDecodeCounters())


@pytest.mark.parametrize(
    ("counters", "problem"),
    [
        (SpecDecodeCounters(10, 31, 5, (3, 2, 0)), "> drafts 10 x k 3"),
        (SpecDecodeCounters(10, 30, 5, (3, 1, 0)), "does not sum to 5"),
        (SpecDecodeCounters(10, 30, 5, (2, 3, 0)), "grows with the position"),
        (SpecDecodeCounters(10, 30, 5, (3, 2)), "2 draft positions counted, expected k = 3"),
        (SpecDecodeCounters(10, 6, 9, (6, 3, 0)), "accepted 9 > draft tokens 6"),
    ],
)
def test_contradictory_counters_are_named(counters: SpecDecodeCounters, problem: str) -> None:
    assert any(problem in p for p in consistency_problems(counters, 3))


# --- prompts ------------------------------------------------------------------------------------------------


def test_a_prompt_is_the_conversation_up_to_its_first_answer() -> None:
    system, user, answer = (
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi", "extra": "x"},
        {"role": "assistant", "content": "hello"},
    )
    assert prompt_of([system, user, answer, user, answer]) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert prompt_of([user]) == [{"role": "user", "content": "hi"}]  # a prompt-only row
    assert prompt_of([answer, user]) is None and prompt_of([system]) is None


def test_held_out_prompts_come_from_validation_rows(tmp_path: Path) -> None:
    def row(i: int, split: str) -> Row:
        messages = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
        return {"id": str(i), "split": split, "messages": messages}

    path = tmp_path / "conversations.jsonl"
    path.write_text("".join(json.dumps(row(i, "val" if i % 3 == 0 else "train")) + "\n" for i in range(10)))
    held = held_out_prompts(path, 2)
    assert (
        held.available == 4
        and held.skipped == 0
        and held.prompts
        == [
            [{"role": "user", "content": "q0"}],
            [{"role": "user", "content": "q3"}],
        ]
    )
    assert held.ids == ["0", "3"]
    assert len(held_out_prompts(path, 64).prompts) == 4
    path.write_text(json.dumps(row(1, "train")) + "\n")
    with pytest.raises(StageError, match=r"validationFraction above 0"):
        held_out_prompts(path, 2)


def test_conversations_without_a_user_turn_to_answer_are_skipped_and_counted(tmp_path: Path) -> None:
    user, answer = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
    conversations = [[user, answer], [answer, user], [{"role": "system", "content": "s"}], [], [user]]
    rows = [{"id": f"c{i}", "split": "val", "messages": m} for i, m in enumerate(conversations)]
    path = tmp_path / "conversations.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = held_out_prompts(path, 8)
    assert held.ids == ["c0", "c4"] and held.available == 2 and held.skipped == 3
    ev = evaluation(2, accepted=60)
    ev = Evaluation(held.prompts, 2, ev.draft, ev.baseline, None, ev.source, held=held)
    message = summarize(context(tmp_path, prompts=2), ev)["message"]
    assert "3 validation conversations were skipped: they have no user turn to answer" in message


# --- the result and the gate --------------------------------------------------------------------------------


def context(tmp_path: Path, **evaluation: Any) -> StageContext[Any, Any]:
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", evaluate_spec(**evaluation)))
    return StageContext.of_spec(
        Stage.EVALUATE, manifest.name, manifest.spec, tmp_path, tmp_path / "evaluate" / "h"
    )


def evaluation(prompts: int, accepted: float, mapping: str | None = None, base: bool = True) -> Evaluation:
    counters = SpecDecodeCounters(100, 300, accepted, (accepted * 0.7, accepted * 0.3, 0.0))
    outputs: list[str | None] = ["a", "b", "c"]
    draft = Measurement(outputs[:prompts], 300, 2.0, 30.0, counters=counters)
    baseline = Measurement([*outputs[:2], "x"][:prompts], 300, 3.0, 20.0) if base else None
    return Evaluation(
        [[{"role": "user", "content": "q"}]] * prompts, prompts, draft, baseline, mapping, Path("/d")
    )


def screened_evaluation(reasons: list[Degeneracy | None], draft: bool = True) -> Evaluation:
    """Prompts p0.. whose verifier answers were judged `reasons`; the draft measured on the kept ones."""
    kept = [i for i, r in enumerate(reasons) if r is None]
    ids = [f"p{i}" for i in range(len(reasons))]
    prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(len(reasons))]
    counters = SpecDecodeCounters(40, 120, 30, (20, 10, 0))
    answers: list[str | None] = [f"a{i}" for i in kept]
    on_draft = Measurement(answers, 100, 2.0, 30.0, counters=counters) if draft else None
    baseline = Measurement(answers, 100, 4.0, 20.0)
    held = HeldOut(prompts, ids, len(reasons), 0)
    return Evaluation(
        prompts, len(reasons), on_draft, baseline, None, Path("/d"), None, Screening(tuple(reasons)), held
    )


def test_degenerate_prompts_are_left_out_counted_and_named(tmp_path: Path) -> None:
    rep, empty = Degeneracy.REPETITION, Degeneracy.EMPTY
    ev = screened_evaluation([None, rep, None, empty, rep, None])
    ctx = context(tmp_path, prompts=6, numSpeculativeTokens=3, sampling=SAMPLING)
    assert ev.draft is not None
    ev.draft.sampled = Measurement(["x"] * 3, 90, 2.0, counters=SpecDecodeCounters(40, 120, 20, (15, 5, 0)))
    result = summarize(ctx, ev)
    assert result["prompts"] == 6 and result["degeneratePrompts"] == 3
    assert result["degenerate"] == {"empty": 1, "repetition": 2}
    assert result["degenerateExamples"] == ["p1", "p3", "p4"]
    assert result["acceptanceLength"] == 1.75 and result["speedup"] == 2.0  # the kept prompts' figures
    assert result["sampled"]["prompts"] == 3 and result["outputsMatchingBaseline"] == 3
    assert (
        "3 of 6 held-out prompts got a degenerate answer from the verifier (1 empty, 2 repetition; e.g. "
        "conversations p1, p3, p4): the acceptance and speed figures are measured on the other 3"
    ) in result["message"]
    parsed = EvaluateResult.model_validate(result)
    assert parsed.degenerate == {"empty": 1, "repetition": 2} and parsed.degenerate_prompts == 3


def test_when_every_answer_is_degenerate_the_acceptance_is_null_and_fails_the_gate(tmp_path: Path) -> None:
    ev = screened_evaluation([Degeneracy.REPETITION] * 4, draft=False)
    result = summarize(context(tmp_path, prompts=4, minAcceptanceLength=1.3), ev)
    assert (
        result["acceptanceLength"] is None and result["acceptanceRate"] is None and result["drafts"] is None
    )
    assert result["speedup"] is None and result["outputTokens"] is None
    assert result["baselineOutputTokensPerSecond"] is None and result["degeneratePrompts"] == 4
    assert "every one of the 4 held-out prompts got a degenerate answer" in result["message"]
    assert "the acceptance is null" in result["message"]
    verdict = judged(result, 1.3)
    assert not verdict.passed and verdict.reason == "EvaluationIncomplete"


def test_the_progress_counts_the_screening_and_the_kept_prompts() -> None:
    assert answered(10, 10, 3) == 30  # nothing left out: the screening pass is the measured one
    assert answered(10, 7, 3) == 10 + 7 + 2 * 7  # screened, the kept again, then the draft's two passes
    assert answered(10, 0, 3) == 10


def judged(result: dict[str, Any], required: float | None) -> GateVerdict:
    """The gate's verdict on a result, as the operator and `eagle3 run` judge it (eagle3_contract.gate)."""
    return judge_evaluation(EvaluateResult.model_validate(result), required)


def test_the_result_carries_the_figures_and_passes_the_gate(tmp_path: Path) -> None:
    ctx = context(tmp_path, prompts=3, numSpeculativeTokens=3, minAcceptanceLength=1.5)
    result = summarize(ctx, evaluation(3, accepted=60))
    assert result["acceptanceLength"] == 1.6 and result["acceptanceRate"] == 0.2
    assert result["acceptanceByPosition"] == [0.42, 0.18, 0.0]
    assert result["drafts"] == 100 and result["acceptedTokensByPosition"] == [42, 18, 0]
    assert result["outputTokensPerSecond"] == 150 and result["baselineOutputTokensPerSecond"] == 100
    assert result["speedup"] == 1.5 and result["outputsMatchingBaseline"] == 2
    assert result["speedupConcurrency"] == 3  # the 3 prompts in flight at once (at most CONCURRENCY)
    assert "gatePassed" not in result and "minAcceptanceLength" not in result  # the verdict is the gate's
    assert result["message"] is None  # nothing the figures do not say
    verdict = judged(result, 1.5)
    assert verdict.passed and verdict.message == (
        "mean acceptance length 1.600 reaches evaluation.minAcceptanceLength 1.5"
    )
    assert len(json.dumps(result)) < 4096  # it is the container's termination message too


def test_below_the_gate_the_message_names_both_lengths(tmp_path: Path) -> None:
    ctx = context(tmp_path, prompts=8, numSpeculativeTokens=3, minAcceptanceLength=1.7)
    result = summarize(ctx, evaluation(3, accepted=60))
    verdict = judged(result, 1.7)
    assert not verdict.passed
    assert "mean acceptance length 1.600 is below evaluation.minAcceptanceLength 1.7" in verdict.message
    assert "3 held-out prompts, fewer than evaluation.prompts 8" in result["message"]


def test_without_a_gate_it_passes_and_says_so(tmp_path: Path) -> None:
    result = summarize(context(tmp_path, prompts=3), evaluation(3, accepted=0))
    verdict = judged(result, None)
    assert verdict.passed and verdict.reason == "NoGate" and "is unset" in verdict.message


def test_a_broken_mapping_fails_the_gate_whatever_the_acceptance(tmp_path: Path) -> None:
    ctx = context(tmp_path, prompts=3, minAcceptanceLength=1.1)
    result = summarize(ctx, evaluation(3, accepted=90, mapping="d2t maps 5 of 8 draft tokens", base=False))
    assert result["mappingConsistent"] is False and judged(result, 1.1).reason == "MappingInconsistent"
    assert "d2t and t2d disagree (d2t maps 5 of 8 draft tokens)" in result["message"]
    assert result["speedup"] is None and result["outputsMatchingBaseline"] is None


def test_embeddings_of_another_verifier_are_named(tmp_path: Path) -> None:
    ev = evaluation(3, accepted=9)
    ev = Evaluation(ev.prompts, 3, ev.draft, ev.baseline, None, ev.source, "2 of 1024 rows ... differ")
    result = summarize(context(tmp_path, prompts=3, minAcceptanceLength=1.5), ev)
    assert result["embeddingsMatchVerifier"] is False and not judged(result, 1.5).passed
    assert (
        "2 of 1024 rows ... differ: the draft was trained for another version of verifier.model"
        in (result["message"])
    )


SAMPLING = {"temperature": 0.7, "topP": 0.95, "topK": 40, "seed": 7}


def test_greedy_and_sampled_requests_carry_vllms_sampling_params() -> None:
    from eagle3_contract.api.spec import Sampling

    assert request_options(None) == {"temperature": 0.0, "extra_body": {"return_token_ids": True}}
    sampled = request_options(Sampling.model_validate(SAMPLING))
    assert sampled == {
        "temperature": 0.7, "top_p": 0.95, "seed": 7, "extra_body": {"top_k": 40, "return_token_ids": True}
    }  # fmt: skip


def test_the_sampled_measurement_is_written_beside_the_greedy_one(tmp_path: Path) -> None:
    ctx = context(tmp_path, prompts=3, numSpeculativeTokens=3, minAcceptanceLength=1.5, sampling=SAMPLING)
    ev = evaluation(3, accepted=60)
    assert ev.draft is not None
    ev.draft.sampled = Measurement(
        ["x", None, "z"], 250, 2.5, counters=SpecDecodeCounters(100, 300, 30, (20, 10, 0))
    )
    ev.draft.sampled.failures.append("prompt 1: APITimeoutError: timed out")
    result = summarize(ctx, ev)
    assert result["acceptanceLength"] == 1.6  # the gate's figure stays the greedy one
    assert result["sampled"] == {
        "temperature": 0.7, "topP": 0.95, "topK": 40, "seed": 7, "prompts": 3, "drafts": 100,
        "draftTokens": 300, "acceptedTokens": 30, "acceptanceRate": 0.1, "acceptanceLength": 1.3,
        "acceptanceByPosition": [0.2, 0.1, 0.0],
    }  # fmt: skip
    parsed = EvaluateResult.model_validate(result)
    assert parsed.sampled is not None and parsed.sampled.acceptance_length == 1.3
    assert judged(result, 1.5).passed  # sampled acceptance below the gate does not fail it
    assert result["failedPrompts"] == 1 and "APITimeoutError" in result["message"]
    assert len(json.dumps(result)) < 4096


def test_without_sampling_only_greedy_is_measured(tmp_path: Path) -> None:
    result = summarize(context(tmp_path, prompts=3), evaluation(3, accepted=60))
    assert result["sampled"] is None


def test_contradictory_sampled_counters_fail_the_stage(tmp_path: Path) -> None:
    ev = evaluation(3, accepted=60)
    assert ev.draft is not None
    ev.draft.sampled = Measurement(
        ["x"] * 3, 250, 2.5, counters=SpecDecodeCounters(100, 300, 60, (10, 20, 30))
    )
    with pytest.raises(StageError, match="contradict each other"):
        summarize(context(tmp_path, prompts=3, sampling=SAMPLING), ev)


def test_contradictory_counters_fail_the_stage(tmp_path: Path) -> None:
    ev = evaluation(3, accepted=60)
    assert ev.draft is not None
    ev.draft.counters = SpecDecodeCounters(100, 300, 60, (10, 20, 30))
    with pytest.raises(StageError, match="contradict each other"):
        summarize(context(tmp_path, prompts=3), ev)


def test_the_local_run_stops_before_export_when_the_gate_fails(tmp_path: Path) -> None:
    spec = evaluate_spec(prompts=4, minAcceptanceLength=2.0)
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", spec))
    art = tmp_path / "art"
    for plan in plan_stages(manifest.spec):
        if plan.stage == Stage.EXPORT or plan.skipped:
            continue
        (art / plan.output_dir).mkdir(parents=True)
        result = {"acceptanceLength": 1.25, "message": "measured on 3 held-out prompts"}
        (art / plan.output_dir / "result.json").write_text(
            json.dumps(result if plan.stage == Stage.EVALUATE else {})
        )
    with pytest.raises(LocalRunError) as failed:
        run_local(manifest, LocalOptions(artifacts=art, python="/nonexistent"))  # no stage program runs
    message, outcomes = failed.value.args
    below = "mean acceptance length 1.250 is below evaluation.minAcceptanceLength 2.0"
    assert f"(AcceptanceBelowGate): {below}" in message
    assert "Export and serving do not run" in message
    assert "evaluate says: measured on 3 held-out prompts" in message  # its notes, not a verdict
    assert outcomes[-1].stage == "evaluate" and outcomes[-1].note == "gate failed"
    assert not (art / "export").exists()


@pytest.mark.parametrize(
    ("result", "required", "stops"),
    [
        # an older evaluate wrote its own verdict (gatePassed): the current spec's gate decides
        ({"acceptanceLength": 1.25, "gatePassed": False}, 1.2, False),  # judged at a stricter gate before
        ({"acceptanceLength": 1.25, "gatePassed": True}, 1.5, True),  # the gate was raised since
        ({"acceptanceLength": 3.0, "gatePassed": False, "mappingConsistent": False}, None, True),
        ({"acceptanceLength": 3.0, "gatePassed": True, "mappingConsistent": True}, None, False),
        ({}, 1.5, True),
    ],
)
def test_the_gate_is_the_current_specs(
    tmp_path: Path, result: dict[str, Any], required: float | None, stops: bool
) -> None:
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", evaluate_spec(prompts=4)))
    plan = next(p for p in plan_stages(manifest.spec) if p.stage == Stage.EVALUATE)
    assert (gate_failure(plan, EvaluateResult.parse(result), required) is not None) is stops


# --- with vLLM ----------------------------------------------------------------------------------------------

PROMPTS = 16
MAX_TOKENS = 64
# Held-out conversations of spam-like text (as raw completion prompts are), which a tiny verifier built on
# one machine answered with a repetition loop (" lemon lemon ..." up to MAX_TOKENS), and two it cannot be
# asked (no user turn to answer): they come first in the validation split. Whether the verifier loops on
# them depends on the machine its pretraining ran on (its float32 kernels: one built on an AVX512-BF16 CPU
# answers "b o x"), so the tests below hold for whichever prompts the screening flagged, and check what it
# flagged against the result (the rules themselves: tests/pipeline/test_degenerate.py, on loops that must be
# flagged on every machine).
LOOPS = {"spam-0": " 47mo lemon" * 12, "spam-1": " lemon" * 20}
UNANSWERABLE: list[list[dict[str, str]]] = [
    [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Hi there."}],
    [{"role": "system", "content": "You are a helpful assistant."}],
]
# the good run also measures at the serving traffic's settings, on its draft server (no extra server)
SERVING_SAMPLING = {"temperature": 1.0, "topP": 0.9, "seed": 3}
# (evaluation.sweep's paired rounds are the demo's: tests/pipeline/test_main_job.py)


INCUMBENT = "export/incumbent"


@dataclass(frozen=True)
class Run:
    code: int
    result: dict[str, Any]
    output: Path


def evaluate_in(root: Path, models: Path, draft: Path, **evaluation: Any) -> Run:
    from tests.pipeline.draft_support import DATASET, conversations

    art = root / "art"
    crafted = [
        {"id": i, "split": "val", "messages": [{"role": "user", "content": c}]} for i, c in LOOPS.items()
    ]
    crafted += [{"id": f"no-user-{i}", "split": "val", "messages": m} for i, m in enumerate(UNANSWERABLE)]
    inputs = [
        f"prepare={write_data_stage(art, crafted + conversations(models / DATASET))}",
        f"train={write_train_stage(art, draft)}",
    ]
    manifest = write_manifest(root / "run.yaml", evaluate_spec(**evaluation))
    code = run_stage("evaluate", str(manifest), str(art), "evaluate/h", inputs)
    output = art / "evaluate" / "h"
    result = json.loads((output / "result.json").read_text()) if code == 0 else {}
    return Run(code, result, output)


@pytest.fixture(scope="module")
def vllm_env(tiny_models: Path) -> Iterator[Path]:
    vllm = vllm_or_skip()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLE3_VLLM", vllm)
        mp.setenv("EAGLE3_MODELS_ROOT", str(tiny_models))
        yield tiny_models


@pytest.fixture(scope="module")
def good_run(vllm_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    from eagle3_pipeline.data.draft_checkpoint import write_serving_checkpoint
    from tests.pipeline.draft_support import VERIFIER

    draft = shared_draft(vllm_env, tmp_path_factory.getbasetemp())
    root = tmp_path_factory.mktemp("good")
    # the incumbent: an unfitted draft of the same shape, exported as the one serving
    unfitted = shared_draft(vllm_env, tmp_path_factory.getbasetemp(), fitted=False)
    write_serving_checkpoint(unfitted, root / "art" / INCUMBENT, f"/models/{VERIFIER}")
    gate = {"minAcceptanceLength": 1.3}
    return evaluate_in(
        root, vllm_env, draft, prompts=PROMPTS, maxTokens=MAX_TOKENS, sampling=SERVING_SAMPLING,
        incumbent={"path": INCUMBENT}, **gate,
    )  # fmt: skip


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_acceptance_follows_from_vllms_raw_counters(good_run: Run) -> None:
    r = good_run.result
    assert good_run.code == 0
    assert r["prompts"] == PROMPTS and r["failedPrompts"] == 0
    assert r["maxTokens"] == MAX_TOKENS and r["outputTokens"] <= PROMPTS * MAX_TOKENS
    assert r["draftTokens"] <= r["drafts"] * r["numSpeculativeTokens"]
    assert sum(r["acceptedTokensByPosition"]) == r["acceptedTokens"]
    assert r["acceptanceRate"] == pytest.approx(r["acceptedTokens"] / r["draftTokens"], abs=1e-6)
    assert r["acceptanceLength"] == pytest.approx(1 + r["acceptedTokens"] / r["drafts"], abs=1e-6)
    by_position = [a / r["drafts"] for a in r["acceptedTokensByPosition"]]
    assert r["acceptanceByPosition"] == pytest.approx(by_position, abs=1e-6)
    # the fitted draft is a working one: 1.5 to 1.75 tokens per step, most of them at position 0
    assert r["acceptanceLength"] > 1.3 and judged(r, 1.3).passed and r["embeddingsMatchVerifier"] is True
    assert r["acceptanceByPosition"][0] > 0.4
    assert r["outputTokens"] == r["baselineOutputTokens"]
    # greedy decoding is lossless up to numerics (on the kept prompts: the loops were left out)
    assert r["outputsMatchingBaseline"] >= PROMPTS - len(flagged(good_run)) - 1
    assert r["outputTokensPerSecond"] > 0 and r["speedup"] > 0


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_sampled_acceptance_is_measured_on_the_same_draft_server(good_run: Run) -> None:
    r, s = good_run.result, good_run.result["sampled"]
    assert s["temperature"] == 1.0 and s["topP"] == 0.9 and s["topK"] == -1 and s["seed"] == 3
    assert s["prompts"] == PROMPTS - len(flagged(good_run)) and r["failedPrompts"] == 0
    assert s["drafts"] > 0 and s["draftTokens"] <= s["drafts"] * r["numSpeculativeTokens"]
    assert s["acceptanceLength"] == pytest.approx(1 + s["acceptedTokens"] / s["drafts"], abs=1e-6)
    assert s["acceptanceRate"] == pytest.approx(s["acceptedTokens"] / s["draftTokens"], abs=1e-6)
    assert 1 + sum(s["acceptanceByPosition"]) == pytest.approx(s["acceptanceLength"], abs=1e-5)
    # its own counters' difference, not the greedy run's again (the draft guesses sampled tokens worse)
    assert s["acceptedTokens"] != r["acceptedTokens"] or s["drafts"] != r["drafts"]
    assert s["acceptanceLength"] < r["acceptanceLength"]
    log = (good_run.output / "vllm-draft.log").read_text()
    assert log.count("Starting vLLM server on") == 1  # one server for both measurements


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_the_slim_draft_shares_the_verifiers_embeddings(good_run: Run) -> None:
    log = (good_run.output / "vllm-draft.log").read_text()
    assert "EAGLE model without its own embed_tokens" in log  # vLLM shares the verifier's embeddings
    assert not (good_run.output / "draft").exists()  # export writes the draft that ships
    assert good_run.result["serverStartSeconds"]["draft"] > 0


def answers(run: Run) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run.output / "answers.jsonl").read_text().splitlines()]


def flagged(run: Run) -> list[str]:
    """The ids of the prompts the screening found degenerate in this run, in the held-out order."""
    return [row["id"] for row in answers(run) if row["degenerate"]]


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_looping_answers_are_left_out_of_the_acceptance(good_run: Run) -> None:
    r, rows, loops = good_run.result, answers(good_run), flagged(good_run)
    assert r["degeneratePrompts"] == len(loops) == sum(r["degenerate"].values())
    assert (
        r["degenerateExamples"] == loops[: len(r["degenerateExamples"])] and len(r["degenerateExamples"]) <= 3
    )
    if loops:
        assert f"{len(loops)} of {PROMPTS} held-out prompts got a degenerate answer" in r["message"]
    assert f"{len(UNANSWERABLE)} validation conversations were skipped" in r["message"]
    reasons = [row["degenerate"] for row in rows if row["degenerate"]]
    assert {reason: reasons.count(reason) for reason in ("empty", "repetition")} == r["degenerate"]
    kept = [row for row in rows if not row["degenerate"]]
    # both servers measured the kept prompts only: their tokens are the kept answers', the loops' are not
    assert r["outputTokens"] == r["baselineOutputTokens"] == sum(row["answerTokens"] for row in kept)
    # every verifier step yields 1 + its accepted tokens after the first token: the draft's counters saw
    # no more tokens than the kept answers hold (the loops would add 2 x MAX_TOKENS)
    k = r["numSpeculativeTokens"]
    assert r["outputTokens"] - 2 * len(kept) <= r["drafts"] + r["acceptedTokens"] <= r["outputTokens"] + k


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_prompts_are_chats_rendered_with_the_verifiers_template(good_run: Run, vllm_env: Path) -> None:
    from transformers import AutoTokenizer

    from tests.pipeline.draft_support import VERIFIER

    tokenizer = AutoTokenizer.from_pretrained(str(vllm_env / VERIFIER))
    data = good_run.output.parents[1] / "prepare" / "h" / "conversations.jsonl"
    messages = {row["id"]: row["messages"] for row in map(json.loads, data.read_text().splitlines())}
    rows = answers(good_run)
    assert len(rows) == PROMPTS
    for row in rows:  # the token ids vLLM returned for the prompt it rendered
        prompt = prompt_of(messages[row["id"]])
        rendered: Any = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True)  # type: ignore[arg-type]
        assert row["promptTokenIds"] == rendered["input_ids"], row["id"]
    for server in ("draft", "baseline"):
        log = (good_run.output / f"vllm-{server}.log").read_text()
        assert log.count('"POST /v1/chat/completions HTTP/1.1" 200') >= PROMPTS - len(flagged(good_run))
        assert '"POST /v1/completions' not in log  # never raw completions (the route list names it)


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_a_shuffled_mapping_fails_the_gate_with_a_clear_message(
    good_run: Run, vllm_env: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("shuffled")
    draft = shuffle_mapping(shared_draft(vllm_env, tmp_path_factory.getbasetemp()), root / "draft")
    run = evaluate_in(root, vllm_env, draft, prompts=PROMPTS, minAcceptanceLength=1.3)
    r = run.result
    assert run.code == 0  # the stage measured the draft; the gate is the operator's decision
    assert r["mappingConsistent"] is False and judged(r, 1.3).reason == "MappingInconsistent"
    assert r["degeneratePrompts"] == len(flagged(run))  # screened on the draft server's greedy answers
    assert (
        "the draft's d2t and t2d disagree" in r["message"] and "re-run stages vocab and train" in r["message"]
    )
    assert r["acceptanceLength"] < good_run.result["acceptanceLength"] - 0.3  # acceptance collapses
    assert r["baselineOutputTokensPerSecond"] is None and not (run.output / "vllm-baseline.log").exists()
    assert os.path.exists(run.output / "vllm-draft.log")


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_acceptance_per_category_is_measured_for_the_tiny_task_kinds(good_run: Run) -> None:
    """The tiny dataset's rows carry their task kind (`category`); the crafted rows have none (`other`).
    Each category's kept prompts are answered as a run of their own on the same two servers, so: their
    prompts add up to the measured ones exactly, and, being the same prompts answered greedily again, their
    drafts and accepted tokens add up to the main run's up to batch numerics (fewer requests in flight)."""
    from eagle3_pipeline.stages.evaluate.categories import MIN_TIMED_PROMPTS
    from eagle3_pipeline.tiny.tasks import TASKS, task_kind

    r, rows = good_run.result, good_run.result["categories"]
    assert rows is not None and len(rows) >= 2
    names = [row["category"] for row in rows]
    assert set(names) - {"other"} <= {task_kind(task) for task, _ in TASKS} and len(set(names)) == len(names)
    assert sum(row["prompts"] for row in rows) == r["prompts"] - len(flagged(good_run))
    for row in rows:
        assert row["outputTokensPerSecond"] > 0
        assert (row["speedup"] is None) == (row["prompts"] < MIN_TIMED_PROMPTS) and (row["speedup"] or 1) > 0
        if row["drafts"]:
            assert row["acceptanceLength"] == pytest.approx(
                1 + row["acceptedTokens"] / row["drafts"], abs=1e-5
            )
    drafts, accepted = sum(row["drafts"] for row in rows), sum(row["acceptedTokens"] for row in rows)
    assert drafts == pytest.approx(r["drafts"], rel=0.1) and accepted == pytest.approx(
        r["acceptedTokens"], rel=0.1
    )
    log = (good_run.output / "vllm-draft.log").read_text()
    assert log.count("Starting vLLM server on") == 1  # the same draft server


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_the_incumbent_is_measured_on_the_same_prompts_and_the_fitted_draft_beats_it(good_run: Run) -> None:
    """evaluation.incumbent: the serving draft (here an unfitted one) answers the same kept prompts on a
    server of its own, overall and per category; the fitted draft is accepted more, and the ratio is the
    two acceptance lengths' (each from its own counters)."""
    r, incumbent = good_run.result, good_run.result["incumbent"]
    assert incumbent["path"] == INCUMBENT and incumbent["method"] == "eagle3"
    assert incumbent["acceptanceLength"] == pytest.approx(
        1 + incumbent["acceptedTokens"] / incumbent["drafts"]
    )
    assert incumbent["acceptanceRatio"] == pytest.approx(
        r["acceptanceLength"] / incumbent["acceptanceLength"], rel=1e-3
    )
    assert incumbent["acceptanceRatio"] > 1, "a draft fitted to the verifier beats an unfitted one"
    assert [c["category"] for c in incumbent["categories"]] == [c["category"] for c in r["categories"]]
    assert [c["prompts"] for c in incumbent["categories"]] == [c["prompts"] for c in r["categories"]]
    log = (good_run.output / "vllm-incumbent.log").read_text()
    assert log.count("Starting vLLM server on") == 1 and INCUMBENT in log


def test_a_wrong_incumbent_path_fails_before_any_server_starts(
    tmp_path: Path, vllm_env: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    draft = shared_draft(vllm_env, tmp_path_factory.getbasetemp())
    run = evaluate_in(tmp_path, vllm_env, draft, prompts=4, incumbent={"path": "export/nothing"})
    assert run.code != 0 and not list(run.output.parent.glob("**/vllm-*.log"))

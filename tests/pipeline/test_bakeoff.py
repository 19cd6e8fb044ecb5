"""draft.candidates' bake-off decision (eagle3_pipeline.stages.evaluate.bakeoff.decide), pure: which trained
draft ships from each contender's paired rounds, and the gate's verdict when none beats every rival."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from eagle3_contract.api.spec import CandidateMethod
from eagle3_contract.gate import judge_evaluation
from eagle3_contract.results import CheckpointChoice, EvaluateResult
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.stages.evaluate.bakeoff import NONE, Decision, Versus, decide, settled

ROUNDS = 6


def rounds(speed: float, jitter: float = 0.01) -> list[float | None]:
    """Rounds that agree within `jitter`, a machine's drift shared by every contender of a round."""
    drift = (1.0, 0.8, 1.1, 0.7, 1.2, 0.9)  # the machine's load moves every contender of a round alike
    return [speed * d * (1 + jitter * ((i % 3) - 1)) for i, d in enumerate(drift)]


def test_a_draft_faster_than_every_rival_with_its_interval_clear_ships() -> None:
    speeds = {NONE: rounds(300.0), "eagle3": rounds(480.0), "ngram": rounds(310.0)}
    decision = decide(speeds, ["eagle3"], [NONE, "ngram"], default="eagle3")
    assert (decision.shipped, decision.verdict) == ("eagle3", "better")
    assert decision.decided_by is not None and decision.decided_by.rival == "ngram"  # the closest rival
    assert decision.decided_by.comparison.low > 1.0


def test_the_same_draft_as_two_candidates_is_not_distinguishable_never_a_winner() -> None:
    """Issue 43: a forced tie. Two candidates with the same speed (within the rounds' noise) both beat the
    rivals; neither beats the other, so draft.method ships and the result says why."""
    same = rounds(480.0)
    twin = [v * (1.0 + 0.02 * (-1) ** i) for i, v in enumerate(same) if v is not None]
    speeds = {NONE: rounds(300.0), "eagle3": same, "peagle": list(twin)}
    for default in ("eagle3", "peagle"):
        decision = decide(speeds, ["eagle3", "peagle"], [NONE], default=default)
        assert (decision.shipped, decision.verdict) == (default, "notDistinguishable")
        assert decision.runner_up is not None and decision.runner_up.comparison.low <= 1.0
    choice = document(decide(speeds, ["eagle3", "peagle"], [NONE], default="peagle"), "peagle")
    assert "not distinguishable" in choice.margin() and "draft.method ships" in choice.margin()


def test_a_clearly_faster_candidate_ships_over_the_others() -> None:
    speeds = {NONE: rounds(300.0), "eagle3": rounds(480.0), "dflash": rounds(380.0)}
    decision = decide(speeds, ["eagle3", "dflash"], [NONE], default="dflash")
    assert (decision.shipped, decision.verdict) == ("eagle3", "better")
    assert decision.runner_up is not None and decision.runner_up.rival == "dflash"


def test_no_draft_ships_when_a_training_free_rival_is_as_fast_and_the_gate_says_which() -> None:
    speeds = {NONE: rounds(300.0), "eagle3": rounds(480.0), "ngram": rounds(470.0, jitter=0.05)}
    decision = decide(speeds, ["eagle3"], [NONE, "ngram"], default="eagle3")
    assert decision.verdict == "rivalNotBeaten" and decision.shipped == "eagle3"  # measured in full
    assert decision.decided_by is not None and decision.decided_by.rival == "ngram"
    result = EvaluateResult.model_validate(
        {
            "acceptanceLength": 3.1,
            "mappingConsistent": True,
            "checkpointSelection": document(decision, "eagle3").model_dump(by_alias=True),
        }
    )
    verdict = judge_evaluation(result, 1.5)
    assert not verdict.passed and verdict.reason == "RivalNotBeaten"
    assert "eagle3 over ngram" in verdict.message and "interval" in verdict.message


def test_a_draft_slower_than_no_speculation_never_ships() -> None:
    speeds = {NONE: rounds(300.0), "eagle3": rounds(200.0)}
    decision = decide(speeds, ["eagle3"], [NONE], default="eagle3")
    assert decision.verdict == "rivalNotBeaten"
    assert decision.decided_by is not None and decision.decided_by.comparison.high < 1.0


def test_noisy_rounds_decide_only_through_their_wide_interval() -> None:
    wild = [300.0 * r for r in (1.3, 3.9, 1.4, 3.5, 1.2, 4.0)]  # every round faster, by 1.2x to 4x
    decision = decide({NONE: [300.0] * ROUNDS, "eagle3": wild}, ["eagle3"], [NONE], default="eagle3")
    assert decision.verdict == "better"
    assert decision.decided_by is not None and decision.decided_by.comparison.noisy  # flagged
    wilder = [300.0 * r for r in (0.6, 3.9, 1.4, 3.5, 1.2, 4.0)]  # one round slower
    decision = decide({NONE: [300.0] * ROUNDS, "eagle3": wilder}, ["eagle3"], [NONE], default="eagle3")
    assert decision.verdict == "rivalNotBeaten"


def test_an_undecided_or_noisy_bake_off_is_not_settled_and_gets_its_rounds_again() -> None:
    clear = decide({NONE: rounds(300.0), "eagle3": rounds(480.0)}, ["eagle3"], [NONE], default="eagle3")
    assert settled(clear)
    straddles = decide({NONE: rounds(300.0), "eagle3": rounds(300.0, 0.05)}, ["eagle3"], [NONE], "eagle3")
    assert not settled(straddles)
    wild = [300.0 * r for r in (1.3, 3.9, 1.4, 3.5, 1.2, 4.0)]
    assert not settled(decide({NONE: [300.0] * ROUNDS, "eagle3": wild}, ["eagle3"], [NONE], "eagle3"))


def document(decision: Decision, shipped: str) -> CheckpointChoice:
    def dumped(v: Versus | None) -> dict[str, object] | None:
        return (
            None
            if v is None
            else {"method": v.method, "rival": v.rival, "comparison": v.comparison.model_dump(by_alias=True)}
        )

    return CheckpointChoice.model_validate(
        {
            "by": "outputTokensPerSecond",
            "epoch": 1,
            "checkpoint": f"candidates/{shipped}/checkpoints/checkpoint_best",
            "checkpoints": [
                {
                    "epoch": 1,
                    "checkpoint": f"candidates/{shipped}/checkpoints/checkpoint_best",
                    "method": shipped,
                }
            ],
            "verdict": decision.verdict,
            "decidedBy": dumped(decision.decided_by),
            "runnerUp": dumped(decision.runner_up),
        }
    )


def test_the_demo_prints_the_bake_off_with_each_contenders_interval_and_the_verdict() -> None:
    from rich.console import Console

    from eagle3_pipeline.local.display import StageOutcome
    from eagle3_pipeline.local.evaluation_tables import bake_off_table

    speeds = {NONE: rounds(300.0), "eagle3": rounds(480.0), "ngram": rounds(310.0)}
    decision = decide(speeds, ["eagle3"], [NONE, "ngram"], default="eagle3")
    choice = document(decision, "eagle3").model_dump(by_alias=True)
    interval = {"ratio": 1.6, "low": 1.55, "high": 1.65, "confidence": 0.969, "rounds": 6, "spread": 0.02}
    choice["checkpoints"][0] |= {
        "outputTokensPerSecond": 480.0,
        "acceptanceLength": 3.1,
        "comparison": interval,
        "outputsCompared": 8,
        "outputsMatchingAlone": 8,
    }
    choice["rivals"] = [
        {"method": "none", "outputTokensPerSecond": 300.0},
        {"method": "ngram", "outputTokensPerSecond": 310.0, "outputsCompared": 8, "outputsMatchingAlone": 7},
    ]
    result = EvaluateResult.model_validate({"acceptanceLength": 3.1, "checkpointSelection": choice})
    assert bake_off_table([StageOutcome("prepare", "done")]) is None  # no bake-off: no table
    console = Console(record=True, width=200)
    console.print(bake_off_table([StageOutcome("evaluate", "done", result=result)]))
    text = console.export_text()
    assert "eagle3 (ships)" in text and "1.60x [1.55, 1.65]" in text and "ngram" in text, text
    assert "eagle3 ships, beating every rival (eagle3 over ngram:" in text, text
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│ ")}
    assert rows["eagle3"].rstrip(" │").endswith("8/8") and rows["ngram"].rstrip(" │").endswith("7/8"), text
    line = CheckpointChoice.model_validate(choice).line()  # evaluate's log, the run's Event
    assert "ngram: 310.0 output tokens/s, 1 of 8 answers not the verifier alone's" in line, line
    assert "eagle3: 480.0 output tokens/s (1.60x [1.55, 1.65] (96.9% interval, 6 rounds) over none), " in line


def test_a_contenders_greedy_answers_are_compared_token_for_token_with_the_verifier_alones() -> None:
    """Lossless speculative decoding answers greedily as the verifier alone does: the bake-off counts the
    first round's answers that are identical token for token (a failed request is not compared)."""
    from typing import cast

    from eagle3_pipeline.serving.vllm_server import VllmServer
    from eagle3_pipeline.stages.evaluate.bakeoff import lossless
    from eagle3_pipeline.stages.evaluate.rounds import Arm

    server = cast(VllmServer, None)
    alone, draft = Arm(NONE, server, False), Arm("eagle3", server, True)
    alone.answers[8] = [[1, 2, 3], [4, 5], None, [7]]
    draft.answers[8] = [[1, 2, 3], [4, 6], [9], [7]]
    assert lossless(alone, draft) == (3, 2)  # the third failed alone: not compared; the second differs
    assert lossless(alone, Arm("ngram", server, True)) == (0, 0)  # nothing answered: nothing compared


@pytest.mark.vllm
def test_suffix_is_refused_before_any_server_starts_where_vllm_lacks_arctic_inference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This project's vLLM CPU environment has no arctic-inference (vLLM's suffix decoding): a bake-off
    naming suffix stops at once, saying what is missing and the ways on, before any server starts."""
    from eagle3_pipeline.serving.vllm_server import has_package
    from eagle3_pipeline.stages.evaluate.bakeoff import refuse_unservable
    from tests.pipeline.test_evaluate_sweep import context
    from tests.pipeline.test_vllm_server import vllm_or_skip

    monkeypatch.setenv("EAGLE3_VLLM", vllm_or_skip())
    assert has_package("vllm") and not has_package("arctic_inference")
    ctx = context(tmp_path)
    refuse_unservable(ctx)  # no suffix: nothing to refuse
    with_suffix = ctx.params.model_copy(update={"rivals": (CandidateMethod.NGRAM, CandidateMethod.SUFFIX)})
    with pytest.raises(StageError, match=r"draft.candidates suffix needs the arctic-inference package"):
        refuse_unservable(dataclasses.replace(ctx, params=with_suffix))

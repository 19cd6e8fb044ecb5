"""draft.candidates' bake-off: every trained candidate, every training-free rival and the verifier alone,
served side by side and measured in paired rounds; which draft ships, and whether any should.

The contenders are each trained candidate's best checkpoint (by its validation loss; train's best when one
method is trained), each training-free rival of draft.candidates (`ngram`, vLLM's prompt lookup; `suffix`,
vLLM's suffix decoding) and `none`, the verifier alone, which is always in the comparison. Their servers are
up together (on an accelerator, where one server's weights and KV cache leave no room for another, each in
turn: `eagle3_pipeline.stages.evaluate.rounds`) and answer the same kept held-out prompts, CONCURRENCY in
flight, in evaluation.rounds rounds, the order rotating each round. The servers are evaluate's
(`eagle3_pipeline.stages.evaluate.servers`): `none` is the server evaluate measured the verifier alone on,
and the chosen candidate's stays up (where servers can be up together) for evaluate to measure in full.
Each contender's first-round greedy answers are compared token for token with the verifier alone's
(`outputsMatchingAlone` of `outputsCompared`): speculative decoding is lossless, up to numerics.

`decide` (pure) reads the rounds' output tokens/s: a trained draft is eligible only if its paired
comparison with every rival (`none` included) lies above 1 (eagle3_contract.api.comparison). No eligible
draft: `rivalNotBeaten`, the gate fails (eagle3_contract.gate) and the previous draft keeps serving. One:
it ships. Several: the fastest by median ships only if it beats each of the others with its interval clear
(`better`); otherwise they are `notDistinguishable` and draft.method ships (the run's own choice, the safe
default). The result's `checkpointSelection` names the rival the shipped draft beat by the least, and by how
much, with the interval.
"""

from __future__ import annotations

import logging
import math
import shutil
import statistics
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_contract.api.comparison import DEFAULT_ROUNDS, Comparison, Verdict, compare_rounds
from eagle3_contract.estimates import BAKE_OFF_ROUND_PROMPTS
from eagle3_contract.params import EvaluateParams, EvaluateTuning
from eagle3_contract.results import (
    BETTER,
    NOT_DISTINGUISHABLE,
    OUTPUT_TOKENS_PER_SECOND,
    RIVAL_NOT_BEATEN,
)
from eagle3_contract.vllm_command import draft_speculative_config, training_free_speculative_config
from eagle3_pipeline.data.draft_checkpoint import checkpoint_method, write_serving_checkpoint
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.requests import CONCURRENCY, Message
from eagle3_pipeline.serving.spec_metrics import Acceptance
from eagle3_pipeline.serving.vllm_server import VllmServer, find_vllm, has_package
from eagle3_pipeline.stages.evaluate.checkpoints import Candidate
from eagle3_pipeline.stages.evaluate.rounds import Arm, interleave, interleave_settled, long_enough, warm
from eagle3_pipeline.stages.evaluate.servers import ALONE, ServerPool, draft_key, rival_key

logger = logging.getLogger(__name__)

Context = StageContext[EvaluateParams, EvaluateTuning]

NONE = "none"  # the verifier alone: a rival of every bake-off
ROUND_PROMPTS = BAKE_OFF_ROUND_PROMPTS  # the kept prompts a round answers (fewer when fewer are kept)


@dataclass(frozen=True)
class Versus:
    """`method` over `rival`, round by round."""

    method: str
    rival: str
    comparison: Comparison

    def document(self) -> dict[str, Any]:
        return {"method": self.method, "rival": self.rival, "comparison": _dumped(self.comparison)}


@dataclass(frozen=True)
class Decision:
    """The trained draft measured in full (the one that ships, or the best when none may), and why."""

    shipped: str
    verdict: str
    decided_by: Versus | None
    runner_up: Versus | None = None


def decide(
    speeds: Mapping[str, Sequence[float | None]], trained: Sequence[str], rivals: Sequence[str], default: str
) -> Decision:
    """The bake-off's verdict from each contender's per-round tokens/s (see the module doc)."""

    def versus(method: str, rival: str) -> Versus | None:
        comparison = compare_rounds(speeds[rival], speeds[method])
        return Versus(method, rival, comparison) if comparison is not None else None

    against = {t: [versus(t, r) for r in rivals] for t in trained}
    eligible = [
        t
        for t in trained
        if all(v is not None and v.comparison.verdict() is Verdict.BETTER for v in against[t])
    ]

    def closest(method: str) -> Versus | None:
        """The rival comparison with the lowest median ratio (a rival never measured counts lowest)."""
        measured = [v for v in against[method] if v is not None]
        if len(measured) < len(against[method]):
            return None
        return min(measured, key=lambda v: v.comparison.ratio, default=None)

    by_speed = sorted(trained, key=lambda t: -_median(speeds[t]))
    if not eligible:
        best = by_speed[0]
        return Decision(best, RIVAL_NOT_BEATEN, closest(best))
    best = next(t for t in by_speed if t in eligible)
    others = [versus(best, o) for o in eligible if o != best]
    if not others:
        return Decision(best, BETTER, closest(best))
    runner = min((v for v in others if v is not None), key=lambda v: v.comparison.ratio, default=None)
    if all(v is not None and v.comparison.verdict() is Verdict.BETTER for v in others):
        return Decision(best, BETTER, closest(best), runner)
    shipped = default if default in eligible else eligible[0]
    return Decision(shipped, NOT_DISTINGUISHABLE, closest(shipped), runner)


def settled(decision: Decision) -> bool:
    """Whether the rounds decided cleanly: a draft better than every rival (and the others), no comparison
    behind it noisy. Else the bake-off runs its rounds again once (`interleave_settled`)."""
    shown = [v for v in (decision.decided_by, decision.runner_up) if v is not None]
    return decision.verdict == BETTER and not any(v.comparison.noisy for v in shown)


def _median(values: Sequence[float | None]) -> float:
    measured = [v for v in values if v]
    return statistics.median(measured) if measured else -math.inf


def _dumped(comparison: Comparison | None) -> dict[str, Any] | None:
    return comparison.model_dump(mode="json", by_alias=True) if comparison is not None else None


def bake_off_prompts(params: EvaluateParams, kept: int, trained: int) -> int:
    """The prompts the bake-off answers (0 without draft.candidates): every contender's rounds."""
    if params.checkpoints_to_evaluate or not (trained or params.rivals):
        return 0
    contenders = 1 + max(trained, 1) + len(params.rivals or ())
    return contenders * (params.rounds or DEFAULT_ROUNDS) * min(kept, ROUND_PROMPTS)


# --- the servers ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contender:
    """One server of the bake-off: a trained candidate (its slim serving copy), a rival, or `none`."""

    name: str
    key: str  # its server's in evaluate's pool (eagle3_pipeline.stages.evaluate.servers)
    config: dict[str, Any] | None
    candidate: Candidate | None = None


def contenders(ctx: Context, train: Path, trained: Sequence[Candidate]) -> list[Contender]:
    """The trained candidates (each's slim serving copy written), the rivals, and the verifier alone."""
    k = ctx.params.num_speculative_tokens
    out = [Contender(NONE, ALONE, None)]
    for c in trained:
        slim = write_serving_checkpoint(
            c.path(train), ctx.work / f"bakeoff-{c.method}", ctx.params.verifier.model
        )
        config = draft_speculative_config(str(slim.path), k, checkpoint_method(slim.path))
        out.append(Contender(str(c.method), draft_key(c.path(train), k), config, c))
    out += [
        Contender(r.value, rival_key(r.value, k), training_free_speculative_config(r.value, k))
        for r in ctx.params.rivals or ()
    ]
    return out


def measure(
    ctx: Context,
    pool: ServerPool,
    kept: list[list[Message]],
    entrants: Sequence[Contender],
    judge: Callable[[list[Arm]], Decision],
) -> list[Arm]:
    """Every contender's rounds: servers up together, the rounds doubled once when `judge`'s decision is not
    settled; on an accelerator, one server at a time. The verifier alone is evaluate's own server, warm."""
    prompts = {CONCURRENCY: kept[:ROUND_PROMPTS]}
    rounds, max_tokens, progress = ctx.params.rounds or DEFAULT_ROUNDS, ctx.params.max_tokens, ctx.progress
    arms: list[Arm] = []
    with ExitStack() as stack:
        for entrant in entrants:
            server = stack.enter_context(serve(pool, entrant))
            arms.append(Arm(entrant.name, server, counted=entrant.config is not None))
            if not pool.together:
                interleave(arms[-1:], prompts, rounds, max_tokens, progress)
                stack.close()  # one server at a time
        if pool.together:
            for arm in arms:
                warm(arm.server, prompts)
            longer = long_enough(arms[0].server, prompts, max_tokens)
            if progress is not None:
                progress.grow_total(
                    len(arms) * rounds * (len(longer[CONCURRENCY]) - len(prompts[CONCURRENCY]))
                )
            check = lambda: settled(judge(arms))  # noqa: E731
            interleave_settled(arms, longer, rounds, max_tokens, progress, check, warmed=True)
    return arms


def serve(pool: ServerPool, entrant: Contender) -> AbstractContextManager[VllmServer]:
    """The contender's server; a rival's stops after the bake-off, the verifier alone and the trained
    candidates stay up (evaluate measures the chosen one in full next)."""
    log = f"vllm-bakeoff-{entrant.name}.log"
    keep = entrant.name == NONE or entrant.candidate is not None
    return pool.serve(entrant.key, entrant.config, log, keep=keep)


def bake_off(
    ctx: Context,
    pool: ServerPool,
    kept: list[list[Message]],
    train: Path,
    trained: Sequence[Candidate],
    default: str,
) -> tuple[Candidate, dict[str, Any]]:
    """Measure the contenders, decide, and the result's `checkpointSelection`; the trained candidate to
    measure in full (the one that ships, or the best when none may), its server still up in `pool`."""
    refuse_unservable(ctx)
    entrants = contenders(ctx, train, trained)
    names = [str(c.method) for c in trained]
    rivals = [e.name for e in entrants if e.candidate is None]

    def judge(arms: list[Arm]) -> Decision:
        return decide({a.name: a.speeds[CONCURRENCY] for a in arms}, names, rivals, default)

    try:
        arms = {a.name: a for a in measure(ctx, pool, kept, entrants, judge)}
    finally:
        for entrant in entrants:
            if entrant.candidate is not None:
                shutil.rmtree(ctx.work / f"bakeoff-{entrant.name}", ignore_errors=True)
    decision = judge(list(arms.values()))
    chosen = next(c for c in trained if str(c.method) == decision.shipped)
    for entrant in entrants:
        if entrant.candidate is not None and entrant.candidate is not chosen:
            pool.release(entrant.key)
    document = choice_document(arms, trained, chosen, decision)
    logger.info("evaluate: bake-off: %s", _line(document))
    return chosen, document


def refuse_unservable(ctx: Context) -> None:
    """draft.candidates suffix where vLLM's environment lacks arctic-inference (vLLM's suffix decoding is
    its): a StageError that says so before any server starts. The CPU environment and image of this project
    do not carry it (it builds from source, and its vLLM plugin wants CUDA); vLLM 0.32 CPU serves `suffix`
    with arctic-inference 0.3.0 built beside it (scripts/build-vllm-suffix.sh; the bake-off test of
    tests/pipeline/test_main_job.py, docs/benchmarks.md)."""
    if "suffix" in (r.value for r in ctx.params.rivals or ()) and not has_package("arctic_inference"):
        raise StageError(
            "draft.candidates suffix needs the arctic-inference package in vLLM's environment, and this vLLM "
            f"({find_vllm()}) has none: remove suffix from draft.candidates, or install "
            "arctic-inference==0.3.0 beside vLLM (in a checkout, `bash scripts/build-vllm-suffix.sh` "
            "builds one and prints its vllm, for --vllm; leave ARCTIC_INFERENCE_ENABLED unset on a CPU: "
            "its plugin wants CUDA)"
        )


def choice_document(
    arms: Mapping[str, Arm], trained: Sequence[Candidate], chosen: Candidate, decision: Decision
) -> dict[str, Any]:
    """The result's `checkpointSelection` (eagle3_contract.results.CheckpointChoice) of a bake-off."""
    alone = arms[NONE].speeds[CONCURRENCY]
    names = {str(c.method) for c in trained}

    def figures(name: str) -> dict[str, Any]:
        arm = arms[name]
        counters = arm.counted_total()
        acceptance = (
            Acceptance.from_counters(counters) if counters is not None and counters.drafts > 0 else None
        )
        speed = arm.speed(CONCURRENCY)
        vs_alone = compare_rounds(alone, arm.speeds[CONCURRENCY]) if name != NONE else None
        compared, matching = lossless(arms[NONE], arm) if name != NONE else (None, None)
        return {
            "acceptanceLength": round(acceptance.length, 6) if acceptance is not None else None,
            "acceptanceRate": round(acceptance.rate, 6) if acceptance is not None else None,
            "outputTokensPerSecond": round(speed, 3) if speed else None,
            "comparison": _dumped(vs_alone),
            "rounds": [round(v, 3) if v else None for v in arm.speeds[CONCURRENCY]],
            "outputsCompared": compared,
            "outputsMatchingAlone": matching,
        }

    return {
        "by": OUTPUT_TOKENS_PER_SECOND,
        "epoch": chosen.epoch,
        "checkpoint": chosen.checkpoint,
        "valLossEpoch": None,
        "checkpoints": [
            {"epoch": c.epoch, "checkpoint": c.checkpoint, "method": str(c.method), "valLoss": c.val_loss}
            | figures(str(c.method))
            for c in trained
        ],
        "rivals": [{"method": name} | figures(name) for name in arms if name not in names],
        "verdict": decision.verdict,
        "decidedBy": decision.decided_by.document() if decision.decided_by is not None else None,
        "runnerUp": decision.runner_up.document() if decision.runner_up is not None else None,
    }


def lossless(alone: Arm, arm: Arm) -> tuple[int, int]:
    """Of `arm`'s first-round greedy answers, how many were compared with the verifier alone's (both
    answered) and how many of those are identical token for token."""
    pairs = [
        (a, b)
        for a, b in zip(alone.answers.get(CONCURRENCY, []), arm.answers.get(CONCURRENCY, []), strict=False)
        if a is not None and b is not None
    ]
    return len(pairs), sum(1 for a, b in pairs if a == b)


def _line(document: dict[str, Any]) -> str:
    from eagle3_contract.results import CheckpointChoice

    return CheckpointChoice.model_validate(document).bake_off_text()

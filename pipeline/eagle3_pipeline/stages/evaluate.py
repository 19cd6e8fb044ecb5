"""evaluate: the draft's acceptance in vLLM, with the verifier, on held-out prompts; the gate's input.

The prompts are the first `evaluation.prompts` validation conversations of the data stage (`generate`'s
when it ran, else `prepare`'s), each up to its first assistant turn. The stage writes train's best checkpoint
in the shape export ships (`eagle3_pipeline.draft_checkpoint`: no embedding copy, bf16, the verifier as the
spec names it) and serves the verifier with it as an Eagle-3 draft, then serves the verifier alone; both
answer every prompt greedily (temperature 0, at most evaluation.maxTokens new tokens, CONCURRENCY requests in
flight). With `evaluation.sampling` set (the serving traffic's temperature, topP, topK), the draft server
answers the same prompts a second time with those settings (vLLM's SamplingParams in the OpenAI requests,
seeded by sampling.seed), and the result's `sampled` holds that measurement's acceptance: the figure the live
acceptance alert compares sampled traffic with (acceptance falls with the temperature). The gate reads the
greedy figures only.

The draft server's speculative-decoding counters (`eagle3_pipeline.spec_metrics`), read from `/metrics` before
and after the requests, give the acceptance rate, the mean acceptance length (tokens per verifier step) and
the acceptance by draft position; the two runs give output tokens per second and the speedup. At temperature 0
speculative decoding is lossless up to numerics: `outputsMatchingBaseline` counts the prompts whose answer
with the draft is the verifier's own.

The result holds figures, not a verdict: the gate (`eagle3_contract.gate.judge_evaluation`) is judged by the
operator and `eagle3 run` from `acceptanceLength` and `mappingConsistent` against the spec's current
`evaluation.minAcceptanceLength` (not part of the stage's content hash), and they stop before export when it
fails; the stage succeeds either way. `message` notes what the figures do not say (fewer prompts than asked
for, failed requests, a mapping problem, embeddings of another verifier), or is null. A draft whose mapping
is broken fails the gate whatever its speed, so the verifier is not served alone for it (the baseline
figures are null); one whose d2t points outside the verifier's vocabulary cannot be served at all: a
StageError. The result also says whether the draft's copy of the verifier's embeddings is the
verifier's own (`embeddingsMatchVerifier`: a draft trained for another version of the verifier). The work
directory keeps the vLLM logs; the slim draft is deleted after the run (export writes the one that ships).
Progress: prompts answered, by the draft server (greedy, then sampled) and then by the verifier alone
(failed requests included, and counted as failures), and their output tokens.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_contract.api.spec import Sampling
from eagle3_contract.params import EvaluateParams, EvaluateTuning
from eagle3_contract.stages import Stage
from eagle3_contract.vllm_command import eagle3_speculative_config
from eagle3_pipeline.context import StageContext
from eagle3_pipeline.draft_checkpoint import (
    best_checkpoint,
    foreign_embeddings,
    mapping_problem,
    read_config,
    target_vocab_size,
    unservable_mapping,
    write_serving_checkpoint,
)
from eagle3_pipeline.errors import StageError
from eagle3_pipeline.evaluate_requests import (
    Measurement,
    Message,
    answer_all,
    read_counters,
    settled_counters,
)
from eagle3_pipeline.spec_metrics import Acceptance, SpecDecodeCounters, consistency_problems
from eagle3_pipeline.vllm_server import VllmServer

logger = logging.getLogger(__name__)

CONVERSATIONS_FILE = "conversations.jsonl"
DRAFT_DIR = "draft"
FAILED_EXAMPLES = 3


Context = StageContext[EvaluateParams, EvaluateTuning]


def run(ctx: Context) -> dict[str, Any]:
    started = time.monotonic()
    prompts, held_out = held_out_prompts(ctx.data_input() / CONVERSATIONS_FILE, ctx.params.prompts)
    source = best_checkpoint(ctx.input(Stage.TRAIN))
    vocab = target_vocab_size(read_config(source))
    slim = write_serving_checkpoint(source, ctx.work / DRAFT_DIR, ctx.params.verifier.model)
    d2t, t2d = slim.weights.tensors.get("d2t"), slim.weights.tensors.get("t2d")
    unservable = unservable_mapping(d2t, vocab)
    if unservable:
        raise StageError(
            f"the draft {source} cannot be served: {unservable}; its mapping is corrupt: re-run stages "
            "vocab and train"
        )
    problem = mapping_problem(d2t, t2d, vocab)
    foreign = foreign_embeddings(source, ctx.local_path(ctx.params.verifier.model))
    passes = (2 if problem is None else 1) + (1 if ctx.params.sampling is not None else 0)
    ctx.progress.begin("prompts", len(prompts) * passes)  # with the draft (greedy, sampled), then without
    with_draft = measure(ctx, prompts, slim.path)
    shutil.rmtree(slim.path, ignore_errors=True)
    # a draft with a broken mapping fails the gate whatever its speed: no need to serve the verifier alone
    baseline = measure(ctx, prompts, None) if problem is None else None
    ev = Evaluation(prompts, held_out, with_draft, baseline, problem, source, foreign)
    result = summarize(ctx, ev)
    return result | {"seconds": round(time.monotonic() - started, 3)}


# --- prompts ------------------------------------------------------------------------------------------------


def prompt_of(messages: list[dict[str, Any]]) -> list[Message] | None:
    """The conversation up to its first assistant turn (role and content only); None if it has no user turn
    to answer there."""
    prompt: list[Message] = []
    for message in messages:
        if message.get("role") == "assistant":
            break
        prompt.append({"role": str(message.get("role")), "content": str(message.get("content", ""))})
    if not prompt or prompt[-1]["role"] != "user":
        return None
    return prompt


def held_out_prompts(path: Path, wanted: int) -> tuple[list[list[Message]], int]:
    """Up to `wanted` prompts from the validation rows of `path`, in file order, and how many there are."""
    from eagle3_pipeline.prepared import VAL
    from eagle3_pipeline.stages.generate import read_input

    rows = [row for row in read_input(path) if row.get("split") == VAL]
    prompts = [p for p in (prompt_of(row.get("messages") or []) for row in rows) if p is not None]
    if not prompts:
        raise StageError(
            f"{path} has no validation conversation with a user turn to answer ({len(rows)} validation "
            "rows): evaluation needs held-out prompts; set dataset.validationFraction above 0"
        )
    if len(prompts) < wanted:
        logger.warning("only %d held-out prompts for evaluation.prompts %d", len(prompts), wanted)
    return prompts[:wanted], len(prompts)


# --- one server: the runs over the prompts ---------------------------------------------------------------


def measure(ctx: Context, prompts: list[list[Message]], draft: Path | None) -> Measurement:
    """Serve the verifier (with `draft` when given), answer every prompt, and read the counters around it;
    with a draft and evaluation.sampling, answer them again with those settings on the same server."""
    label = "draft" if draft is not None else "baseline"
    # the serving Deployment's speculative config (eagle3_contract.vllm_command), with the slim draft
    k = ctx.params.num_speculative_tokens
    config = None if draft is None else eagle3_speculative_config(str(draft), k)
    engine = ctx.params.verifier.engine(ctx.tuning.tensor_parallel_size)
    log = ctx.work / f"vllm-{label}.log"
    sampling = ctx.params.sampling if draft is not None else None
    with VllmServer(ctx, engine, seed=ctx.tuning.seed, speculative_config=config, log_path=log) as server:
        result = counted_run(ctx, server, prompts, None, counted=draft is not None)
        result.server_start_s = server.started_s
        server.check()
        checked(ctx, result, label, len(prompts))
        if sampling is not None:
            result.sampled = counted_run(ctx, server, prompts, sampling, counted=True)
            server.check()
            checked(ctx, result.sampled, f"{label} (sampled)", len(prompts))
    return result


def counted_run(
    ctx: Context, server: VllmServer, prompts: list[list[Message]], sampling: Sampling | None, counted: bool
) -> Measurement:
    """Every prompt answered once (greedy when `sampling` is None); `counted`: with the spec-decode counters'
    difference over the run."""
    before = read_counters(server) if counted else None
    result = asyncio.run(answer_all(server, prompts, ctx.params.max_tokens, ctx.progress, sampling))
    if counted:
        after = settled_counters(server, before, result.output_tokens)
        result.counters = after - before if before is not None else after
    return result


def checked(ctx: Context, result: Measurement, label: str, prompts: int) -> None:
    """Log the run; a run where every request failed measured nothing: a StageError."""
    tokens, seconds = result.output_tokens, result.seconds
    logger.info("%s: %d prompts, %d output tokens in %.1f s", label, prompts, tokens, seconds)
    if len(result.failures) == prompts:
        log = ctx.work / f"vllm-{label.split()[0]}.log"
        raise StageError(
            f"every request to the {label} server failed, e.g. {result.failures[0]} (log: {log})"
        )


# --- the result ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    prompts: list[list[Message]]
    held_out: int
    draft: Measurement
    baseline: Measurement | None  # None when the draft's mapping is broken
    mapping_problem: str | None
    source: Path
    foreign_embeddings: str | None = None


def acceptance_of(run: Measurement, k: int) -> tuple[SpecDecodeCounters, Acceptance]:
    """The counters of a draft server's run and the acceptance they give; StageError when they cannot."""
    counters = run.counters
    assert counters is not None  # measure() sets them for a draft server
    problems = consistency_problems(counters, k)
    if problems:
        raise StageError(f"vLLM's speculative-decoding counters contradict each other: {'; '.join(problems)}")
    try:
        return counters, Acceptance.from_counters(counters)
    except ValueError as exc:
        raise StageError(f"the draft was never asked for tokens: {exc}; are all answers 1 token?") from None


def sampled_figures(ctx: Context, ev: Evaluation) -> dict[str, Any] | None:
    """The acceptance at evaluation.sampling (`sampled`), or None when only greedy was measured."""
    sampling, run = ctx.params.sampling, ev.draft.sampled
    if sampling is None or run is None:
        return None
    counters, acceptance = acceptance_of(run, ctx.params.num_speculative_tokens)
    return {
        "temperature": sampling.temperature,
        "topP": sampling.top_p,
        "topK": sampling.top_k,
        "seed": sampling.seed,
        "prompts": len(ev.prompts),
        "drafts": int(counters.drafts),
        "draftTokens": int(counters.draft_tokens),
        "acceptedTokens": int(counters.accepted),
        "acceptanceRate": round(acceptance.rate, 6),
        "acceptanceLength": round(acceptance.length, 6),
        "acceptanceByPosition": [round(a, 6) for a in acceptance.by_position],
    }


def summarize(ctx: Context, ev: Evaluation) -> dict[str, Any]:
    k = ctx.params.num_speculative_tokens
    counters, acceptance = acceptance_of(ev.draft, k)
    base = ev.baseline
    speed, base_speed = ev.draft.tokens_per_second, base.tokens_per_second if base else None
    return {
        "prompts": len(ev.prompts),
        "promptsRequested": ctx.params.prompts,
        "heldOutPrompts": ev.held_out,
        "failedPrompts": len(failures(ev)),
        "numSpeculativeTokens": k,
        "maxTokens": ctx.params.max_tokens,
        "drafts": int(counters.drafts),
        "draftTokens": int(counters.draft_tokens),
        "acceptedTokens": int(counters.accepted),
        "acceptedTokensByPosition": [int(a) for a in counters.accepted_per_position],
        "acceptanceRate": round(acceptance.rate, 6),
        "acceptanceLength": round(acceptance.length, 6),
        "acceptanceByPosition": [round(a, 6) for a in acceptance.by_position],
        "outputTokens": ev.draft.output_tokens,
        "outputTokensPerSecond": round(speed, 2) if speed else None,
        "baselineOutputTokens": base.output_tokens if base else None,
        "baselineOutputTokensPerSecond": round(base_speed, 2) if base_speed else None,
        "speedup": round(speed / base_speed, 4) if speed and base_speed else None,
        "outputsMatchingBaseline": matching(ev.draft.outputs, base.outputs) if base else None,
        "message": "; ".join(notes(ctx, ev)) or None,
        "mappingConsistent": ev.mapping_problem is None,
        "embeddingsMatchVerifier": ev.foreign_embeddings is None,
        "draftCheckpoint": relative_to(ev.source, ctx.artifacts),
        "serverStartSeconds": {
            "draft": round(ev.draft.server_start_s, 1),
            "baseline": round(base.server_start_s, 1) if base else None,
        },
        "sampled": sampled_figures(ctx, ev),
    }


def relative_to(path: Path, root: Path) -> str:
    """`path` relative to the artifacts root where it lies there (as the cluster volume names it)."""
    try:
        return str(path.relative_to(root.resolve()))
    except ValueError:
        return str(path)


def failures(ev: Evaluation) -> list[str]:
    sampled = ev.draft.sampled
    return (
        ev.draft.failures
        + (sampled.failures if sampled else [])
        + (ev.baseline.failures if ev.baseline else [])
    )


def matching(outputs: list[str | None], baseline: list[str | None]) -> int:
    return sum(1 for a, b in zip(outputs, baseline, strict=True) if a is not None and a == b)


def notes(ctx: Context, ev: Evaluation) -> list[str]:
    """What the result's figures do not say; the gate's verdict is not among them (eagle3_contract.gate)."""
    evaluation = ctx.params
    out: list[str] = []
    if ev.mapping_problem is not None:
        out.append(
            f"the draft's d2t and t2d disagree ({ev.mapping_problem}): its proposals land on the wrong "
            "tokens; re-run stages vocab and train (the verifier was not measured alone)"
        )
    if ev.foreign_embeddings is not None:
        out.append(
            f"{ev.foreign_embeddings}: the draft was trained for another version of verifier.model "
            f"{ctx.params.verifier.model}; re-run the pipeline from extract for this verifier"
        )
    if len(ev.prompts) < evaluation.prompts:
        out.append(
            f"measured on {len(ev.prompts)} held-out prompts, fewer than evaluation.prompts "
            f"{evaluation.prompts} (the validation split has no more)"
        )
    failed = failures(ev)
    if failed:
        out.append(f"{len(failed)} requests failed, e.g. {'; '.join(failed[:FAILED_EXAMPLES])}")
    return out

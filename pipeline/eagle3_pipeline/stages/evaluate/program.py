"""evaluate: the draft's acceptance in vLLM, with the verifier, on held-out prompts; the gate's input.

The prompts are the first `evaluation.prompts` validation conversations of the data stage (`generate`'s
when it ran, else `prepare`'s), each up to its first assistant turn, sent as chat messages that vLLM renders
with the verifier's chat template (`eagle3_pipeline.stages.evaluate.prompts`). The stage writes train's best
checkpoint in the shape export ships (`eagle3_pipeline.data.draft_checkpoint`: no embedding copy, bf16, the
verifier as the spec names it). It serves the verifier alone first: it answers every prompt greedily
(temperature 0, at most evaluation.maxTokens new tokens, CONCURRENCY requests in flight), and those answers
are screened (`eagle3_pipeline.serving.degenerate`): a prompt answered with a repetition loop or nothing
visible would inflate the acceptance, so it is left out (`degeneratePrompts`, `degenerate` by reason,
`degenerateExamples`; when some are, the verifier answers the kept prompts again for its timing). Then it
serves the verifier with the draft, which answers the kept prompts only, so that its counters see nothing
else (every prompt degenerate: no draft server, and the acceptance is null). With `evaluation.sampling` set
(the serving traffic's temperature, topP, topK), the draft server answers the kept prompts a second time
with those settings (vLLM's SamplingParams in the OpenAI requests,
seeded by sampling.seed), and the result's `sampled` holds that measurement's acceptance: the figure the live
acceptance alert compares sampled traffic with (acceptance falls with the temperature). The gate reads the
greedy figures only.

The draft server's speculative-decoding counters (`eagle3_pipeline.serving.spec_metrics`), read from
`/metrics` before and after the requests, give the acceptance rate, the mean acceptance length (tokens per
verifier step) and the acceptance by draft position; the two runs give output tokens per second and the
speedup. At temperature 0 speculative decoding is lossless up to numerics: `outputsMatchingBaseline` counts
the prompts whose answer with the draft is the verifier's own.

The result holds figures, not a verdict: the gate (`eagle3_contract.gate.judge_evaluation`) is judged by the
operator and `eagle3 run` from `acceptanceLength` and `mappingConsistent` against the spec's current
`evaluation.minAcceptanceLength` (not part of the stage's content hash), and they stop before export when it
fails; the stage succeeds either way. `message` notes what the figures do not say (fewer prompts than asked
for, failed requests, a mapping problem, embeddings of another verifier), or is null. A draft whose mapping
is broken fails the gate whatever its speed, so the verifier is not served alone for it (the baseline
figures are null; the draft server's own greedy answers are screened); one whose d2t points outside the
verifier's vocabulary cannot be served at all: a StageError. The result also says whether the draft's copy
of the verifier's embeddings is the verifier's own (`embeddingsMatchVerifier`: a draft trained for another
version of the verifier). The work directory keeps the vLLM logs and the screened answers (`answers.jsonl`);
the slim draft is deleted after the run (export writes the one that ships).
With `evaluation.sweep`, the result's `speculation` is the speculation-length table
(`eagle3_pipeline.stages.evaluate.sweep`): after the draft server's runs (before the slim draft is deleted),
the verifier alone and a server per k, up together, take turns in evaluation.rounds paired rounds.
A configuration served again (the verifier alone for the sweep and the bake-off, the draft at evaluation's
k for the sweep, the bake-off's chosen candidate for the full measurement) is the same warm server
(`eagle3_pipeline.stages.evaluate.servers`).
With training.checkpointSelection acceptance (the param `checkpointsToEvaluate`), the draft measured is not
train's best by validation loss: after the verifier alone, a server per each of train's last epochs answers
the kept prompts greedily, and the most accepted epoch (eagle3_pipeline.stages.evaluate.checkpoints) is the
one measured in full (its greedy run reused when there is nothing more to measure) and named in the
result's `checkpointSelection` with every epoch's figures; export ships it.
With more than one category among the held-out prompts, the result's `categories` holds the acceptance
and speedup per category (eagle3_pipeline.stages.evaluate.categories): each server answers each category's
kept prompts as a run of its own after its main runs.
Progress: prompts answered, by the verifier alone and then by the draft server (greedy, then sampled)
(failed requests included, and counted as failures), and their output tokens; the sweep's and the
categories' runs too.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_contract.params import EvaluateParams, EvaluateTuning
from eagle3_contract.results import CheckpointChoice
from eagle3_contract.stages import Stage
from eagle3_contract.vllm_command import draft_speculative_config
from eagle3_pipeline.data.draft_checkpoint import (
    SlimCheckpoint,
    best_checkpoint,
    checkpoint_method,
    foreign_embeddings,
    mapping_problem,
    read_config,
    target_vocab_size,
    unservable_mapping,
    write_serving_checkpoint,
)
from eagle3_pipeline.runtime.context import StageContext, read_result
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.degenerate import Screening, screen
from eagle3_pipeline.serving.requests import (
    Measurement,
    Message,
    answer_all,
)
from eagle3_pipeline.serving.vllm_server import VllmServer
from eagle3_pipeline.stages.evaluate.bakeoff import bake_off, bake_off_prompts
from eagle3_pipeline.stages.evaluate.categories import CategoryRuns
from eagle3_pipeline.stages.evaluate.checkpoints import (
    Candidate,
    Measured,
    candidates,
    choice_document,
    choose,
    trained_candidates,
)
from eagle3_pipeline.stages.evaluate.incumbent import incumbent_dir, measure_incumbent
from eagle3_pipeline.stages.evaluate.prompts import (
    answered,
    held_out_prompts,
    write_answers,
)
from eagle3_pipeline.stages.evaluate.runs import counted_run
from eagle3_pipeline.stages.evaluate.servers import ALONE, ServerPool, draft_key
from eagle3_pipeline.stages.evaluate.summary import Evaluation, acceptance_of, summarize, with_sweep
from eagle3_pipeline.stages.evaluate.sweep import SpeculationSweep, prompts_wanted

logger = logging.getLogger(__name__)

CONVERSATIONS_FILE = "conversations.jsonl"
DRAFT_DIR = "draft"
ANSWERS_FILE = "answers.jsonl"


Context = StageContext[EvaluateParams, EvaluateTuning]


def run(ctx: Context) -> dict[str, Any]:
    started = time.monotonic()
    wanted = max(ctx.params.prompts, prompts_wanted(ctx.params))  # evaluation.sweep's cells may want more
    held = held_out_prompts(ctx.data_input() / CONVERSATIONS_FILE, wanted)
    available = held.prompts
    prompts = available[: ctx.params.prompts]
    train = ctx.input(Stage.TRAIN)
    source = best_checkpoint(train)
    if ctx.params.incumbent is not None:  # a wrong path fails before any server starts
        incumbent_dir(ctx, ctx.params.incumbent)
    # training.checkpointSelection acceptance: the last epochs; draft.candidates: each method's best
    choosing = candidates(train, ctx.params.checkpoints_to_evaluate or 0) or trained_candidates(train)
    vocab = target_vocab_size(read_config(source))
    draft = Drafted(source, write_serving_checkpoint(source, ctx.work / DRAFT_DIR, ctx.params.verifier.model))
    d2t, t2d = draft.slim.weights.tensors.get("d2t"), draft.slim.weights.tensors.get("t2d")
    unservable = unservable_mapping(d2t, vocab)
    if unservable:
        raise StageError(
            f"the draft {source} cannot be served: {unservable}; its mapping is corrupt: re-run stages "
            "vocab and train"
        )
    problem = mapping_problem(d2t, t2d, vocab)
    foreign = foreign_embeddings(source, ctx.local_path(ctx.params.verifier.model))
    passes = (2 if problem is None else 1) + (1 if ctx.params.sampling is not None else 0)
    # evaluation.sweep: not for a draft whose mapping is broken (it fails the gate whatever its speed)
    sweep = SpeculationSweep.of(ctx, available) if problem is None else None
    swept = sweep.total_prompts if sweep is not None else 0
    cats = CategoryRuns.of(ctx, held, len(prompts)) if problem is None else None  # evaluation.categories
    swept += cats.total(range(len(prompts))) if cats is not None else 0
    ctx.progress.begin("prompts", len(prompts) * passes + swept)
    with ServerPool(ctx) as pool:  # a configuration served again is the same warm server
        incumbent = None
        if problem is None:
            baseline, with_draft = measured(ctx, pool, prompts, draft, sweep, (train, choosing), cats)
            screening = screening_of(baseline)
            if ctx.params.incumbent is not None and with_draft is not None:
                length = acceptance_of(with_draft, ctx.params.num_speculative_tokens)[1].length
                incumbent = measure_incumbent(ctx, pool, prompts, screening.kept, cats, length)
        else:
            # a broken mapping fails the gate whatever its speed: no need to serve the verifier alone; the
            # draft server's greedy answers (the verifier's own, up to numerics) screen the prompts
            baseline, with_draft = None, measure(ctx, pool, prompts, draft.slim.path, source=draft.source)
            screening = screening_of(with_draft)
            ctx.progress.set_total(answered(len(prompts), len(screening.kept), passes))
    shutil.rmtree(draft.slim.path, ignore_errors=True)
    write_answers(ctx.work / ANSWERS_FILE, held, screening, baseline or with_draft)
    ev = Evaluation(
        prompts, held.available, with_draft, baseline, problem, draft.source, foreign, screening, held
    )
    result = with_sweep(summarize(ctx, ev), sweep if with_draft is not None else None)
    result["checkpointSelection"] = draft.chosen  # None: train's best by validation loss was measured
    result["categories"] = cats.rows(screening.kept) if cats is not None else None
    result["incumbent"] = incumbent  # evaluation.incumbent (None: not asked, or nothing was measured)
    return result | {"seconds": round(time.monotonic() - started, 3)}


def measured(
    ctx: Context,
    pool: ServerPool,
    prompts: list[list[Message]],
    draft: Drafted,
    sweep: SpeculationSweep | None,
    choosing: tuple[Path, list[Candidate]],
    cats: CategoryRuns | None,
) -> tuple[Measurement, Measurement | None]:
    """The verifier alone, then the draft server (and the sweep, the bake-off or the epochs): the
    verifier alone's greedy answers screen the prompts (eagle3_pipeline.serving.degenerate), so the draft
    server's counters only see the prompts kept."""
    passes = 2 + (1 if ctx.params.sampling is not None else 0)
    baseline = measure(ctx, pool, prompts, None, categories=cats)
    screening = screening_of(baseline)
    kept = screening.kept
    if sweep is not None:
        sweep.leave_out(screening.degenerate)  # its rounds measure the kept prompts only
    swept = sweep.total_prompts if sweep is not None else 0  # without the prompts screened out
    swept += cats.total(kept) if cats is not None else 0
    epochs = len(choosing[1])
    each = len(kept) * epochs if ctx.params.checkpoints_to_evaluate else 0  # a server per epoch
    each += bake_off_prompts(ctx.params, len(kept), epochs)  # draft.candidates
    ctx.progress.set_total(answered(len(prompts), len(kept), passes) + each + swept)
    return baseline, measure_draft(ctx, pool, prompts, kept, draft, sweep, choosing, cats)


@dataclass
class Drafted:
    """The draft measured: its checkpoint in train's output, its slim serving copy, and, with
    training.checkpointSelection acceptance, the result's `checkpointSelection` once an epoch is chosen."""

    source: Path
    slim: SlimCheckpoint
    chosen: dict[str, Any] | None = None


def measure_draft(
    ctx: Context,
    pool: ServerPool,
    prompts: list[list[Message]],
    kept: list[int],
    draft: Drafted,
    sweep: SpeculationSweep | None,
    choosing: tuple[Path, list[Candidate]],
    categories: CategoryRuns | None = None,
) -> Measurement | None:
    """The draft server's measurement on the kept prompts (None when none is kept), and the sweep's other
    k's. With epochs to choose among (`choosing`: train's output and its candidate epochs), the most accepted
    one becomes `draft` (its greedy run reused when there is no sampling or sweep to measure)."""
    if not kept:
        return None
    run = None
    train, epochs = choosing
    chosen: Candidate | None = None
    if ctx.params.checkpoints_to_evaluate:  # training.checkpointSelection acceptance
        best, draft.chosen = choose_checkpoint(ctx, pool, prompts, kept, train, epochs)
        chosen = best.candidate
        run = best.run if ctx.params.sampling is None and categories is None else None
    elif epochs or ctx.params.rivals:  # draft.candidates: the bake-off
        trained = epochs or [own_candidate(train, draft.source)]
        subset = [prompts[i] for i in kept]
        method = checkpoint_method(draft.source).value
        chosen, draft.chosen = bake_off(ctx, pool, subset, train, trained, method)
    if chosen is not None and chosen.path(train).resolve() != draft.source:  # the chosen draft is measured
        draft.source = chosen.path(train).resolve()
        draft.slim = write_serving_checkpoint(draft.source, draft.slim.path, ctx.params.verifier.model)
    run = run or measure(
        ctx, pool, prompts, draft.slim.path, kept, categories=categories, source=draft.source
    )
    if sweep is not None:
        sweep.run(draft.slim.path, draft.source, pool)
    return run


# --- training.checkpointSelection acceptance: a server per epoch ----------------------------------------


def own_candidate(train: Path, source: Path) -> Candidate:
    """draft.candidates with one trained method: train's best checkpoint, the bake-off's trained entrant."""
    result = read_result(train)
    return Candidate(
        int(result.get("bestEpoch") or 0),
        str(source.resolve().relative_to(train.resolve())),
        result.get("bestValLoss"),
        checkpoint_method(source).value,
    )


def choose_checkpoint(
    ctx: Context,
    pool: ServerPool,
    prompts: list[list[Message]],
    kept: list[int],
    train: Path,
    choosing: list[Candidate],
) -> tuple[Measured, dict[str, Any]]:
    """Serve each epoch's draft on the kept prompts (greedy), and choose the most accepted
    (eagle3_pipeline.stages.evaluate.checkpoints); the result's `checkpointSelection` with it."""
    k = ctx.params.num_speculative_tokens
    measured: list[Measured] = []
    for c in choosing:
        name = f"{DRAFT_DIR}-{c.method}" if c.method is not None else f"{DRAFT_DIR}-epoch{c.epoch}"
        slim = write_serving_checkpoint(c.path(train), ctx.work / name, ctx.params.verifier.model)
        try:
            run = measure(ctx, pool, prompts, slim.path, kept, label=name, extras=False, source=c.path(train))
        finally:
            shutil.rmtree(slim.path, ignore_errors=True)
        _, acceptance = acceptance_of(run, k)
        measured.append(Measured(c, acceptance.length, acceptance.rate, run.tokens_per_second, run))
        logger.info(
            "evaluate: %s (val loss %s): acceptance length %.3f, %.1f output tokens/s",
            c.method or f"epoch {c.epoch}",
            c.val_loss,
            acceptance.length,
            run.tokens_per_second or 0.0,
        )
    best = choose(measured)
    lowest = read_result(train).get("bestEpoch")  # the epoch of the lowest validation loss
    document = choice_document(measured, best, lowest)
    logger.info("evaluate: %s", CheckpointChoice.model_validate(document).line())
    return best, document


# --- one server: the runs over the prompts ---------------------------------------------------------------


def measure(
    ctx: Context,
    pool: ServerPool,
    prompts: list[list[Message]],
    draft: Path | None,
    kept: list[int] | None = None,
    label: str | None = None,
    extras: bool = True,
    warm: bool = False,
    categories: CategoryRuns | None = None,
    source: Path | None = None,
) -> Measurement:
    """Serve the verifier (with `draft` when given), answer the prompts greedily, and read the counters around
    it. Without `kept`, every prompt, and the answers are screened (`screened`); with it, those prompts only
    (when fewer than all, after answering them once unmeasured: the screening server measured them with
    their prefixes cached). With a draft and evaluation.sampling, the kept prompts are answered again with
    those settings on the same server; `extras` false: not (a candidate checkpoint's greedy run). `warm`:
    the prompts answered once unmeasured first in any case (draft.candidates compares the servers' speeds).
    The server is `pool`'s for the configuration (the draft named by train's checkpoint `source`, default
    `draft`): one up already is reused; a candidate epoch's (`extras` false) stops after its run."""
    label = label or ("draft" if draft is not None else "baseline")
    # the serving Deployment's speculative config (eagle3_contract.vllm_command), with the slim draft
    k = ctx.params.num_speculative_tokens
    config = None if draft is None else draft_speculative_config(str(draft), k, checkpoint_method(draft))
    key = ALONE if draft is None else draft_key(source or draft, k)
    sampling = ctx.params.sampling if draft is not None and extras else None
    with pool.serve(key, config, f"vllm-{label}.log", keep=extras) as server:
        subset = prompts if kept is None else [prompts[i] for i in kept]
        if len(subset) < len(prompts) or warm:
            asyncio.run(answer_all(server, subset, 1))  # prefixes cached, as on the screening server
        result = counted_run(ctx, server, subset, None, counted=draft is not None)
        result.server_start_s = server.started_s
        server.check()
        checked(server, result, label, len(subset))
        if kept is None:
            result = screened(ctx, server, prompts, result, label, counted=draft is not None)
            subset = [prompts[i] for i in screening_of(result).kept]
        if sampling is not None and subset:
            result.sampled = counted_run(ctx, server, subset, sampling, counted=True)
            server.check()
            checked(server, result.sampled, f"{label} (sampled)", len(subset))
        if categories is not None and extras:  # each category's kept prompts as a run of their own
            measured = kept if kept is not None else screening_of(result).kept
            categories.measure(server, prompts, measured, counted=draft is not None)
    return result


def screened(
    ctx: Context,
    server: VllmServer,
    prompts: list[list[Message]],
    first: Measurement,
    label: str,
    counted: bool,
) -> Measurement:
    """`first`'s greedy answers screened (`eagle3_pipeline.serving.degenerate`); when some are degenerate and
    some are not, the kept prompts answered again on the same server: that run holds the figures."""
    screening = first.screening = screen(first.outputs, first.token_ids)
    kept = screening.kept
    if len(kept) in (0, len(prompts)):
        return first
    left_out, counts = len(prompts) - len(kept), screening.counts()
    logger.info("%s: %d of %d answers degenerate %s", label, left_out, len(prompts), counts)
    again = counted_run(ctx, server, [prompts[i] for i in kept], None, counted)
    again.server_start_s, again.screening, again.screened = first.server_start_s, screening, first
    server.check()
    checked(server, again, f"{label} (kept prompts)", len(kept))
    return again


def screening_of(run: Measurement) -> Screening:
    assert run.screening is not None  # measure() screens the prompts when it is not given the kept ones
    return run.screening


def checked(server: VllmServer, result: Measurement, label: str, prompts: int) -> None:
    """Log the run; a run where every request failed measured nothing: a StageError."""
    tokens, seconds = result.output_tokens, result.seconds
    logger.info("%s: %d prompts, %d output tokens in %.1f s", label, prompts, tokens, seconds)
    if len(result.failures) == prompts:
        raise StageError(
            f"every request to the {label} server failed, e.g. {result.failures[0]} (log: {server.log_path})"
        )

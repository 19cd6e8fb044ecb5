"""predict: the speedup an EAGLE-3 draft would give this verifier here, before any training.

It needs only the verifier. The acceptance lengths are the published ones of the verifier's class
(eagle3_contract.acceptance_references, clamped to k + 1) and evaluation.targetAcceptanceLength; the
concurrencies are evaluation.concurrencies. The verifier alone is served once and answers
max(2 x concurrency, MIN_PROMPTS) prompts at each concurrency (the baseline tokens/s); then, by the method
the platform allows (eagle3_pipeline.stages.predict.prediction): on CUDA, one server per acceptance length
with vLLM's synthetic rejection sampling (`synthetic`); elsewhere one server with an untrained draft of the
spec's shape, whose measured tokens/s and acceptance scale to each length (`step-cost`). The result
(PredictResult) holds tokens/s and speedup per (length, concurrency), the break-even acceptance length per
concurrency, the method and where the prompts came from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from eagle3_contract.acceptance_references import PredictedLength, acceptance_lengths_for
from eagle3_contract.params import PredictParams, PredictSettings, PredictTuning
from eagle3_contract.vllm_command import draft_speculative_config
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.requests import Message, answer_all, read_counters, settled_counters
from eagle3_pipeline.serving.spec_metrics import Acceptance
from eagle3_pipeline.serving.vllm_server import VllmServer
from eagle3_pipeline.stages.predict.inputs import build_untrained_draft, chat_prompts
from eagle3_pipeline.stages.predict.prediction import (
    STEP_COST,
    STEP_COST_NOTE,
    SYNTHETIC,
    SYNTHETIC_NOTE,
    break_even,
    speedup,
    step_cost_tokens_per_second,
    verdict,
)

logger = logging.getLogger(__name__)

MIN_PROMPTS = 8
WARMUP_TOKENS = 8
DRAFT_DIR = "draft"

Context = StageContext[PredictParams, PredictTuning]


@dataclass
class ServerRun:
    """One server's tokens/s (and, with a draft, acceptance length) per concurrency."""

    tokens_per_second: list[float | None] = field(default_factory=list)
    acceptance_length: list[float | None] = field(default_factory=list)
    start_seconds: float = 0.0
    failures: int = 0


def run(ctx: Context) -> dict[str, Any]:
    started = time.monotonic()
    settings = ctx.params.prediction
    if settings is None:
        raise StageError("evaluation.predict is false: set it to true (or run `eagle3 plan FILE`)")
    k = settings.num_speculative_tokens
    found, lengths = acceptance_lengths_for(settings.verifier.model, k, settings.target_acceptance_length)
    wanted = max(max(settings.concurrencies) * 2, MIN_PROMPTS)
    prompts, origin = chat_prompts(ctx.local_path(settings.dataset), wanted)
    method = choose_method()
    values = sorted({p.acceptance_length for p in lengths})
    servers = 2 if method == STEP_COST else 1 + len(values)
    ctx.progress.begin("prompts", servers * sum(cell_prompts(c) for c in settings.concurrencies))
    baseline = serve(ctx, settings, prompts, None, "baseline")
    starts = {"baseline": round(baseline.start_seconds, 1)}
    draft = build_untrained_draft(
        ctx.local_path(settings.verifier.model), settings.verifier.model, ctx.work / DRAFT_DIR,
        settings.draft_layers, settings.draft_vocab_size, settings.verifier.trust_remote_code,
    )  # fmt: skip
    if method == STEP_COST:
        measured = serve(ctx, settings, prompts, draft_speculative_config(str(draft), k), "draft")
        starts["draft"] = round(measured.start_seconds, 1)
        table = step_cost_table(measured, values)
        failures = baseline.failures + measured.failures
    else:
        measured, table, failures = ServerRun(), {}, baseline.failures
        for value in values:
            run_at = serve(ctx, settings, prompts, synthetic_config(str(draft), k, value), f"L{value:g}")
            starts[f"L{value:g}"] = round(run_at.start_seconds, 1)
            table[value], failures = run_at.tokens_per_second, failures + run_at.failures
    figures = Figures(lengths, table, baseline, measured)
    result = summarize(settings, found, method, figures, k)
    return result | {
        "prompts": len(prompts),
        "promptsSource": origin,
        "failedRequests": failures,
        "serverStartSeconds": starts,
        "seconds": round(time.monotonic() - started, 3),
    }


def choose_method() -> str:
    """synthetic where vLLM supports it (CUDA), else step-cost (vLLM's CPU sampler refuses synthetic)."""
    import torch

    return SYNTHETIC if torch.cuda.is_available() else STEP_COST


def synthetic_config(draft: str, k: int, length: float) -> dict[str, Any]:
    """The draft's speculative config with vLLM's synthetic rejection sampling at acceptance `length`."""
    return draft_speculative_config(draft, k) | {
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": length,
    }


def cell_prompts(concurrency: int) -> int:
    return max(2 * concurrency, MIN_PROMPTS)


# --- serving ----------------------------------------------------------------------------------------------


def serve(
    ctx: Context,
    settings: PredictSettings,
    prompts: list[list[Message]],
    config: dict[str, Any] | None,
    label: str,
) -> ServerRun:
    """Serve the verifier (with `config`'s draft), warm it up, and measure each concurrency in turn."""
    engine = settings.verifier.engine(ctx.tuning.tensor_parallel_size)  # the server maps the path
    log = ctx.work / f"vllm-{label}.log"
    out = ServerRun()
    with VllmServer(ctx, engine, seed=ctx.tuning.seed, speculative_config=config, log_path=log) as server:
        out.start_seconds = server.started_s
        asyncio.run(answer_all(server, prompts[:2], WARMUP_TOKENS, None, None, concurrency=2))
        for concurrency in settings.concurrencies:
            cell = prompts[: cell_prompts(concurrency)]
            before = read_counters(server) if config is not None else None
            run_ = asyncio.run(
                answer_all(server, cell, settings.max_tokens, ctx.progress, None, concurrency=concurrency)
            )
            server.check()
            if len(run_.failures) == len(cell):
                raise StageError(
                    f"every request to the {label} server failed, e.g. {run_.failures[0]} ({log})"
                )
            out.failures += len(run_.failures)
            out.tokens_per_second.append(run_.tokens_per_second)
            out.acceptance_length.append(
                acceptance(server, before, run_.output_tokens) if config is not None else None
            )
            logger.info(
                "%s at concurrency %d: %d prompts, %.1f output tokens/s",
                label, concurrency, len(cell), run_.tokens_per_second or 0.0,
            )  # fmt: skip
    return out


def acceptance(server: VllmServer, before: Any, tokens: int) -> float | None:
    """The mean acceptance length over a run, from the server's speculative-decoding counters."""
    after = settled_counters(server, before, tokens)
    try:
        return Acceptance.from_counters(after - before if before is not None else after).length
    except ValueError:
        return None


# --- the result -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    lengths: list[PredictedLength]
    tokens: dict[float, list[float | None]]  # tokens/s per concurrency, by acceptance length
    baseline: ServerRun
    draft: ServerRun  # step-cost: the untrained draft's run; synthetic: empty


def step_cost_table(measured: ServerRun, values: list[float]) -> dict[float, list[float | None]]:
    """tokens/s at each acceptance length and concurrency from the untrained draft's run."""
    table: dict[float, list[float | None]] = {}
    for value in values:
        row: list[float | None] = []
        for tps, l0 in zip(measured.tokens_per_second, measured.acceptance_length, strict=True):
            row.append(step_cost_tokens_per_second(tps, l0, value) if tps and l0 else None)
        table[value] = row
    return table


def _round(values: list[float | None], digits: int) -> list[float | None]:
    return [round(v, digits) if v is not None else None for v in values]


def summarize(settings: PredictSettings, found: str, method: str, figures: Figures, k: int) -> dict[str, Any]:
    base = figures.baseline.tokens_per_second
    rows = [figures.tokens[p.acceptance_length] for p in figures.lengths]
    speedups = [[speedup(t, b) for t, b in zip(row, base, strict=True)] for row in rows]
    lengths = [p.acceptance_length for p in figures.lengths]
    evens = [break_even(lengths, [row[i] for row in speedups], k) for i in range(len(base))]
    step_cost = method == STEP_COST
    return {
        "method": method,
        "methodNote": STEP_COST_NOTE if step_cost else SYNTHETIC_NOTE,
        "modelClass": found,
        "numSpeculativeTokens": k,
        "maxTokens": settings.max_tokens,
        "concurrencies": list(settings.concurrencies),
        "acceptanceLengths": [
            {
                "acceptanceLength": p.acceptance_length,
                "source": p.source,
                "published": p.published,
                "clamped": p.clamped,
            }
            for p in figures.lengths
        ],
        "tokensPerSecond": [_round(row, 2) for row in rows],
        "speedup": [_round(row, 4) for row in speedups],
        "baselineTokensPerSecond": _round(base, 2),
        "draftTokensPerSecond": _round(figures.draft.tokens_per_second, 2) if step_cost else None,
        "measuredAcceptanceLength": _round(figures.draft.acceptance_length, 4) if step_cost else None,
        "breakEven": _round(evens, 3),
        "verdict": verdict(list(settings.concurrencies), evens, k),
        "message": None,
    }

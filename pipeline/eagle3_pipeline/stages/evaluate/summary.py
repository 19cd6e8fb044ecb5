"""evaluate's result from its measurements: the acceptance (greedy and sampled) from the spec-decode counters,
the speedup over the verifier alone, the screened-out degenerate prompts, the sweep's table, and the notes a
person needs to trust the figures (failed requests, answers that differ from the verifier's, a mapping that
is wrong). Pure: eagle3_pipeline.stages.evaluate.program measures, this module summarizes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_contract.api.speculation import headline_cell
from eagle3_contract.params import EvaluateParams, EvaluateTuning
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.degenerate import Screening
from eagle3_pipeline.serving.requests import CONCURRENCY, Measurement, Message
from eagle3_pipeline.serving.spec_metrics import Acceptance, SpecDecodeCounters, consistency_problems
from eagle3_pipeline.stages.evaluate.prompts import HeldOut, degenerate_examples, degenerate_note
from eagle3_pipeline.stages.evaluate.sweep import SpeculationSweep

FAILED_EXAMPLES = 3

Context = StageContext[EvaluateParams, EvaluateTuning]


@dataclass(frozen=True)
class Evaluation:
    prompts: list[list[Message]]
    held_out: int
    draft: Measurement | None  # None when every prompt's answer was degenerate
    baseline: Measurement | None  # None when the draft's mapping is broken
    mapping_problem: str | None
    source: Path
    foreign_embeddings: str | None = None
    screening: Screening | None = None  # the verifier's answers judged (eagle3_pipeline.serving.degenerate)
    held: HeldOut | None = None

    @property
    def measured(self) -> int:
        """The prompts the figures are measured on: the ones whose answers were not degenerate."""
        return len(self.screening.kept) if self.screening is not None else len(self.prompts)


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
    sampling, run = ctx.params.sampling, ev.draft.sampled if ev.draft is not None else None
    if sampling is None or run is None:
        return None
    counters, acceptance = acceptance_of(run, ctx.params.num_speculative_tokens)
    return {
        "temperature": sampling.temperature,
        "topP": sampling.top_p,
        "topK": sampling.top_k,
        "seed": sampling.seed,
        "prompts": ev.measured,
        "drafts": int(counters.drafts),
        "draftTokens": int(counters.draft_tokens),
        "acceptedTokens": int(counters.accepted),
        "acceptanceRate": round(acceptance.rate, 6),
        "acceptanceLength": round(acceptance.length, 6),
        "acceptanceByPosition": [round(a, 6) for a in acceptance.by_position],
    }


def acceptance_figures(ctx: Context, ev: Evaluation) -> dict[str, Any]:
    """The draft's acceptance on the kept prompts; null when every answer was degenerate (nothing to
    measure it on: the gate cannot pass on it)."""
    if ev.draft is None or ev.measured == 0:
        keys = ("drafts", "draftTokens", "acceptedTokens", "acceptedTokensByPosition", "acceptanceRate")
        return dict.fromkeys((*keys, "acceptanceLength", "acceptanceByPosition"))
    counters, acceptance = acceptance_of(ev.draft, ctx.params.num_speculative_tokens)
    return {
        "drafts": int(counters.drafts),
        "draftTokens": int(counters.draft_tokens),
        "acceptedTokens": int(counters.accepted),
        "acceptedTokensByPosition": [int(a) for a in counters.accepted_per_position],
        "acceptanceRate": round(acceptance.rate, 6),
        "acceptanceLength": round(acceptance.length, 6),
        "acceptanceByPosition": [round(a, 6) for a in acceptance.by_position],
    }


def degenerate_figures(ev: Evaluation) -> dict[str, Any]:
    """The prompts left out of the figures because the verifier's answer was degenerate, by reason."""
    screening, ids = ev.screening, ev.held.ids if ev.held is not None else []
    if screening is None:
        return {"degeneratePrompts": None, "degenerate": None, "degenerateExamples": None}
    return {
        "degeneratePrompts": len(screening.degenerate),
        "degenerate": screening.counts(),
        "degenerateExamples": degenerate_examples(screening, ids),
    }


def summarize(ctx: Context, ev: Evaluation) -> dict[str, Any]:
    draft, base = ev.draft, ev.baseline
    speed = draft.tokens_per_second if draft else None
    base_speed = base.tokens_per_second if base and draft else None  # on the same (kept) prompts
    return {
        "prompts": len(ev.prompts),
        "promptsRequested": ctx.params.prompts,
        "heldOutPrompts": ev.held_out,
        "failedPrompts": len(failures(ev)),
        "numSpeculativeTokens": ctx.params.num_speculative_tokens,
        "maxTokens": ctx.params.max_tokens,
        **acceptance_figures(ctx, ev),
        **degenerate_figures(ev),
        "outputTokens": draft.output_tokens if draft else None,
        "outputTokensPerSecond": round(speed, 2) if speed else None,
        "baselineOutputTokens": base.output_tokens if base and draft else None,
        "baselineOutputTokensPerSecond": round(base_speed, 2) if base_speed else None,
        "speedup": round(speed / base_speed, 4) if speed and base_speed else None,
        "speedupConcurrency": min(CONCURRENCY, ev.measured) if speed and base_speed else None,
        "outputsMatchingBaseline": matching(draft.outputs, base.outputs) if draft and base else None,
        "message": "; ".join(notes(ctx, ev)) or None,
        "mappingConsistent": ev.mapping_problem is None,
        "embeddingsMatchVerifier": ev.foreign_embeddings is None,
        "draftCheckpoint": relative_to(ev.source, ctx.artifacts),
        "serverStartSeconds": {
            "draft": round(draft.server_start_s, 1) if draft else None,
            "baseline": round(base.server_start_s, 1) if base else None,
        },
        "sampled": sampled_figures(ctx, ev),
    }


def with_sweep(result: dict[str, Any], sweep: SpeculationSweep | None) -> dict[str, Any]:
    """The result with evaluation.sweep's table (`speculation`, None without a sweep) and its notes. When
    the sweep measured evaluate's own k, the headline speedup is its cell's at the measured concurrency
    nearest the main runs' (eagle3_contract.api.speculation.headline_cell): the main runs answer each
    prompt once on a fresh server, the sweep's cells with the prompts' prefixes cached, and one figure
    must mean one thing wherever it is shown."""
    if sweep is None:
        return result | {"speculation": None}
    notes = [note for note in (result.get("message"), *sweep.notes()) if note]
    table = sweep.table()
    shown = result | {"speculation": table.model_dump(mode="json", by_alias=True)}
    k, main = result.get("numSpeculativeTokens"), result.get("speedupConcurrency") or CONCURRENCY
    cell = headline_cell(table.cells, k, main) if k is not None else None
    if cell is not None:
        shown |= {"speedup": cell.speedup, "speedupConcurrency": cell.concurrency}
    return shown | {"message": "; ".join(notes) or None}


def relative_to(path: Path, root: Path) -> str:
    """`path` relative to the artifacts root where it lies there (as the cluster volume names it)."""
    try:
        return str(path.relative_to(root.resolve()))
    except ValueError:
        return str(path)


def failures(ev: Evaluation) -> list[str]:
    runs = [ev.draft, ev.draft.sampled if ev.draft else None, ev.baseline]
    return [failure for run in runs if run is not None for failure in run.failures]


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
    if ev.held is not None and ev.held.skipped:
        out.append(
            f"{ev.held.skipped} validation conversations were skipped: they have no user turn to answer "
            "before their first assistant turn"
        )
    degenerate = degenerate_note(ev.screening, ev.held.ids if ev.held else []) if ev.screening else None
    if degenerate:
        out.append(degenerate)
    failed = failures(ev)
    if failed:
        out.append(f"{len(failed)} requests failed, e.g. {'; '.join(failed[:FAILED_EXAMPLES])}")
    return out

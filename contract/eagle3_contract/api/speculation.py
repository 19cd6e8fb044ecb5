"""Speculation length from measurements: evaluate's sweep table and the batch-size schedule it justifies.

evaluate measures, at each concurrency of `evaluation.sweep`, the output tokens/s of the verifier alone (the
baseline) and with the draft at each number of speculative tokens k, in `evaluation.rounds` paired rounds
(eagle3_contract.api.comparison): a cell's speedup is the median of its rounds' ratios over the baseline's
rounds measured beside them, with that median's interval. The best k at a concurrency is the one with the
highest median speedup among those whose interval lies above 1 (noisy rounds flagged); where none
does, speculation is off there (k = 0), and where some k's median is above 1 without its interval clearing
it, the range says `notDistinguishable`: the safe default stays, and the result says so with the interval.
vLLM 0.32 takes such a schedule as `num_speculative_tokens_per_batch_size` in the speculative
config: a list of inclusive batch-size ranges `[start, end, k]`, the first starting at 1, sorted and
non-overlapping (vllm.v1.spec_decode.dynamic.utils). A concurrency's range reaches up to the geometric mean of
it and the next measured concurrency; vLLM carries the last range's k on to its max-num-seqs.

Pure: the pipeline writes the table (EvaluateResult.speculation), the export manifest keeps it, and the
operator renders the schedule of `serving.speculationLength: tuned` from it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import ConfigDict, Field

from eagle3_contract.api.base import ApiModel
from eagle3_contract.api.comparison import Comparison, Verdict

SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"


class StatusModel(ApiModel):
    """As api.status's: unknown fields tolerated (this table lives in status, results and manifests)."""

    model_config = ConfigDict(extra="ignore")


class SweepCell(StatusModel):
    """One measured cell: the draft at k speculative tokens, at one concurrency."""

    num_speculative_tokens: int = Field(description="k: draft tokens proposed per verifier step.")
    concurrency: int = Field(description="Requests in flight at once.")
    acceptance_length: float | None = Field(None, description="Mean acceptance length (greedy).")
    output_tokens_per_second: float | None = Field(
        None, description="Output tokens per second, all requests."
    )
    speedup: float | None = Field(
        None,
        description="The median of the rounds' ratios over the baseline's rounds beside them (one run's "
        "ratio in a table written before rounds).",
    )
    comparison: Comparison | None = Field(
        None, description="The speedup's paired rounds: median ratio, its interval, spread, noisy."
    )

    def verdict(self) -> Verdict:
        """Faster than the verifier alone (BETTER) only where the rounds' interval lies above 1; a table
        written before rounds decides on its one ratio."""
        if self.comparison is not None:
            return self.comparison.verdict(1.0)
        if self.speedup is None:
            return Verdict.NOT_DISTINGUISHABLE
        return Verdict.BETTER if self.speedup > 1.0 else Verdict.WORSE


class BaselineCell(StatusModel):
    """The verifier alone (no draft) at one concurrency."""

    concurrency: int = Field(description="Requests in flight at once.")
    output_tokens_per_second: float | None = Field(
        None, description="Output tokens per second, all requests."
    )


class SpeculationRange(StatusModel):
    """One entry of vLLM's num_speculative_tokens_per_batch_size: k for an inclusive batch-size range."""

    min_batch_size: int = Field(ge=1, description="First batch size of the range.")
    max_batch_size: int = Field(ge=1, description="Last batch size of the range (inclusive).")
    num_speculative_tokens: int = Field(ge=0, description="k in this range; 0: speculation off.")
    concurrency: int | None = Field(None, description="The measured concurrency the range is derived from.")
    speedup: float | None = Field(None, description="The measured speedup of this k at that concurrency.")
    verdict: Verdict | None = Field(
        None,
        description="better: the k's interval lies above 1; notDistinguishable: some k's median speedup is "
        "above 1 but no interval clears 1 (speculation stays off); worse: no k is faster.",
    )
    measured_k: int | None = Field(
        None,
        description="The k whose speedup and comparison the range shows: the chosen one, or where none is "
        "chosen the fastest by median.",
    )
    comparison: Comparison | None = Field(None, description="That k's paired rounds.")


class SpeculationTable(StatusModel):
    """evaluate's sweep: every cell, the baselines, and the schedule they justify."""

    cells: list[SweepCell] = Field(default_factory=list, description="The draft's cells, k by concurrency.")
    baselines: list[BaselineCell] = Field(
        default_factory=list, description="The verifier alone per concurrency."
    )
    schedule: list[SpeculationRange] = Field(
        default_factory=list, description="The best k per batch-size range (k 0: no k beat the baseline)."
    )


def best_k(cells: Sequence[SweepCell], concurrency: int) -> SweepCell | None:
    """The cell with the highest speedup at `concurrency` among those faster than the baseline with their
    interval clear of 1 (SweepCell.verdict BETTER); None when none is (ties: the smaller k, which costs less
    draft compute)."""
    faster = [
        c
        for c in cells
        if c.concurrency == concurrency
        and c.verdict() is Verdict.BETTER
        and c.speedup is not None
        and c.output_tokens_per_second is not None
    ]
    if not faster:
        return None
    return max(faster, key=lambda c: (c.speedup or 0.0, -c.num_speculative_tokens))


def closest_k(cells: Sequence[SweepCell], concurrency: int) -> SweepCell | None:
    """Where no k is clearly faster: the one with the highest median speedup (what the range reports)."""
    measured = [c for c in cells if c.concurrency == concurrency and c.speedup is not None]
    return max(measured, key=lambda c: (c.speedup or 0.0, -c.num_speculative_tokens), default=None)


def headline_cell(cells: Sequence[SweepCell], k: int, concurrency: int) -> SweepCell | None:
    """The cell evaluate's headline speedup is read from: k's, at the measured concurrency nearest
    `concurrency` (the main runs' requests in flight; ties: the larger); None when the sweep measured no
    speedup at k. One figure, so the result, the summary, `eagle3 status`, the metrics and the dashboard
    agree with the sweep's own table."""
    measured = [c for c in cells if c.num_speculative_tokens == k and c.speedup is not None]
    if not measured:
        return None
    return min(measured, key=lambda c: (abs(c.concurrency - concurrency), -c.concurrency))


def plan_schedule(cells: Sequence[SweepCell]) -> list[SpeculationRange]:
    """The best k per batch-size range, adjacent ranges of the same k merged (see the module doc)."""
    concurrencies = sorted({c.concurrency for c in cells})
    ranges: list[SpeculationRange] = []
    start = 1
    for i, concurrency in enumerate(concurrencies):
        last = i == len(concurrencies) - 1
        end = concurrency if last else max(concurrency, math.isqrt(concurrency * concurrencies[i + 1]))
        end = max(end, start)
        best = best_k(cells, concurrency)
        k = best.num_speculative_tokens if best is not None else 0
        shown = best or closest_k(cells, concurrency)
        verdict = range_verdict(best, shown)
        if ranges and ranges[-1].num_speculative_tokens == k and ranges[-1].verdict == verdict:
            ranges[-1] = ranges[-1].model_copy(update={"max_batch_size": end})
        else:
            ranges.append(
                SpeculationRange(
                    min_batch_size=start,
                    max_batch_size=end,
                    num_speculative_tokens=k,
                    concurrency=concurrency,
                    speedup=shown.speedup if shown is not None else None,
                    verdict=verdict,
                    measured_k=shown.num_speculative_tokens if shown is not None else None,
                    comparison=shown.comparison if shown is not None else None,
                )
            )
        start = end + 1
    return ranges


def range_verdict(best: SweepCell | None, shown: SweepCell | None) -> Verdict | None:
    """BETTER with a k chosen; NOT_DISTINGUISHABLE where the closest k's median is above 1 without a clear
    interval; WORSE where every k is slower; None where nothing was measured."""
    if best is not None:
        return Verdict.BETTER
    if shown is None or shown.speedup is None:
        return None
    if shown.verdict() is Verdict.WORSE or (shown.comparison is None and shown.speedup <= 1.0):
        return Verdict.WORSE
    return Verdict.NOT_DISTINGUISHABLE


def undecided(schedule: Sequence[SpeculationRange]) -> list[SpeculationRange]:
    """The ranges where speculation stays off because no k's interval cleared 1 though some k looked
    faster: what the result, Events, `eagle3 status` and the demo's table say as "not distinguishable"."""
    return [r for r in schedule if r.verdict is Verdict.NOT_DISTINGUISHABLE]


def schedule_argument(schedule: Sequence[SpeculationRange]) -> list[list[int]]:
    """The schedule as vLLM's num_speculative_tokens_per_batch_size value."""
    return [[r.min_batch_size, r.max_batch_size, r.num_speculative_tokens] for r in schedule]


def tuned_speculative_config(base: dict[str, Any], schedule: Sequence[SpeculationRange]) -> dict[str, Any]:
    """`base` (an EAGLE-3 speculative config) with the schedule: num_speculative_tokens becomes the largest k
    of the schedule (vLLM caps each range's k at it, and needs at least 1)."""
    if not schedule:
        return dict(base)
    top = max(r.num_speculative_tokens for r in schedule)
    return {**base, "num_speculative_tokens": max(1, top), SCHEDULE_KEY: schedule_argument(schedule)}

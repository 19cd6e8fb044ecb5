"""evaluate's acceptance and speedup per category of the held-out prompts (the result's `categories`).

A prompt's category is its conversation's `category` (prepare keeps a dataset row's `category`, or the file
it came from in a directory of files: eagle3_pipeline.data.conversations.category_of); `evaluation.categories`
names the ones reported, every other prompt counts as `other` (eagle3_contract.api.categories: at most
MAX_CATEGORIES + 1 categories, the bound of the metrics' `category` label).

vLLM's speculative-decoding counters are server-wide, not per request. So each category's kept prompts (the
screening's: degenerate answers stay out) are answered as a run of their own, greedy, on evaluate's draft
server after its main runs, and the counters' difference over that run is the category's acceptance; the
verifier-alone server answers the same runs after its own, and a category's speedup is its run's output
tokens/s with the draft over the verifier alone's. Each run has min(CONCURRENCY, its prompts) requests in
flight, so a category's speedup is at that concurrency (a small category's near 1 request at a time). A
speedup is one run of each server, not paired rounds (eagle3_pipeline.stages.evaluate.rounds): it informs,
it decides nothing, and it is reported only for a category of at least MIN_TIMED_PROMPTS prompts (a run of
1 to 3 short answers times request overheads, not decoding: the tiny example's ranged from 0.01x to 18x).
The
runs answer the kept prompts once more greedily: their counters add up to the main run's up to batch
numerics (vLLM on CPU batches differently with fewer requests in flight), and their prompts exactly to the
main run's. With one category among the kept prompts there are no such runs and `categories` is null.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eagle3_contract.api.categories import MAX_CATEGORIES, OTHER_CATEGORY
from eagle3_contract.params import EvaluateParams, EvaluateTuning
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.requests import Measurement, Message
from eagle3_pipeline.serving.spec_metrics import Acceptance, consistency_problems
from eagle3_pipeline.serving.vllm_server import VllmServer
from eagle3_pipeline.stages.evaluate.prompts import HeldOut
from eagle3_pipeline.stages.evaluate.runs import counted_run

logger = logging.getLogger(__name__)

MIN_TIMED_PROMPTS = 8  # a category's speedup is reported from this many kept prompts on

Context = StageContext[EvaluateParams, EvaluateTuning]


def reported_categories(found: Sequence[str | None], wanted: Sequence[str] | None) -> list[str]:
    """Each prompt's category as reported: one of `wanted` (evaluation.categories) or OTHER_CATEGORY; without
    `wanted`, the categories found when there are at most MAX_CATEGORIES, else the MAX_CATEGORIES - 1 with
    the most prompts (ties by name). A prompt without a category is OTHER_CATEGORY."""
    if wanted is not None:
        names = set(wanted)
    else:
        counts = Counter(c for c in found if c is not None)
        ranked = sorted(counts, key=lambda c: (-counts[c], c))
        names = set(ranked if len(ranked) <= MAX_CATEGORIES else ranked[: MAX_CATEGORIES - 1])
    return [c if c is not None and c in names else OTHER_CATEGORY for c in found]


def plan_groups(
    categories: Sequence[str], kept: Sequence[int], wanted: Sequence[str] | None
) -> dict[str, list[int]]:
    """The kept prompts' indices by category, in evaluation.categories' order (else by name), OTHER_CATEGORY
    last; {} when the kept prompts have fewer than two categories (nothing to tell apart)."""
    groups: dict[str, list[int]] = {}
    for i in kept:
        groups.setdefault(categories[i], []).append(i)
    if len(groups) < 2:
        return {}
    order = {name: n for n, name in enumerate(wanted or sorted(groups))}
    return dict(sorted(groups.items(), key=lambda g: (g[0] == OTHER_CATEGORY, order.get(g[0], 0), g[0])))


@dataclass
class CategoryRuns:
    """The held-out prompts' categories and each category's runs, on the draft and the verifier-alone
    servers."""

    ctx: Context
    categories: list[str]  # by held-out prompt, as reported
    draft: dict[str, Measurement] = field(default_factory=dict)
    baseline: dict[str, Measurement] = field(default_factory=dict)

    @classmethod
    def of(cls, ctx: Context, held: HeldOut, count: int) -> CategoryRuns | None:
        """The categories of the first `count` held-out prompts; None with fewer than two."""
        found = (list(held.categories) + [None] * count)[:count]
        categories = reported_categories(found, ctx.params.categories)
        return cls(ctx, categories) if len(set(categories)) > 1 else None

    def groups(self, kept: Sequence[int]) -> dict[str, list[int]]:
        return plan_groups(self.categories, kept, self.ctx.params.categories)

    def total(self, kept: Sequence[int]) -> int:
        """The prompts the category runs answer: the kept ones, on each of the two servers."""
        return 2 * len(kept) if self.groups(kept) else 0

    def measure(
        self, server: VllmServer, prompts: list[list[Message]], kept: Sequence[int], counted: bool
    ) -> None:
        """Each category's kept prompts answered as a run of their own on `server`, greedy; `counted` (the
        draft server): with the spec-decode counters' difference over each run."""
        runs = self.draft if counted else self.baseline
        for name, indices in self.groups(kept).items():
            ask = [prompts[i] for i in indices]
            run = counted_run(self.ctx, server, ask, None, counted)
            server.check()
            runs[name] = run
            logger.info(
                "%s, category %s: %d prompts, %d output tokens in %.1f s",
                "draft" if counted else "baseline", name, len(ask), run.output_tokens, run.seconds,
            )  # fmt: skip

    def rows(self, kept: Sequence[int]) -> list[dict[str, Any]] | None:
        """The result's `categories` (None without category runs)."""
        sizes = {name: len(indices) for name, indices in self.groups(kept).items()}
        return category_rows(sizes, self.draft, self.baseline, self.ctx.params.num_speculative_tokens)


def category_rows(
    sizes: Mapping[str, int],
    draft: Mapping[str, Measurement],
    baseline: Mapping[str, Measurement],
    k: int,
) -> list[dict[str, Any]] | None:
    """One row per category with a draft run: its prompts, counters, acceptance, output tokens/s and speedup
    over the verifier alone's run (None where that was not measured). Pure. Contradictory counters are a
    StageError, as the main run's; a category whose answers gave the draft nothing to verify has no
    acceptance (null)."""
    if not draft:
        return None
    rows = []
    for name, prompts in sizes.items():
        run = draft.get(name)
        if run is None:
            continue
        alone = baseline.get(name)
        speed, base_speed = run.tokens_per_second, alone.tokens_per_second if alone is not None else None
        rows.append(
            {
                "category": name,
                "prompts": prompts,
                **acceptance_columns(run, name, k),
                "outputTokens": run.output_tokens,
                "outputTokensPerSecond": round(speed, 2) if speed else None,
                "speedup": round(speed / base_speed, 4)
                if speed and base_speed and prompts >= MIN_TIMED_PROMPTS
                else None,
            }
        )
    return rows


def acceptance_columns(run: Measurement, name: str, k: int) -> dict[str, Any]:
    counters = run.counters
    if counters is None:
        return {"drafts": None, "acceptedTokens": None, "acceptanceLength": None, "acceptanceRate": None}
    problems = consistency_problems(counters, k)
    if problems:
        raise StageError(
            f"vLLM's speculative-decoding counters over category {name}'s run contradict each other: "
            f"{'; '.join(problems)}"
        )
    columns: dict[str, Any] = {"drafts": int(counters.drafts), "acceptedTokens": int(counters.accepted)}
    try:
        acceptance = Acceptance.from_counters(counters)
    except ValueError:  # no drafts: every answer of the category was one token
        return columns | {"acceptanceLength": None, "acceptanceRate": None}
    return columns | {
        "acceptanceLength": round(acceptance.length, 6),
        "acceptanceRate": round(acceptance.rate, 6),
    }

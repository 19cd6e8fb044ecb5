"""evaluate's sweep of the speculation length (`evaluation.sweep`): per k and concurrency, the output tokens/s
and the mean acceptance length, against the verifier alone, and the batch-size schedule they justify.

A cell is one k of sweep.numSpeculativeTokens at one concurrency c of evaluation.concurrencies, measured in
evaluation.rounds rounds (`eagle3_pipeline.stages.evaluate.rounds`): each round sends the same held-out
prompts (sweep.prompts, default max(2c, 8)), c requests in flight, greedy, at most evaluation.maxTokens new
tokens each, to the verifier alone and to the verifier with the draft at every k, the order rotating. The
cell's speedup is the median of its rounds' ratios with that median's 95 % interval
(eagle3_contract.api.comparison), its output tokens/s the median of its rounds, its mean acceptance length
the spec-decode counters' differences summed over its rounds (`eagle3_pipeline.serving.spec_metrics`). A
baseline cell is the median of the verifier alone's rounds at c (once a round, every k pairing with it).
The prompts are the first
held-out ones, capped at what the validation split has; only when it has fewer than c are they reused
cyclically (the result's message says so), so that c requests are in flight.

Servers: evaluate's (`eagle3_pipeline.stages.evaluate.servers`): the verifier alone and the draft at
evaluation's k are the ones evaluate measured with, still warm; every other k's server comes up for its
rounds. The verifier alone and every k's server are up together, in one set of rounds (each round
measures the verifier alone once, not once per k); where they cannot be up together (an accelerator),
each server is measured alone in turn and rounds pair by index. Every server answers the rounds' prompts
once with one token before its rounds (not measured): every round measures with the prompts' prefixes
cached. vLLM's default max-num-seqs is at least
MIN_DEFAULT_MAX_NUM_SEQS (its CPU default; 256 to 1024 on GPUs): a larger concurrency passes
--max-num-seqs to every server of the stage (`servers.server_options`).

The result's `speculation` is an `eagle3_contract.api.speculation.SpeculationTable`: the cells with their
comparisons, the baselines, and `plan_schedule`'s best k per batch-size range (k 0 where no k's interval
clears 1; `notDistinguishable` where one looked faster without clearing it), which
`serving.speculationLength: tuned` serves. Progress counts the rounds' prompts; one log line per cell.
"""

from __future__ import annotations

import itertools
import logging
import statistics
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_contract.api.comparison import DEFAULT_ROUNDS, NOISY_SPREAD, Verdict, compare_rounds
from eagle3_contract.api.speculation import (
    BaselineCell,
    SpeculationRange,
    SpeculationTable,
    SweepCell,
    plan_schedule,
    undecided,
)
from eagle3_contract.params import EvaluateParams, EvaluateTuning
from eagle3_contract.vllm_command import draft_speculative_config
from eagle3_pipeline.data.draft_checkpoint import checkpoint_method
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.requests import Message
from eagle3_pipeline.serving.spec_metrics import Acceptance, SpecDecodeCounters, consistency_problems
from eagle3_pipeline.serving.vllm_server import VllmServer
from eagle3_pipeline.stages.evaluate.rounds import (
    Arm,
    interleave,
    interleave_settled,
    long_enough,
    warm,
)
from eagle3_pipeline.stages.evaluate.servers import ALONE, ServerPool, draft_key

logger = logging.getLogger(__name__)

Context = StageContext[EvaluateParams, EvaluateTuning]

MIN_PROMPTS_PER_CELL = 8
PROMPTS_PER_REQUEST_IN_FLIGHT = 2
FAILED_EXAMPLES = 2


def prompts_wanted(params: EvaluateParams) -> int:
    """The held-out prompts the sweep asks for: the largest cell's (0 without a sweep)."""
    if params.sweep is None or not params.concurrencies:
        return 0
    return max(cell_size(params, c) for c in params.concurrencies)


def cell_size(params: EvaluateParams, concurrency: int) -> int:
    """sweep.prompts, default max(2 x concurrency, MIN_PROMPTS_PER_CELL)."""
    assert params.sweep is not None
    if params.sweep.prompts is not None:
        return params.sweep.prompts
    return max(PROMPTS_PER_REQUEST_IN_FLIGHT * concurrency, MIN_PROMPTS_PER_CELL)


def cell_prompts(held_out: list[list[Message]], wanted: int, concurrency: int) -> list[list[Message]]:
    """The first `wanted` held-out prompts, capped at those there are; reused cyclically only to fill
    `concurrency` requests in flight."""
    count = max(min(wanted, len(held_out)), concurrency)
    return list(itertools.islice(itertools.cycle(held_out), count))


@dataclass
class SpeculationSweep:
    """The sweep's plan (the prompts of each concurrency) and what it measured so far."""

    ctx: Context
    prompts: dict[int, list[list[Message]]]  # by concurrency, ascending
    ks: list[int]
    held_out: int
    source: list[list[Message]] = field(default_factory=list)  # the held-out prompts the cells come from
    left_out: int = 0  # of those, screened out as degenerate
    cells: list[SweepCell] = field(default_factory=list)
    baseline_rounds: list[tuple[int, float]] = field(default_factory=list)  # (concurrency, tokens/s)
    extended: list[int] = field(default_factory=list)  # the ks whose rounds were extended once
    failures: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, ctx: Context, held_out: list[list[Message]]) -> SpeculationSweep | None:
        """The sweep of `ctx.params` over `held_out` prompts; None when evaluation.sweep is unset."""
        params = ctx.params
        if params.sweep is None or not params.concurrencies:
            return None
        if not held_out:
            raise StageError(
                "evaluation.sweep needs held-out prompts; set dataset.validationFraction above 0"
            )
        ks = sorted(set(params.sweep.num_speculative_tokens))
        return cls(ctx, cls.plan(ctx, held_out), ks, len(held_out), list(held_out))

    @staticmethod
    def plan(ctx: Context, held_out: list[list[Message]]) -> dict[int, list[list[Message]]]:
        params = ctx.params
        concurrencies = sorted(set(params.concurrencies or ()))
        return {c: cell_prompts(held_out, cell_size(params, c), c) for c in concurrencies}

    def leave_out(self, degenerate: list[int]) -> None:
        """Drop the held-out prompts (indices into `source`) whose answers the screening found degenerate, as
        evaluate's own runs do: a looping answer would flatter every k. Before any cell is measured."""
        gone = set(degenerate)
        kept = [p for i, p in enumerate(self.source) if i not in gone]
        if not gone or not kept:
            return
        self.prompts, self.held_out, self.left_out = self.plan(self.ctx, kept), len(kept), len(gone)

    @property
    def total_prompts(self) -> int:
        """The prompts the rounds answer: every k's and the verifier alone's, at every concurrency, in
        every round."""
        rounds = self.ctx.params.rounds or DEFAULT_ROUNDS
        return (1 + len(self.ks)) * rounds * sum(len(p) for p in self.prompts.values())

    # --- the servers ------------------------------------------------------------------------------------

    def run(self, draft: Path, source: Path, pool: ServerPool) -> None:
        """Every k's rounds against the verifier alone's, the draft's slim copy at `draft` (of train's
        checkpoint `source`): paired on servers up together, or each server in turn where they cannot be (an
        accelerator: `eagle3_pipeline.stages.evaluate.rounds`). The servers come from `pool`: the verifier
        alone and the draft at evaluation's k are the ones evaluate measured with, still warm."""
        if pool.together:
            self._paired(draft, source, pool)
        else:
            self._in_turn(draft, source, pool)

    def _paired(self, draft: Path, source: Path, pool: ServerPool) -> None:
        """The verifier alone and every k's server up together, all in the same rounds: each round measures
        the verifier alone once, and every k's ratio pairs with it."""
        rounds, max_tokens = self.ctx.params.rounds or DEFAULT_ROUNDS, self.ctx.params.max_tokens
        progress = self.ctx.progress
        with ExitStack() as stack:
            base = stack.enter_context(pool.serve(ALONE, None, "vllm-sweep-baseline.log"))
            alone = Arm("verifier alone", base, False)
            drafted = {
                k: Arm(f"k={k}", stack.enter_context(self.server(draft, source, k, pool)), True)
                for k in self.ks
            }
            for arm in (alone, *drafted.values()):
                warm(arm.server, self.prompts)
            prompts = long_enough(base, self.prompts, max_tokens)
            self.grow(prompts)

            def settled() -> bool:
                return all(
                    decided(alone.speeds.get(c, []), arm.speeds.get(c, []))
                    for arm in drafted.values()
                    for c in self.prompts
                )

            # the rounds' prompts repeated to last long enough (`prompts`), not the cells' own
            arms = [alone, *drafted.values()]
            if interleave_settled(arms, prompts, rounds, max_tokens, progress, settled, warmed=True):
                self.extended += self.ks
            for arm in arms:
                arm.server.check()
        self.record_alone(alone)
        for k, arm in drafted.items():
            self.record(k, alone, arm)

    def _in_turn(self, draft: Path, source: Path, pool: ServerPool) -> None:
        """One server at a time: the verifier alone's rounds, then each k's; rounds pair by their index."""
        rounds, max_tokens = self.ctx.params.rounds or DEFAULT_ROUNDS, self.ctx.params.max_tokens
        progress = self.ctx.progress
        with pool.serve(ALONE, None, "vllm-sweep-baseline.log") as base:
            alone = Arm("verifier alone", base, False)
            warm(base, self.prompts)
            prompts = long_enough(base, self.prompts, max_tokens)
            self.grow(prompts)
            interleave([alone], prompts, rounds, max_tokens, progress, warmed=True)
        for k in self.ks:
            with self.server(draft, source, k, pool) as server:
                drafted = Arm(f"k={k}", server, True)
                interleave([drafted], prompts, rounds, max_tokens, progress)
            self.record(k, alone, drafted)
        self.record_alone(alone)

    def grow(self, prompts: dict[int, list[list[Message]]]) -> None:
        """The progress total, once the rounds' prompts are repeated to last long enough."""
        rounds = self.ctx.params.rounds or DEFAULT_ROUNDS
        more = sum(len(p) for p in prompts.values()) - sum(len(p) for p in self.prompts.values())
        if more > 0:
            self.ctx.progress.grow_total((1 + len(self.ks)) * rounds * more)

    def server(
        self, draft: Path, source: Path, k: int, pool: ServerPool
    ) -> AbstractContextManager[VllmServer]:
        """The draft's server at k: evaluate's own at its k (kept up), another k's for its rounds only."""
        config = draft_speculative_config(str(draft), k, checkpoint_method(draft))
        keep = k == self.ctx.params.num_speculative_tokens
        return pool.serve(draft_key(source, k), config, f"vllm-sweep-k{k}.log", keep=keep)

    def record_alone(self, alone: Arm) -> None:
        """The verifier alone's rounds: the baselines (once, whatever the number of k's beside them)."""
        self.failures += alone.failures
        self.baseline_rounds += [(c, s) for c, speeds in alone.speeds.items() for s in speeds if s]

    def record(self, k: int, alone: Arm, drafted: Arm) -> None:
        """k's cells from its rounds and the verifier alone's beside them."""
        self.failures += drafted.failures
        for concurrency in self.prompts:
            comparison = compare_rounds(
                alone.speeds.get(concurrency, []), drafted.speeds.get(concurrency, [])
            )
            acceptance = self.acceptance(drafted.counters.get(concurrency), k)
            speed_ = drafted.speed(concurrency)
            cell = SweepCell(
                num_speculative_tokens=k,
                concurrency=concurrency,
                acceptance_length=round(acceptance.length, 4) if acceptance is not None else None,
                output_tokens_per_second=round(speed_, 2) if speed_ else None,
                speedup=comparison.ratio if comparison is not None else None,
                comparison=comparison,
            )
            self.cells.append(cell)
            logger.info(
                "sweep k=%d concurrency %d: %s output tokens/s, acceptance length %s, speedup %s",
                k, concurrency, cell.output_tokens_per_second, cell.acceptance_length,
                comparison.text() if comparison is not None else "n/a",
            )  # fmt: skip

    def acceptance(self, counters: SpecDecodeCounters | None, k: int) -> Acceptance | None:
        """A cell's acceptance from its rounds' counters; None when the draft proposed nothing."""
        if counters is None or counters.drafts <= 0:
            return None
        problems = consistency_problems(counters, k)
        if problems:
            raise StageError(
                f"vLLM's speculative-decoding counters contradict each other at k={k}: {'; '.join(problems)}"
            )
        return Acceptance.from_counters(counters)

    # --- the result -------------------------------------------------------------------------------------

    def table(self) -> SpeculationTable:
        """The cells with their speedups, the baselines, and the schedule they justify."""
        cells = sorted(self.cells, key=lambda c: (c.num_speculative_tokens, c.concurrency))
        return SpeculationTable(cells=cells, baselines=self.baselines(), schedule=plan_schedule(cells))

    def baselines(self) -> list[BaselineCell]:
        """The verifier alone per concurrency: the median of all its rounds (beside every k)."""
        out = []
        for concurrency in self.prompts:
            speeds = sorted(s for c, s in self.baseline_rounds if c == concurrency)
            tps = statistics.median(speeds) if speeds else None
            out.append(BaselineCell(concurrency=concurrency, output_tokens_per_second=speed(tps)))
        return out

    def notes(self) -> list[str]:
        """What the table does not say: undecided ranges, noisy cells, reused prompts, failed requests."""
        out: list[str] = [*undecided_notes(self.table().schedule), *noisy_notes(self.cells)]
        if self.extended:
            ks = ", ".join(map(str, self.extended))
            out.append(f"the sweep doubled the rounds of k {ks}: the first rounds did not decide")
        if self.left_out:
            out.append(f"the sweep leaves out the {self.left_out} prompts screened as degenerate")
        cycled = [c for c, p in self.prompts.items() if len(p) > self.held_out]
        if cycled:
            out.append(
                f"the sweep reuses the {self.held_out} held-out prompts cyclically to keep concurrency "
                f"{', '.join(map(str, cycled))} in flight"
            )
        if self.failures:
            examples = "; ".join(self.failures[:FAILED_EXAMPLES])
            out.append(
                f"{len(self.failures)} sweep requests failed (their cells are slower), e.g. {examples}"
            )
        return out


def decided(alone: list[float | None], drafted: list[float | None]) -> bool:
    """Whether a cell's rounds decide: an interval clear of 1 and rounds within the noise bound."""
    comparison = compare_rounds(alone, drafted)
    return (
        comparison is not None
        and not comparison.noisy
        and comparison.verdict() is not Verdict.NOT_DISTINGUISHABLE
    )


def undecided_notes(schedule: list[SpeculationRange]) -> list[str]:
    """`batch sizes 1-2: k 3 not distinguishable from the verifier alone, 1.08x [0.93, 1.21] ...`."""
    return [
        f"batch sizes {r.min_batch_size}-{r.max_batch_size}: k {r.measured_k} not distinguishable from the "
        f"verifier alone, {r.comparison.text() if r.comparison is not None else 'n/a'}: speculation stays off"
        for r in undecided(schedule)
    ]


def noisy_notes(cells: list[SweepCell]) -> list[str]:
    """The cells whose rounds disagree beyond the noise bound: flagged (their intervals decide, wide)."""
    noisy = [c for c in cells if c.comparison is not None and c.comparison.noisy]
    if not noisy:
        return []
    named = ", ".join(
        f"k {c.num_speculative_tokens} at concurrency {c.concurrency} ({c.comparison.spread:.0%})"
        for c in noisy
        if c.comparison is not None
    )
    return [
        f"noisy sweep cells (rounds vary beyond {NOISY_SPREAD:.0%}, after doubling their rounds): {named}: "
        "the machine was busy; their intervals are wide, and more rounds (evaluation.rounds) or a quieter "
        "node narrow them"
    ]


def speed(tokens_per_second: float | None) -> float | None:
    """A cell's output tokens/s, rounded; None when it produced nothing."""
    return round(tokens_per_second, 2) if tokens_per_second else None

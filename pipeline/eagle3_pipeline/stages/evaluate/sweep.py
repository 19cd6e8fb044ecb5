"""evaluate's sweep of the speculation length (`evaluation.sweep`): per k and concurrency, the output tokens/s
and the mean acceptance length, against the verifier alone, and the batch-size schedule they justify.

A cell is one k of sweep.numSpeculativeTokens at one concurrency c of evaluation.concurrencies: held-out
prompts (sweep.prompts, default max(2c, 8)), c requests in flight, greedy, at most evaluation.maxTokens new
tokens each, sent to the verifier served with the draft at k. Its output tokens/s is the cell's output
tokens over its wall seconds; its mean acceptance length is the spec-decode counters' difference over the
cell (`eagle3_pipeline.serving.spec_metrics`). The baseline is the same at each c on the verifier alone, and a
cell's speedup is its tokens/s over the baseline's at that c. The prompts are the first held-out ones, capped
at what the validation split has; only when it has fewer than c are they reused cyclically (the result's
message says so), so that c requests are in flight.

Servers: evaluate's own draft server (at evaluation.numSpeculativeTokens) measures that k's cells and its
baseline server the baselines; every other k gets a server of its own, one at a time (each is stopped before
the next starts). Before its cells a server answers the cells' prompts once with one token (not measured):
every server measures with the prompts' prefixes cached, as evaluate's own servers have them from the
main run. vLLM's default max-num-seqs is at least MIN_DEFAULT_MAX_NUM_SEQS (its CPU default; 256 to 1024
on GPUs): a larger concurrency passes --max-num-seqs to every server of the stage.

The result's `speculation` is an `eagle3_contract.api.speculation.SpeculationTable`: the cells, the
baselines, and `plan_schedule`'s best k per batch-size range (k 0 where no k beat the baseline), which
`serving.speculationLength: tuned` serves. Progress counts the cells' prompts; one log line per cell.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_contract.api.speculation import BaselineCell, SpeculationTable, SweepCell, plan_schedule
from eagle3_contract.params import EvaluateParams, EvaluateTuning
from eagle3_contract.vllm_command import draft_speculative_config
from eagle3_pipeline.data.draft_checkpoint import checkpoint_method
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.requests import (
    Measurement,
    Message,
    answer_all,
    read_counters,
    settled_counters,
)
from eagle3_pipeline.serving.spec_metrics import Acceptance, consistency_problems
from eagle3_pipeline.serving.vllm_server import VllmServer

logger = logging.getLogger(__name__)

Context = StageContext[EvaluateParams, EvaluateTuning]

MIN_PROMPTS_PER_CELL = 8
PROMPTS_PER_REQUEST_IN_FLIGHT = 2
MIN_DEFAULT_MAX_NUM_SEQS = 128  # vLLM 0.32's smallest default (its CPU backend's, for one API server)
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


def server_options(params: EvaluateParams) -> list[str]:
    """--max-num-seqs where a concurrency exceeds vLLM's smallest default (none otherwise: the command
    stays the serving Deployment's)."""
    largest = max(params.concurrencies or (0,)) if params.sweep is not None else 0
    return ["--max-num-seqs", str(largest)] if largest > MIN_DEFAULT_MAX_NUM_SEQS else []


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
    baselines: list[BaselineCell] = field(default_factory=list)
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
        """The prompts the cells answer: every k's and the baseline's, at every concurrency."""
        return (len(self.ks) + 1) * sum(len(p) for p in self.prompts.values())

    # --- the servers ------------------------------------------------------------------------------------

    def measure_draft(self, server: VllmServer, k: int) -> None:
        """k's cells on a server with the draft at k (evaluate's own, or one of `measure_other_ks`)."""
        if k not in self.ks:
            return
        self.warm(server)
        for concurrency, prompts in self.prompts.items():
            run = self.cell(server, prompts, concurrency, counted=True)
            acceptance = self.acceptance(run, k)
            cell = SweepCell(
                num_speculative_tokens=k,
                concurrency=concurrency,
                acceptance_length=round(acceptance.length, 4) if acceptance is not None else None,
                output_tokens_per_second=speed(run),
            )
            self.cells.append(cell)
            logger.info(
                "sweep k=%d concurrency %d: %d prompts, %s output tokens/s, acceptance length %s",
                k, concurrency, len(prompts), cell.output_tokens_per_second, cell.acceptance_length,
            )  # fmt: skip

    def measure_baseline(self, server: VllmServer) -> None:
        """The baseline cells, on evaluate's server of the verifier alone."""
        self.warm(server)
        for concurrency, prompts in self.prompts.items():
            run = self.cell(server, prompts, concurrency, counted=False)
            self.baselines.append(BaselineCell(concurrency=concurrency, output_tokens_per_second=speed(run)))
            logger.info(
                "sweep baseline concurrency %d: %d prompts, %s output tokens/s",
                concurrency, len(prompts), self.baselines[-1].output_tokens_per_second,
            )  # fmt: skip

    def measure_other_ks(self, draft: Path, served: int) -> None:
        """The cells of every k but `served` (evaluate's draft server's), one server each, in turn."""
        params, tuning = self.ctx.params, self.ctx.tuning
        engine = params.verifier.engine(tuning.tensor_parallel_size)
        for k in self.ks:
            if k == served:
                continue
            config = draft_speculative_config(str(draft), k, checkpoint_method(draft))
            log = self.ctx.work / f"vllm-draft-k{k}.log"
            with VllmServer(
                self.ctx, engine, seed=tuning.seed, speculative_config=config, log_path=log,
                options=server_options(params),
            ) as server:  # fmt: skip
                self.measure_draft(server, k)
                server.check()

    def warm(self, server: VllmServer) -> None:
        """Every cell prompt once, one token each, not measured: the prompts' prefixes are cached."""
        largest = max(self.prompts.values(), key=len)
        concurrency = max(self.prompts)
        asyncio.run(answer_all(server, largest, 1, None, None, concurrency))

    def cell(
        self, server: VllmServer, prompts: list[list[Message]], concurrency: int, counted: bool
    ) -> Measurement:
        before = read_counters(server) if counted else None
        run = asyncio.run(
            answer_all(server, prompts, self.ctx.params.max_tokens, self.ctx.progress, None, concurrency)
        )
        server.check()
        if counted:
            after = settled_counters(server, before, run.output_tokens)
            run.counters = after - before if before is not None else after
        self.failures += run.failures
        return run

    def acceptance(self, run: Measurement, k: int) -> Acceptance | None:
        """The cell's acceptance from its counters' difference; None when the draft proposed nothing."""
        counters = run.counters
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
        base = {b.concurrency: b.output_tokens_per_second for b in self.baselines}
        cells = [
            c.model_copy(update={"speedup": speedup(c.output_tokens_per_second, base.get(c.concurrency))})
            for c in sorted(self.cells, key=lambda c: (c.num_speculative_tokens, c.concurrency))
        ]
        return SpeculationTable(cells=cells, baselines=self.baselines, schedule=plan_schedule(cells))

    def notes(self) -> list[str]:
        """What the table does not say: reused prompts, failed requests."""
        out: list[str] = []
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


def speed(run: Measurement) -> float | None:
    """A cell's output tokens/s; None when it produced nothing."""
    tps = run.tokens_per_second
    return round(tps, 2) if tps else None


def speedup(tokens_per_second: float | None, baseline: float | None) -> float | None:
    if not tokens_per_second or not baseline:
        return None
    return round(tokens_per_second / baseline, 4)

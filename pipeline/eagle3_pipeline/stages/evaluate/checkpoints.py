"""Which of train's drafts evaluate measures, and which one it keeps: training.checkpointSelection
acceptance (the last epochs, the most accepted) and draft.candidates (each method's best, the fastest).

Validation loss picks speculators' `checkpoint_best`, but what a run is for is the tokens vLLM accepts, and
that can peak before the loss stops falling. With `evaluation.checkpointsToEvaluate` N (the stage's
param, from training.checkpointsToEvaluate), evaluate serves each of train's last N epochs' checkpoints on
the kept held-out prompts (greedy, at evaluation.numSpeculativeTokens, one vLLM server each) and keeps the
most accepted: ties go to the lower validation loss, then to the later epoch. The chosen one is measured
in full (sampling, sweep) and export ships it. With draft.candidates, each method's best checkpoint (by its
validation loss) is served the same way, and the one with the most output tokens/s at evaluate's
concurrency ships (ties: the more accepted). Pure: the program measures, this module reads train's
result and chooses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_contract.results import TrainResult
from eagle3_pipeline.data.draft_checkpoint import missing_files
from eagle3_pipeline.runtime.context import read_result
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.requests import Measurement

CHECKPOINTS_DIR = "checkpoints"  # train's: checkpoints/<epoch>/ for every epoch
ACCEPTANCE = "acceptance"  # CheckpointChoice.by: training.checkpointSelection acceptance


@dataclass(frozen=True)
class Candidate:
    """One epoch's checkpoint in train's output, with its validation loss (and, for draft.candidates, its
    method: the candidate's best epoch)."""

    epoch: int
    checkpoint: str  # relative to train's output
    val_loss: float | None
    method: str | None = None

    def path(self, train_output: Path) -> Path:
        return train_output / self.checkpoint


@dataclass(frozen=True)
class Measured:
    """A candidate's greedy figures on the kept prompts (None: vLLM was never asked for a draft token)."""

    candidate: Candidate
    acceptance_length: float | None
    acceptance_rate: float | None
    output_tokens_per_second: float | None
    run: Measurement | None = field(default=None, compare=False, repr=False)  # the greedy run itself


def candidates(train_output: Path, last: int) -> list[Candidate]:
    """Train's last `last` epochs, oldest first (none for `last` 0); a StageError when one's checkpoint is
    missing."""
    if last <= 0:
        return []
    epochs = read_result(train_output).get("epochs") or []
    if not epochs:
        raise StageError(f"train's result in {train_output} lists no epochs: re-run stage train")
    chosen = [
        Candidate(int(e["epoch"]), f"{CHECKPOINTS_DIR}/{int(e['epoch'])}", _finite(e.get("valLoss")))
        for e in epochs[-last:]
    ]
    for c in chosen:
        missing = missing_files(c.path(train_output))
        if missing:
            raise StageError(
                f"train's checkpoint of epoch {c.epoch} ({c.path(train_output)}) has no "
                f"{', '.join(missing)}: checkpoint selection by acceptance needs every epoch's "
                "checkpoint; re-run stage train"
            )
    return chosen


def trained_candidates(train_output: Path) -> list[Candidate]:
    """draft.candidates: each method's best checkpoint, as train's result lists them (none without)."""
    result = TrainResult.parse(read_result(train_output))
    listed = result.candidates if result is not None else None
    chosen = [Candidate(c.best_epoch or 0, c.checkpoint, c.best_val_loss, c.method) for c in listed or []]
    for c in chosen:
        missing = missing_files(c.path(train_output))
        if missing:
            raise StageError(
                f"train's candidate {c.method} ({c.path(train_output)}) has no {', '.join(missing)}: "
                "re-run stage train"
            )
    return chosen


def choose(measured: list[Measured]) -> Measured:
    """The most accepted (ties: the lower validation loss, then the later epoch). draft.candidates are
    chosen by speed in the bake-off (eagle3_pipeline.stages.evaluate.bakeoff), not here."""
    if not measured:
        raise ValueError("no checkpoint was measured")

    def finite(value: float | None) -> float:
        return value if value is not None else -math.inf

    def key(m: Measured) -> tuple[float, ...]:
        loss = m.candidate.val_loss
        return (finite(m.acceptance_length), -loss if loss is not None else -math.inf, m.candidate.epoch)

    return max(measured, key=key)


def choice_document(measured: list[Measured], chosen: Measured, val_loss_epoch: int | None) -> dict[str, Any]:
    """The result's `checkpointSelection` (eagle3_contract.results.CheckpointChoice), by acceptance."""
    return {
        "by": ACCEPTANCE,
        "epoch": chosen.candidate.epoch,
        "checkpoint": chosen.candidate.checkpoint,
        "valLossEpoch": val_loss_epoch,
        "checkpoints": [
            {
                "epoch": m.candidate.epoch,
                "checkpoint": m.candidate.checkpoint,
                **({"method": m.candidate.method} if m.candidate.method is not None else {}),
                "valLoss": m.candidate.val_loss,
                "acceptanceLength": _rounded(m.acceptance_length),
                "acceptanceRate": _rounded(m.acceptance_rate),
                "outputTokensPerSecond": _rounded(m.output_tokens_per_second, 3),
            }
            for m in measured
        ],
    }


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _rounded(value: float | None, digits: int = 6) -> float | None:
    return round(value, digits) if value is not None else None

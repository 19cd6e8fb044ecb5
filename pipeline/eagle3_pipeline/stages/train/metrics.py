"""Per-epoch training metrics, taken from speculators' own metric records.

speculators' trainer logs each training step and each validation epoch as a mapping to the
`speculators.metrics` logger, the records its TensorBoard, wandb, trackio and MLflow backends consume:

  {"train": {"loss", "loss_<k>", "full_acc_<k>", "cond_acc_<k>", ...}, "profile": {"step_ms", "tokens_per_s",
   ...}, "epoch": e, "lr": lr, "global_step": s}                                       (one per step)
  {"val": {"loss_epoch", "loss_<k>_epoch", "full_acc_<k>_epoch", "cond_acc_<k>_epoch", ...}, "epoch": e}

for each TTT step (draft position) k. `MetricsRecorder` is one more such backend: it averages an epoch's
steps and, when the epoch's validation record arrives (after speculators saved the epoch's checkpoint),
appends one line to `metrics.jsonl`:

  epoch, trainLoss, valLoss, trainAccuracyByPosition, valAccuracyByPosition, valFullAccuracyByPosition,
  valLossByPosition, estimatedAcceptanceLength, trainSteps, trainTokens, trainSeconds, seconds, learningRate,
  speculatorsVal (speculators' validation record as logged)

`*AccuracyByPosition` is the conditional accuracy (`cond_acc_k`: position k right, given positions < k were
right), the per-position acceptance rate of greedy verification; `valFullAccuracyByPosition` is `full_acc_k`.
`estimatedAcceptanceLength` = 1 + a0 + a0*a1 + ... with a_k = valAccuracyByPosition[k]: a proxy of vLLM's
mean acceptance length at temperature 0 with as many speculative tokens as TTT steps. A P-EAGLE draft logs
`position_<d>_acc` instead (depth d's proposal right, whatever the depths before it; no per-position loss):
its `*AccuracyByPosition` are those, so the same product treats the depths as independent, a rough proxy
that evaluate's measurement in vLLM replaces.

Given a `progress` sink (eagle3_pipeline.stages.train.events.TrainSink: the stage's reporter, or the events
file of a torchrun worker), rank 0 also tells it every step (global step, loss, tokens: rank 0's times the
world size, the ranks' batches being packed to the same length) and every validated epoch.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagle3_pipeline.stages.train.events import TrainSink

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SPECULATORS_METRICS_LOGGER = "speculators.metrics"
DIGITS = 6
Epoch = dict[str, Any]


@dataclass
class _Accumulator:
    """Sums of one epoch's per-step training records."""

    started: float = field(default_factory=time.monotonic)
    steps: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    tokens: float = 0.0
    step_seconds: float = 0.0
    lr: Any = None

    def add(self, record: Mapping[str, Any]) -> None:
        self.steps += 1
        for key, value in record.get("train", {}).items():
            if isinstance(value, int | float):
                self.sums[key] = self.sums.get(key, 0.0) + float(value)
        profile = record.get("profile") or {}
        step_ms, rate = profile.get("step_ms"), profile.get("tokens_per_s")
        if isinstance(step_ms, int | float) and isinstance(rate, int | float):
            self.step_seconds += step_ms / 1000
            self.tokens += rate * step_ms / 1000  # speculators' tokens_per_s = non-padding tokens / step time
        self.lr = record.get("lr")

    def mean(self, key: str) -> float | None:
        return self.sums[key] / self.steps if key in self.sums and self.steps else None


def by_position(values: Mapping[str, Any], template: str, start: int = 0) -> list[float]:
    """[values[template.format(start)], values[template.format(start + 1)], ...] while the keys exist."""
    out: list[float] = []
    while (value := values.get(template.format(start + len(out)))) is not None:
        out.append(_round(float(value)))
    return out


def acceptance_length(conditional: list[float]) -> float:
    """1 + a0 + a0*a1 + ...: the expected tokens per verification step, from conditional accuracies."""
    total, run = 1.0, 1.0
    for accuracy in conditional:
        run *= accuracy
        total += run
    return _round(total)


def accuracy_by_position(values: Mapping[str, Any], suffix: str = "") -> list[float]:
    """EAGLE-3's conditional accuracy by position (`cond_acc_<k>`), else P-EAGLE's accuracy by depth
    (`position_<d>_acc`: each depth's proposal against the verifier's token there, from the real context),
    else DFlash's by block position (`position <i> acc`, from 1: position 0 is the anchor, not drafted)."""
    return (
        by_position(values, "cond_acc_{}" + suffix)
        or by_position(values, "position_{}_acc" + suffix)
        or by_position(values, "position_{}_acc" + suffix, start=1)
    )


def estimated_acceptance_length(val: Mapping[str, Any], accuracy: list[float]) -> float:
    """DFlash's own expected accepted length (`eal`: the mean accepted run per block plus the bonus token,
    counted per block) where speculators reports it; else 1 + a0 + a0*a1 + ... from `accuracy`."""
    eal = val.get("eal_epoch")
    return _round(float(eal)) if eal is not None else acceptance_length(accuracy)


def epoch_line(epoch: int, acc: _Accumulator, val: Mapping[str, Any]) -> Epoch:
    train_means = {k: acc.sums[k] / acc.steps for k in acc.sums} if acc.steps else {}
    val_acc = accuracy_by_position(val, "_epoch")
    train_loss = acc.mean("loss")
    return {
        "epoch": epoch,
        "trainLoss": _round(train_loss) if train_loss is not None else None,
        "valLoss": _round(float(val["loss_epoch"])),
        "trainAccuracyByPosition": accuracy_by_position(train_means),
        "valAccuracyByPosition": val_acc,
        "valFullAccuracyByPosition": by_position(val, "full_acc_{}_epoch"),
        "valLossByPosition": by_position(val, "loss_{}_epoch"),
        "estimatedAcceptanceLength": estimated_acceptance_length(val, val_acc),
        "trainSteps": acc.steps,
        "trainTokens": round(acc.tokens),
        "trainSeconds": _round(acc.step_seconds),
        "seconds": _round(time.monotonic() - acc.started),
        "learningRate": acc.lr,
        "speculatorsVal": dict(val),
    }


class MetricsRecorder(logging.Handler):
    """A speculators metric backend writing one `metrics.jsonl` line per epoch (on rank 0 only)."""

    def __init__(
        self,
        path: Path,
        is_writer: Callable[[], bool] = lambda: True,
        progress: TrainSink | None = None,
        world_size: int = 1,
    ) -> None:
        super().__init__(logging.INFO)
        self.path = path
        self.is_writer = is_writer
        self.progress = progress
        self.world_size = world_size
        self.current: dict[int, _Accumulator] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.msg
        if not isinstance(message, Mapping) or not isinstance(message.get("epoch"), int):
            return  # hyperparameters and anything else
        epoch: int = message["epoch"]
        if "train" in message:
            acc = self.current.setdefault(epoch, _Accumulator())
            tokens = acc.tokens
            acc.add(message)
            if self.progress is not None and self.is_writer():
                self._step(message, acc.tokens - tokens)
        elif "val" in message and self.is_writer():
            line = epoch_line(epoch, self.current.pop(epoch, _Accumulator()), message["val"])
            append_line(self.path, line)
            if self.progress is not None:
                self.progress.train_epoch(
                    epoch + 1,
                    line["valLoss"],
                    line["valAccuracyByPosition"],
                    line["estimatedAcceptanceLength"],
                )
            logger.info(
                "epoch %d: train loss %s, val loss %.4f, val accuracy by position %s, "
                "estimated acceptance length %.3f (%d steps, %.1f s)",
                epoch + 1,  # people count epochs from 1, as the progress does; metrics.jsonl keeps the index
                line["trainLoss"],
                line["valLoss"],
                line["valAccuracyByPosition"],
                line["estimatedAcceptanceLength"],
                line["trainSteps"],
                line["seconds"],
            )

    def _step(self, message: Mapping[str, Any], tokens: float) -> None:
        assert self.progress is not None
        step, loss = message.get("global_step"), (message.get("train") or {}).get("loss")
        if isinstance(step, int):  # speculators logs a step before counting it
            loss = float(loss) if isinstance(loss, int | float) else None
            self.progress.train_steps(step + 1, loss, tokens=round(tokens * self.world_size))


@contextmanager
def recording(
    path: Path,
    is_writer: Callable[[], bool] = lambda: True,
    progress: TrainSink | None = None,
    world_size: int = 1,
) -> Iterator[MetricsRecorder]:
    """Attach a MetricsRecorder to speculators' metric logger for the block.

    The metric logger stops propagating meanwhile: its per-step mappings would flood the console otherwise
    (speculators' own console handler formats them; ours would print them raw). The recorder logs a summary
    line per epoch instead.
    """
    metrics_logger = logging.getLogger(SPECULATORS_METRICS_LOGGER)
    recorder = MetricsRecorder(path, is_writer, progress, world_size)
    saved = metrics_logger.level, metrics_logger.propagate
    metrics_logger.addHandler(recorder)
    metrics_logger.setLevel(logging.INFO)  # whatever the root level: the records are data, not chatter
    metrics_logger.propagate = False
    try:
        yield recorder
    finally:
        metrics_logger.removeHandler(recorder)
        metrics_logger.setLevel(saved[0])
        metrics_logger.propagate = saved[1]


def append_line(path: Path, line: Epoch) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_epochs(path: Path) -> list[Epoch]:
    """The complete epoch lines of `path`, by epoch (the last line wins); a torn last line is ignored."""
    if not path.is_file():
        return []
    epochs: dict[int, Epoch] = {}
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            logger.warning("%s:%d is not a complete line (a killed attempt?); ignoring it", path, number)
            continue
        if isinstance(line, dict) and isinstance(line.get("epoch"), int):
            epochs[line["epoch"]] = line
    return [epochs[e] for e in sorted(epochs)]


def write_epochs(path: Path, epochs: list[Epoch]) -> None:
    """Replace `path` with exactly `epochs`, atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in epochs), encoding="utf-8")
    os.replace(tmp, path)


def best_epoch(epochs: list[Epoch]) -> Epoch:
    """The epoch with the lowest validation loss (the earliest on a tie, as speculators' checkpoint_best)."""
    return min(epochs, key=lambda e: (e["valLoss"], e["epoch"]))


def summarize(epochs: list[Epoch]) -> dict[str, Any]:
    """The result's training figures: every epoch (without speculators' raw record) and the best one."""
    best = best_epoch(epochs)
    tokens = sum(e["trainTokens"] for e in epochs)
    seconds = sum(e["trainSeconds"] for e in epochs)
    return {
        "epochs": [{k: v for k, v in e.items() if k != "speculatorsVal"} for e in epochs],
        "bestEpoch": best["epoch"],
        "bestValLoss": best["valLoss"],
        "valAccuracyByPosition": best["valAccuracyByPosition"],
        "estimatedAcceptanceLength": best["estimatedAcceptanceLength"],
        "trainTokensPerSecond": round(tokens / seconds, 1) if seconds > 0 else None,
    }


def _round(value: float) -> float:
    return round(value, DIGITS) if math.isfinite(value) else value

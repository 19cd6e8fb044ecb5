"""Resuming a training run after its last complete epoch, in the stage and in every torchrun (re)start.

speculators' Trainer resumes from the highest numbered checkpoint directory in its save path (weights,
optimizer and scheduler state), `interrupted/` aside. An epoch counts as complete here when it has both its
checkpoint and its metrics line: a kill between the two, or during a save, leaves an epoch that must be
trained again. `keep_complete_epochs` runs before each start of the trainer: in the stage before it trains
(its result's `resumedFromEpoch`), and in the process that is global rank 0 before torchrun's workers
(re)start, since a restart after a worker died does not pass through the stage again.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from eagle3_pipeline.stages.train.metrics import Epoch, best_epoch, read_epochs, write_epochs

logger = logging.getLogger(__name__)

BEST = "checkpoint_best"
WEIGHTS = "model.safetensors"


def keep_complete_epochs(save_path: Path, metrics: Path) -> int:
    """Keep the epochs an earlier attempt completed (0..k, each with a checkpoint and a metrics line).

    Returns how many; the rest goes. speculators resumes from the highest numbered checkpoint directory, so a
    half-written one or one without its validation must go; so must `interrupted/` (SIGTERM).
    """
    epochs = read_epochs(metrics)
    complete: list[Epoch] = []
    for index, epoch in enumerate(epochs):
        if epoch["epoch"] != index or not (save_path / str(index) / WEIGHTS).is_file():
            break
        complete.append(epoch)
    if metrics.exists():
        write_epochs(metrics, complete)
    if save_path.is_dir():
        for child in sorted(save_path.iterdir()):
            stale = child.name == "interrupted" or (child.name.isdigit() and int(child.name) >= len(complete))
            if stale and child.is_dir() and not child.is_symlink():
                logger.info("train: removing %s (an incomplete epoch of an earlier attempt)", child)
                shutil.rmtree(child)
        for child in save_path.iterdir():
            if child.is_symlink() and not child.exists():
                child.unlink()
    if complete:
        repair_best(save_path, complete)
        logger.info("train: resuming after epoch %d (epochs counted from 1)", len(complete))
    return len(complete)


def repair_best(save_path: Path, epochs: list[Epoch]) -> None:
    """Point `checkpoint_best` at the epoch with the lowest validation loss among `epochs`.

    speculators moves it after each validation; a kill between our metrics line and that move leaves it
    behind, and a resumed run would compare against the wrong best loss.
    """
    from speculators.train.checkpointer import SingleGPUCheckpointer

    best = best_epoch(epochs)["epoch"]
    checkpointer = SingleGPUCheckpointer(save_path)
    if checkpointer.read_best_epoch() == best and checkpointer.val_metrics_path(best).is_file():
        return
    logger.info("train: %s -> %d (epoch %d, the lowest validation loss)", BEST, best, best + 1)
    checkpointer.save_val_metrics(best, best_epoch(epochs)["speculatorsVal"])
    checkpointer.update_best_symlink(best)

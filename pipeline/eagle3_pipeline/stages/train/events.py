"""Training progress from torchrun's workers to the stage program's reporter, through a small events file.

Trained in the stage's own process, speculators' metric records reach the stage's StageReporter directly
(train_metrics.MetricsRecorder calls it). Under torchrun (training.gpus > 1, training.nodes > 1) they arise
in the worker that is global rank 0, another process, possibly on another node: it appends them to
`progress.jsonl` in the stage's work directory (on the shared volume, like metrics.jsonl) and the stage
program replays them into its reporter. Lines:

  {"plan": {"epochs", "steps_per_epoch", "step", "epochs_done"}}         when the trainer is built
  {"steps": {"step", "loss", "steps", "tokens"}}                         at most every FLUSH_SECONDS
  {"epoch": {"epochs_done", "val_loss", "accuracy", "acceptance"}}       per validated epoch

Steps are summed in memory and written at most every FLUSH_SECONDS (their mean loss and summed tokens), so
the file grows by a few lines a minute whatever the step rate.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

logger = logging.getLogger(__name__)

EVENTS_FILE = "progress.jsonl"
FLUSH_SECONDS = 2.0
POLL_SECONDS = 1.0


class TrainSink(Protocol):
    """Where training figures go: eagle3_pipeline.runtime.reporter.StageReporter, or an EventsWriter."""

    def train_plan(
        self, epochs: int, steps_per_epoch: int | None, step: int = 0, epochs_done: int = 0
    ) -> None: ...

    def train_steps(self, step: int, loss: float | None = None, steps: int = 1, tokens: int = 0) -> None: ...

    def train_epoch(
        self, epochs_done: int, val_loss: float | None, accuracy: Sequence[float], acceptance: float | None
    ) -> None: ...


class EventsWriter:
    """A TrainSink appending to the events file (opened at the first event: ranks above 0 never touch it)."""

    def __init__(self, path: Path, flush_seconds: float = FLUSH_SECONDS) -> None:
        self.path = path
        self.flush_seconds = flush_seconds
        self._file: IO[str] | None = None
        self._pending: dict[str, Any] | None = None
        self._loss_sum, self._loss_steps = 0.0, 0
        self._flushed = time.monotonic()

    def train_plan(
        self, epochs: int, steps_per_epoch: int | None, step: int = 0, epochs_done: int = 0
    ) -> None:
        self._write({"plan": {"epochs": epochs, "steps_per_epoch": steps_per_epoch, "step": step,
                              "epochs_done": epochs_done}})  # fmt: skip

    def train_steps(self, step: int, loss: float | None = None, steps: int = 1, tokens: int = 0) -> None:
        pending = self._pending or {"steps": 0, "tokens": 0}
        pending["step"] = step
        pending["steps"] += steps
        pending["tokens"] += tokens
        if loss is not None:
            self._loss_sum += loss * steps
            self._loss_steps += steps
        self._pending = pending
        if time.monotonic() - self._flushed >= self.flush_seconds:
            self.flush()

    def train_epoch(
        self, epochs_done: int, val_loss: float | None, accuracy: Sequence[float], acceptance: float | None
    ) -> None:
        self.flush()
        self._write({"epoch": {"epochs_done": epochs_done, "val_loss": val_loss, "accuracy": list(accuracy),
                               "acceptance": acceptance}})  # fmt: skip

    def flush(self) -> None:
        """Write the steps summed since the last flush."""
        self._flushed = time.monotonic()
        pending, self._pending = self._pending, None
        if pending is None:
            return
        mean = self._loss_sum / self._loss_steps if self._loss_steps else None
        self._loss_sum, self._loss_steps = 0.0, 0
        self._write({"steps": {**pending, "loss": mean}})

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, event: dict[str, Any]) -> None:
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(event) + "\n")
        self._file.flush()


def replay(event: dict[str, Any], sink: TrainSink) -> None:
    """One line of the events file, told to `sink`."""
    if "plan" in event:
        p = event["plan"]
        sink.train_plan(int(p["epochs"]), p.get("steps_per_epoch"), int(p["step"]), int(p["epochs_done"]))
    elif "steps" in event:
        s = event["steps"]
        sink.train_steps(int(s["step"]), s.get("loss"), int(s["steps"]), int(s["tokens"]))
    elif "epoch" in event:
        e = event["epoch"]
        sink.train_epoch(
            int(e["epochs_done"]), e.get("val_loss"), e.get("accuracy") or [], e.get("acceptance")
        )


class EventsFollower:
    """Reads the events file's new complete lines every POLL_SECONDS on a thread and replays them."""

    def __init__(self, path: Path, sink: TrainSink, poll_seconds: float = POLL_SECONDS) -> None:
        self.path, self.sink, self.poll_seconds = path, sink, poll_seconds
        self._offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="train-progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop following, after replaying what the file holds now."""
        self._stop.set()
        self._thread.join()
        self.read()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self.read()

    def read(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            try:
                replay(json.loads(line), self.sink)
            except (ValueError, KeyError, TypeError) as exc:  # progress is never worth failing a stage
                logger.warning("%s: skipping a progress line (%s)", self.path, exc)


@contextlib.contextmanager
def relayed(path: Path, sink: TrainSink) -> Iterator[None]:
    """Replay `path` into `sink` while the block runs (torchrun); the file is new for the block, and gone
    after it (a stage output holds no progress file)."""
    path.unlink(missing_ok=True)
    follower = EventsFollower(path, sink)
    follower.start()
    try:
        yield
    finally:
        follower.stop()
        path.unlink(missing_ok=True)

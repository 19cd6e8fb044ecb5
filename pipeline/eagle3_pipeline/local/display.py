"""What `eagle3 run` shows while it runs: one live line per stage, from the stage program's own metrics.

The local executor gives each stage subprocess a free loopback port in `EAGLE3_METRICS_PORT`; a
`MetricsPoller` reads its /metrics about twice a second (eagle3_contract.stage_metrics parses it; a program
that does not answer yet is simply asked again) and hands the figures to the run's observers:
- `TerminalDisplay`: rich's live progress, one line per stage (name, bar, done/total unit, rate, ETA, and
  the epoch and loss of train), the program's own lines printed above it, each line finished with the
  stage's outcome (done in Xs, reused, skipped, failed);
- `PlainDisplay` (stderr is not a terminal: CI, `| tee`): the program's lines as they come and one line per
  stage when it ends; `LogDisplay` is the same as log records (--log-format json);
(eagle3_pipeline.local.status records the same events in a file for `eagle3 status FILE`.)
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from eagle3_contract.api.status import StageProgress
from eagle3_contract.log_format import ENV_LOG_FORMAT
from eagle3_contract.results import StageResult, TrainResult
from eagle3_contract.stage_metrics import METRICS_PATH, eta_text, parse_progress

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.5
POLL_TIMEOUT_S = 0.5
RECORD_EVERY_S = 1.0  # the status file is rewritten at most this often for progress alone


@dataclass
class StageOutcome:
    stage: str
    status: str  # done | cached | skipped | failed
    seconds: float = 0.0
    attempts: int = 0
    result: StageResult | None = None  # the stage's result.json, typed (eagle3_contract.results)
    note: str = ""
    progress: StageProgress | None = None  # the last figures its metrics endpoint gave


def fetch_progress(url: str, timeout: float = POLL_TIMEOUT_S) -> StageProgress | None:
    """The progress at a stage program's metrics `url`; None while it does not answer or reports none."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode("utf-8", errors="replace")
        return parse_progress(text)
    except (OSError, ValueError):
        return None


def metrics_url(host: str, port: int) -> str:
    return f"http://{host}:{port}{METRICS_PATH}"


class MetricsPoller:
    """Reads one stage program's metrics every `interval` seconds in a thread until stopped."""

    def __init__(
        self, url: str, on_progress: Callable[[StageProgress], None], interval: float = POLL_SECONDS
    ) -> None:
        self.url, self.on_progress, self.interval = url, on_progress, interval
        self.last: StageProgress | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stage-metrics", daemon=True)

    def __enter__(self) -> MetricsPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.interval + POLL_TIMEOUT_S + 1.0)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            progress = fetch_progress(self.url)
            if progress is None or progress == self.last:
                continue
            self.last = progress
            try:
                self.on_progress(progress)
            except Exception:  # a display error must not end the polling
                logger.debug("showing the progress of %s failed", self.url, exc_info=True)


def completed(progress: StageProgress | None, result: StageResult | None = None) -> StageProgress | None:
    """The figures of a stage that succeeded: every unit and epoch done. The last poll may be up to half a
    second old when the program ends (its metrics end with it), before train's last validation: its losses,
    estimated acceptance and steps are then the result's last epoch's (metrics.jsonl's), not the poll's (the
    demo's line once said `val loss 1.949`, the epoch before the last, while the stage logged 1.728)."""
    if progress is None:
        return None
    update: dict[str, Any] = {"eta_seconds": None}
    if progress.total:
        update["done"] = progress.total
    if progress.epochs:
        update["epochs_done"] = progress.epochs
    epochs = result.epochs if isinstance(result, TrainResult) else None
    if epochs:
        last = epochs[-1]
        update |= {"train_loss": last.train_loss, "val_loss": last.val_loss}
        update["estimated_acceptance_length"] = last.estimated_acceptance_length
        steps = [e.train_steps for e in epochs]
        if progress.unit == "steps" and all(s is not None for s in steps):
            update["done"] = update["total"] = sum(s for s in steps if s is not None)
    return progress.model_copy(update=update)


# --- the words of a line ------------------------------------------------------------------------------------


def count_text(progress: StageProgress | None) -> str:
    """`120/400 rows`, `120 rows` (no total yet), or ''."""
    if progress is None:
        return ""
    if progress.total:
        return f"{progress.done}/{progress.total} {progress.unit}"
    return f"{progress.done} {progress.unit}"


def rate_text(progress: StageProgress | None) -> str:
    if progress is None or progress.rate is None:
        return ""
    rate = progress.rate
    figure = f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"
    return f"{figure} {progress.unit}/s"


def train_text(progress: StageProgress | None) -> str:
    """train's figures: `epoch 3/6 loss 0.886 val loss 1.96` (epochs done of training.epochs; the last
    finished epoch's validation loss: the result's bestValLoss is the lowest over the epochs); '' for another
    stage."""
    if progress is None or not progress.epochs:
        return ""
    words = [f"epoch {progress.epochs_done or 0}/{progress.epochs}"]
    if progress.train_loss is not None:
        words.append(f"loss {progress.train_loss:.4g}")
    if progress.val_loss is not None:
        words.append(f"val loss {progress.val_loss:.4g}")
    return " ".join(words)


def progress_fields(progress: StageProgress | None) -> dict[str, str]:
    """The live line's columns: count, rate, eta, extra."""
    eta = eta_text(progress.eta_seconds) if progress is not None else None
    return {
        "count": count_text(progress),
        "rate": rate_text(progress),
        "eta": f"ETA {eta}" if eta else "",
        "extra": train_text(progress),
    }


def outcome_text(outcome: StageOutcome) -> str:
    """How a stage ended: `done in 12.3s`, `reused (prepare/45e1f6d11156)`, `skipped: ...`, `failed: ...`."""
    attempts = f" ({outcome.attempts} attempts)" if outcome.attempts > 1 else ""
    if outcome.status == "done":
        return f"done in {outcome.seconds:.1f}s{attempts}"
    if outcome.status == "cached":
        return f"reused ({outcome.note})" if outcome.note else "reused"
    if outcome.status == "skipped":
        return f"skipped: {outcome.note}" if outcome.note else "skipped"
    note = f": {outcome.note}" if outcome.note else ""
    return f"failed after {outcome.seconds:.1f}s{attempts}{note}"


def final_line(outcome: StageOutcome) -> str:
    """The one line a stage leaves: `train     done in 137.2s  6/6 epochs  epoch 6/6 loss 0.498`."""
    fields = progress_fields(outcome.progress)
    words = [outcome_text(outcome), fields["count"], fields["extra"]]
    return f"{outcome.stage:<8}  " + "  ".join(w for w in words if w)


# --- the observers ------------------------------------------------------------------------------------------


class RunObserver:
    """What the executor tells about a run; every method does nothing here."""

    def stage_started(self, stage: str, output_dir: str, attempt: int) -> None:
        """An attempt of `stage` starts (attempt 1, 2, ... after an out-of-memory exit)."""

    def stage_progress(self, stage: str, progress: StageProgress) -> None:
        """New figures from the stage program's metrics."""

    def stage_output(self, stage: str, line: str) -> None:
        """A line the stage program wrote to stderr."""

    def stage_finished(self, outcome: StageOutcome) -> None:
        """The stage ended: done, reused (cached), skipped or failed."""

    def close(self, error: str | None = None) -> None:
        """The run ended (`error`: why it stopped short)."""


class Observers(RunObserver):
    """Tells every observer, in order."""

    def __init__(self, observers: Sequence[RunObserver]) -> None:
        self.observers = list(observers)

    def stage_started(self, stage: str, output_dir: str, attempt: int) -> None:
        for o in self.observers:
            o.stage_started(stage, output_dir, attempt)

    def stage_progress(self, stage: str, progress: StageProgress) -> None:
        for o in self.observers:
            o.stage_progress(stage, progress)

    def stage_output(self, stage: str, line: str) -> None:
        for o in self.observers:
            o.stage_output(stage, line)

    def stage_finished(self, outcome: StageOutcome) -> None:
        for o in self.observers:
            o.stage_finished(outcome)

    def close(self, error: str | None = None) -> None:
        for o in self.observers:
            o.close(error)


class PlainDisplay(RunObserver):
    """For a stream that is no terminal: a header when a stage starts, its program's lines, one final line."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def _write(self, text: str) -> None:
        stream = self._stream or sys.stderr
        with self._lock:
            stream.write(text + "\n")
            stream.flush()

    def stage_started(self, stage: str, output_dir: str, attempt: int) -> None:
        again = f", attempt {attempt}" if attempt > 1 else ""
        self._write(f"==> stage {stage} ({output_dir}{again})")

    def stage_output(self, stage: str, line: str) -> None:
        self._write(line)

    def stage_finished(self, outcome: StageOutcome) -> None:
        self._write(final_line(outcome))


class LogDisplay(PlainDisplay):
    """--log-format json: the executor's own lines are log records (the programs' lines are theirs)."""

    def stage_started(self, stage: str, output_dir: str, attempt: int) -> None:
        logger.info("==> stage %s (%s, attempt %d)", stage, output_dir, attempt, extra={"stage": stage})

    def stage_finished(self, outcome: StageOutcome) -> None:
        summary = outcome.result.summary() if outcome.result is not None else {}
        extra = {"stage": outcome.stage, "outcome": outcome.status, "seconds": round(outcome.seconds, 1)}
        logger.info("%s", final_line(outcome), extra={**extra, "result": summary})


class TerminalDisplay(RunObserver):
    """rich's live progress on a terminal: one line per stage, the programs' lines printed above them."""

    def __init__(self, console: Any) -> None:
        from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn
        from rich.text import Text

        class Elapsed(
            ProgressColumn
        ):  # rich's TimeElapsedColumn stops at a full bar: this at the stage's end
            def render(self, task: Any) -> Text:
                seconds = int(task.elapsed or 0)
                return Text(f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}", style="dim")

        def text(name: str, style: str = "") -> TextColumn:
            return TextColumn(f"{{task.fields[{name}]}}", markup=False, style=style)

        self.progress = Progress(
            text("stage", "bold"),
            BarColumn(bar_width=24),
            text("count"),
            text("rate", "cyan"),
            text("eta", "yellow"),
            Elapsed(),
            text("extra"),
            console=console,
            refresh_per_second=4,
        )
        self.tasks: dict[str, Any] = {}
        self.progress.start()

    def _task(self, stage: str) -> Any:
        if stage not in self.tasks:
            blank: dict[str, Any] = dict.fromkeys(("count", "rate", "eta", "extra"), "")
            self.tasks[stage] = self.progress.add_task(stage, total=None, stage=f"{stage:<8}", **blank)
        return self.tasks[stage]

    def stage_started(self, stage: str, output_dir: str, attempt: int) -> None:
        task = self._task(stage)
        if attempt > 1:
            self.progress.update(task, extra=f"attempt {attempt}")

    def stage_progress(self, stage: str, progress: StageProgress) -> None:
        fields: dict[str, Any] = progress_fields(progress)
        self.progress.update(self._task(stage), total=progress.total, completed=progress.done, **fields)

    def stage_output(self, stage: str, line: str) -> None:
        from rich.text import Text

        self.progress.console.print(Text(line), highlight=False, soft_wrap=True)

    def stage_finished(self, outcome: StageOutcome) -> None:
        task = self._task(outcome.stage)
        fields = progress_fields(outcome.progress)
        shown: dict[str, Any] = {
            "count": fields["count"],
            "rate": "",
            "eta": "",
            "extra": outcome_text(outcome),
        }
        if outcome.status == "failed":
            self.progress.update(task, **shown)
        else:  # a full bar
            total = self.progress.tasks[task].total or 1
            self.progress.update(task, total=total, completed=total, **shown)
        self.progress.stop_task(task)

    def close(self, error: str | None = None) -> None:
        self.progress.stop()


def summary_table(outcomes: list[StageOutcome]) -> Any:
    """The table `eagle3 run` prints at the end: each stage's status, time and key figures."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="eagle3 run")
    for column in ("stage", "status", "seconds", "attempts", "result"):
        table.add_column(column)
    for o in outcomes:
        # each stage's model picks what its row shows (StageResult.summary); the rest is in result.json
        figures = o.result.summary() if o.result is not None else {}
        shown = [f"{k}={_plain(v)}" for k, v in figures.items()]
        text = ", ".join(shown) or o.note
        # Text, not str: a cell string is read as rich markup, and notes carry user text ('[bold]', '[/x]')
        status = "reused" if o.status == "cached" else o.status
        table.add_row(o.stage, status, f"{o.seconds:.1f}", str(o.attempts or ""), Text(text))
    return table


def figure_text(value: Any) -> str:
    """A table cell's figure: thousands separated."""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def _plain(value: Any) -> str:
    """A value of a `key=value` list: no thousands separators (a comma there reads as the list's own)."""
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def display_for(console: Any) -> RunObserver:
    """What shows the run: log records in --log-format json, rich's live lines on a terminal, else plain
    lines (CI, `| tee`)."""

    if os.environ.get(ENV_LOG_FORMAT) == "json":
        return LogDisplay()
    if console.is_terminal:
        return TerminalDisplay(console)
    return PlainDisplay()

"""`eagle3 status RUN|FILE`: one table of a run's stages, for an Eagle3Run in the cluster (`RUN`, read as
`kubectl get e3r RUN -o yaml` would) and for a local run (`FILE`, its manifest: the artifacts directory and
what `eagle3 run` records there). Both sides hand over an Eagle3RunStatus (eagle3_contract.api.status), so
one renderer shows both; `rows` and `headline` are pure functions of it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eagle3_contract.api.status import (
    Condition,
    ConditionType,
    Eagle3RunStatus,
    RunPhase,
    StagePhase,
    StageProgress,
    StageStatus,
)
from eagle3_contract.cli_types import positive_seconds
from eagle3_contract.results import EvaluateResult, StageResult, TrainResult, parse_result
from eagle3_contract.stage_metrics import eta_text, summary
from eagle3_contract.stages import ORDER, Stage

# A watched run stops being watched in these phases (Serving once Ready: the rollout is done).
FINAL_PHASES = (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.INVALID)
COLUMNS = ("stage", "phase", "progress", "rate", "ETA", "attempts", "duration", "result")
MESSAGE_CHARS = 160
SUMMARY_FIGURES = 3  # of a stage's summary fields (eagle3_contract.results), the first ones
ALWAYS_SHOWN = ("stage", "phase", "result")  # the other columns only where a row has a value

Reader = Callable[[], tuple[str, Eagle3RunStatus]]


@dataclass(frozen=True)
class Row:
    stage: str
    phase: str
    progress: str
    rate: str
    eta: str
    attempts: str
    duration: str
    result: str


def _time(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def duration_text(seconds: float | None) -> str:
    """`45s`, `12m05s`, `3h20m`."""
    if seconds is None or seconds < 0:
        return ""
    s = round(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _seconds(entry: StageStatus, result: StageResult | None, now: datetime) -> float | None:
    started, finished = _time(entry.start_time), _time(entry.completion_time)
    if started is not None and (finished is not None or entry.phase == StagePhase.RUNNING):
        return ((finished or now) - started).total_seconds()
    return result.seconds if result is not None else None


def _figure(value: Any) -> str:
    """A value of a `key=value` list: no thousands separators (a comma there reads as the list's own)."""
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def _train_text(result: TrainResult | None, progress: StageProgress | None) -> str:
    """train's epochs, validation loss and estimated acceptance: the result's once it finished, else its
    live progress."""
    if result is not None and result.epochs is not None:
        epochs_text = f"{len(result.epochs)} epochs"
    elif progress is not None and progress.epochs:
        epochs_text = f"epoch {progress.epochs_done or 0}/{progress.epochs}"
    else:
        epochs_text = ""
    live_loss = progress.val_loss if progress is not None else None
    live_accept = progress.estimated_acceptance_length if progress is not None else None
    loss = (
        result.best_val_loss
        if result is not None and "best_val_loss" in result.model_fields_set
        else live_loss
    )
    accept = result.estimated_acceptance_length if result is not None else None
    accept = live_accept if accept is None else accept
    words = [epochs_text, _loss_text(result, loss)]
    words.append(f"est. acceptance {accept:.3g}" if accept is not None else "")
    return ", ".join(w for w in words if w)


def _loss_text(result: TrainResult | None, loss: float | None) -> str:
    """A finished run's lowest validation loss with its epoch (counted from 1, as the progress counts them):
    `best val loss 1.91 (epoch 4)`; a running one's last epoch's: `val loss 1.96`."""
    if loss is None:
        return ""
    if result is None or "best_val_loss" not in result.model_fields_set:
        return f"val loss {loss:.4g}"
    at = f" (epoch {result.best_epoch + 1})" if result.best_epoch is not None else ""
    return f"best val loss {loss:.4g}{at}"


def _at(result: EvaluateResult) -> str:
    """Where the headline speedup was measured: ` at k=3, 4 in flight`."""
    at = [f"k={result.num_speculative_tokens}"] if result.num_speculative_tokens is not None else []
    at += [f"{result.speedup_concurrency} in flight"] if result.speedup_concurrency is not None else []
    return f" at {', '.join(at)}" if at else ""


def result_text(stage: str, result: StageResult | None, progress: StageProgress | None) -> str:
    """The key figures: train's epochs, validation loss and estimated acceptance, evaluate's acceptance
    length; the other stages' summary fields (eagle3_contract.results)."""
    if stage == Stage.TRAIN and (result is not None or progress is not None):
        return _train_text(result if isinstance(result, TrainResult) else None, progress)
    if result is None:
        return ""
    if isinstance(result, EvaluateResult) and result.acceptance_length is not None:
        words = [f"acceptance length {result.acceptance_length:.3g}"]
        if result.speedup is not None:
            words.append(f"speedup {result.speedup:.3g}x{_at(result)}")
        return ", ".join(words)
    figures = list(result.summary().items())[:SUMMARY_FIGURES]
    return ", ".join(f"{k}={_figure(v)}" for k, v in figures)


def stage_row(stage: str, entry: StageStatus, now: datetime) -> Row:
    phase = entry.phase.value
    progress = entry.progress
    result = parse_result(stage, entry.result) if entry.result else None
    running = entry.phase == StagePhase.RUNNING
    rate = f"{progress.rate:.3g} {progress.unit}/s" if running and progress and progress.rate else ""
    eta = (eta_text(progress.eta_seconds) or "") if running and progress else ""
    shown = summary(stage, progress).removeprefix(stage).strip() if progress else ""
    figures = result_text(stage, result, progress)
    blocked = entry.blocked_by
    failed_or_skipped = entry.phase in (StagePhase.FAILED, StagePhase.SKIPPED)
    message = (blocked.message if blocked is not None else None) or (
        entry.message if failed_or_skipped else None
    )
    if message:
        text = " ".join(message.split())
        text = text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."
        figures = f"{figures}; {text}" if figures else text
    return Row(
        stage=stage,
        phase=f"{phase} ({blocked.reason})" if blocked is not None and blocked.reason else phase,
        progress=shown,
        rate=rate,
        eta=eta,
        attempts=str(entry.attempts) if entry.attempts else "",
        duration=duration_text(_seconds(entry, result, now)),
        result=figures,
    )


def rows(status: Eagle3RunStatus, now: datetime | None = None) -> list[Row]:
    """One row per stage of `status`, in the stages' order."""
    now = now or datetime.now(UTC)
    stages = status.stages
    order = [s.value for s in ORDER if s.value in stages] + [s for s in stages if s not in set(ORDER)]
    return [stage_row(stage, stages[stage], now) for stage in order]


def _ready(status: Eagle3RunStatus) -> Condition | None:
    return next((c for c in status.conditions if c.type == ConditionType.READY), None)


def headline(title: str, status: Eagle3RunStatus) -> str:
    """`Eagle3Run ns/tiny: Running, Ready False, train 3/6 ep, ETA 2m (reason: message)`."""
    ready = _ready(status)
    words = [f"{title}: {status.phase.value}", f"Ready {ready.status if ready is not None else 'Unknown'}"]
    if status.progress:
        words.append(status.progress)
    if status.eta:
        words.append(f"ETA {status.eta}")
    if status.acceptance_length is not None:
        words.append(f"acceptance length {status.acceptance_length:.3g}")
    line = ", ".join(words)
    if ready is not None and ready.status != "True" and ready.message:
        line += f" ({ready.reason}: {ready.message})"
    return line


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def prediction_lines(status: Eagle3RunStatus) -> list[str]:
    """status.plan.prediction in a few lines: a line per acceptance length, the break-even, the verdict."""
    prediction = status.plan.prediction if status.plan is not None else None
    if prediction is None or not prediction.lengths:
        return []
    columns = " / ".join(str(c) for c in prediction.concurrencies)
    k = prediction.num_speculative_tokens
    lines = [f"predicted speedup ({prediction.method}, k={k}) at concurrency {columns}:"]
    for row in prediction.lengths:
        speedups = " / ".join(_ratio(x) for x in row.speedup)
        lines.append(f"  acceptance length {row.acceptance_length:.2f}: {speedups}  ({row.source})")
    evens = " / ".join(f"{b:.2f}" if b is not None else "never" for b in prediction.break_even)
    lines.append(f"  break-even acceptance length: {evens}")
    if prediction.verdict:
        lines.append(f"  {prediction.verdict}")
    return lines


def finished(status: Eagle3RunStatus) -> bool:
    """Nothing more will happen without a change: a final phase, or Serving and Ready."""
    ready = _ready(status)
    serving_ready = status.phase == RunPhase.SERVING and ready is not None and ready.status == "True"
    return status.phase in FINAL_PHASES or serving_ready


def _columns(table_rows: list[Row]) -> list[int]:
    """The indexes of the columns to show: stage, phase, result, and any other that has a value."""
    cells = [astuple(r) for r in table_rows]
    return [i for i, c in enumerate(COLUMNS) if c in ALWAYS_SHOWN or any(row[i] for row in cells)]


def plain_table(title: str, status: Eagle3RunStatus, now: datetime | None = None) -> str:
    """The table as aligned text (where rich is not installed: the operator's image)."""
    found = rows(status, now)
    shown = _columns(found)
    table = [[COLUMNS[i] for i in shown]] + [[astuple(r)[i] for i in shown] for r in found]
    widths = [max(len(line[i]) for line in table) for i in range(len(shown))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in table
    ]
    return "\n".join([headline(title, status), *lines, *prediction_lines(status)]) + "\n"


def rich_table(title: str, status: Eagle3RunStatus, now: datetime | None = None) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    found = rows(status, now)
    shown = _columns(found)
    table = Table()
    for i in shown:
        wide = COLUMNS[i] == "result"
        table.add_column(COLUMNS[i], no_wrap=not wide, overflow="fold", ratio=1 if wide else None)
    for row in found:
        cells = astuple(row)
        table.add_row(*(Text(cells[i]) for i in shown))  # Text: messages are no markup
    return Group(Text(headline(title, status)), table, *(Text(line) for line in prediction_lines(status)))


def show(read: Reader, watch: bool, interval: float) -> int:
    """Print the table once, or re-draw it every `interval` seconds until the run is finished or Ctrl-C
    (in place on a terminal; one table after another elsewhere)."""
    try:
        from rich.console import Console
    except ImportError:  # the operator's image: aligned text
        return _show_one_by_one(read, watch, interval, None)
    console = Console()
    if not (watch and console.is_terminal):
        return _show_one_by_one(read, watch, interval, console)
    from rich.live import Live

    title, status = read()
    try:
        with Live(rich_table(title, status), console=console, auto_refresh=False) as live:
            while not finished(status):
                time.sleep(interval)
                title, status = read()
                live.update(rich_table(title, status), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0


def _show_one_by_one(read: Reader, watch: bool, interval: float, console: Any) -> int:
    try:
        while True:
            title, status = read()
            if console is not None:
                console.print(rich_table(title, status))
            else:
                sys.stdout.write(plain_table(title, status))
                sys.stdout.flush()
            if not watch or finished(status):
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def _status(args: argparse.Namespace) -> int:
    target = Path(args.target)
    local = target.is_file() or target.suffix in (".yaml", ".yml", ".json")
    if local:
        from eagle3_pipeline.commands import local_status_reader

        reader = local_status_reader(args.target, args.artifacts)
    else:
        from eagle3_operator.commands import cluster_status_reader

        reader = cluster_status_reader(args.target, args.namespace)
    try:
        return show(reader, args.watch, args.interval)
    except (ValueError, OSError, RuntimeError) as exc:  # what the readers raise, with their message
        sys.stderr.write(f"error: {exc}\n")
        return 1


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `status` on the `eagle3` command line."""
    status = sub.add_parser(
        "status",
        help="show a run's stages: phase, progress, rate, ETA, attempts, duration and key results",
        description="RUN: an Eagle3Run in the cluster (the kubeconfig's context, -n). FILE: a local run's "
        "manifest (what `eagle3 run FILE` ran: its artifacts directory, and its progress while it runs).",
    )
    status.add_argument("target", metavar="RUN|FILE", help="an Eagle3Run's name, or a manifest file")
    status.add_argument("-n", "--namespace", help="RUN's namespace (default: the kubeconfig context's)")
    status.add_argument("--artifacts", help="FILE's artifacts directory (default ./eagle3-artifacts/<name>)")
    status.add_argument(
        "-w", "--watch", action="store_true", help="re-draw until the run is finished or Ctrl-C"
    )
    status.add_argument(
        "--interval",
        type=positive_seconds,
        default=3.0,
        metavar="S",
        help="seconds between re-draws (default 3)",
    )
    status.set_defaults(func=_status)

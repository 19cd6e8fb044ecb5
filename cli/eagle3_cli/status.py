"""`eagle3 status`'s view of a run: one table of its stages, or its status as one JSON or YAML document.

The readers (eagle3_cli.status_command) hand over an `Observed`: the run's Eagle3RunStatus
(eagle3_contract.api.status), as the cluster or `eagle3 run` has it, so one renderer shows both; `rows`,
`headline` and `wrap_items` are pure functions of it.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import astuple, dataclass, field
from datetime import UTC, datetime
from typing import Any

from eagle3_cli.canary_lines import canary_lines
from eagle3_contract.api.categories import categories_line
from eagle3_contract.api.status import (
    Condition,
    ConditionType,
    Eagle3RunStatus,
    RunPhase,
    StagePhase,
    StageProgress,
    StageStatus,
)
from eagle3_contract.results import EvaluateResult, StageResult, TrainResult, parse_result
from eagle3_contract.stage_metrics import eta_text, summary
from eagle3_contract.stages import ORDER, Stage

# A watched run stops being watched in these phases (Serving once Ready: the rollout is done).
FINAL_PHASES = (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.INVALID)
COLUMNS = ("stage", "phase", "progress", "rate", "ETA", "attempts", "duration", "result")
MESSAGE_CHARS = 160
SUMMARY_FIGURES = 3  # of a stage's summary fields (eagle3_contract.results), the first ones
ALWAYS_SHOWN = ("stage", "phase", "result")  # the other columns only where a row has a value
RESULT_MIN_WIDTH = 20  # narrower than this (or than its longest word), the results go under the table
OUTPUTS = ("table", "json", "yaml")


@dataclass(frozen=True)
class Observed:
    """One read of a run: its table's title, its status, who it is (`-o json`'s keys beside `status`: name,
    and namespace or artifacts) and a note said under the headline (e.g. whether an operator runs)."""

    title: str
    status: Eagle3RunStatus
    identity: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def document(self) -> dict[str, Any]:
        """What `-o json` and `-o yaml` print: the identity and the status as the API shows it (camelCase)."""
        return self.identity | {"status": self.status.document()}


Reader = Callable[[], Observed]


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


def _speedup_text(result: EvaluateResult) -> str:
    """The headline speedup, where it was measured, and the interval of its paired rounds (`speedup 1.07x
    [0.98, 1.16] at k=3, 4 in flight`), or that it is the main runs' ratio, one unpaired run each."""
    compared = result.speedup_comparison()
    if compared is not None:
        return f"speedup {result.speedup:.3g}x [{compared.low:.3g}, {compared.high:.3g}]{_at(result)}"
    return f"speedup {result.speedup:.3g}x{_at(result)} (one run each, unpaired)"


def _at(result: EvaluateResult) -> str:
    """Where the headline speedup was measured: ` at k=3, 4 in flight`."""
    at = [f"k={result.num_speculative_tokens}"] if result.num_speculative_tokens is not None else []
    at += [f"{result.speedup_concurrency} in flight"] if result.speedup_concurrency is not None else []
    return f" at {', '.join(at)}" if at else ""


def result_text(stage: str, result: StageResult | None, progress: StageProgress | None) -> str:
    """The key figures: train's epochs, validation loss and estimated acceptance, evaluate's acceptance
    length (and, when it chose the epoch, each measured epoch's beside its validation loss); the other
    stages' summary fields (eagle3_contract.results)."""
    if stage == Stage.TRAIN and (result is not None or progress is not None):
        return _train_text(result if isinstance(result, TrainResult) else None, progress)
    if result is None:
        return ""
    if isinstance(result, EvaluateResult) and result.acceptance_length is not None:
        words = [f"acceptance length {result.acceptance_length:.3g}"]
        if result.speedup is not None:
            words.append(_speedup_text(result))
        if result.checkpoint_selection is not None:  # training.checkpointSelection acceptance
            words.append(result.checkpoint_selection.line())
        if result.incumbent is not None:  # evaluation.incumbent: the serving draft on the same prompts
            words.append(result.incumbent.line())
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


def category_lines(status: Eagle3RunStatus) -> list[str]:
    """status.checkpoint.categories: `acceptance per category: add 2.41 (0.47, 1.62x, 5 prompts); ...`."""
    rows = status.checkpoint.categories if status.checkpoint is not None else None
    return [f"acceptance per category: {categories_line(rows)}"] if rows else []


def finished(status: Eagle3RunStatus) -> bool:
    """Nothing more will happen without a change: a final phase, or Serving and Ready."""
    ready = _ready(status)
    serving_ready = status.phase == RunPhase.SERVING and ready is not None and ready.status == "True"
    return status.phase in FINAL_PHASES or serving_ready


def _columns(table_rows: list[Row]) -> list[int]:
    """The indexes of the columns to show: stage, phase, result, and any other that has a value."""
    cells = [astuple(r) for r in table_rows]
    return [i for i, c in enumerate(COLUMNS) if c in ALWAYS_SHOWN or any(row[i] for row in cells)]


def wrap_items(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters, broken between its items (a `, ` or `; ` ends one) and,
    inside an item longer than a line, between words; never inside a word (a longer one gets its own line)."""
    lines: list[str] = []
    line = ""
    for item in re.findall(r".+?(?:[,;] |$)", " ".join(text.split())):
        if len(item.rstrip()) > width:  # begun on this line, broken between its words
            *full, line = textwrap.wrap(line + item, width, break_long_words=False, break_on_hyphens=False)
            lines += full
            line += " " if item.endswith(" ") else ""
        elif len((line + item).rstrip()) <= width:
            line += item
        else:
            lines.append(line.rstrip())
            line = item
    if line.strip():
        lines.append(line.rstrip())
    return lines


def _result_width(table_rows: list[Row], room: int) -> int | None:
    """The result column's width in `room` characters, or None where a word of a result would not fit (or
    fewer than RESULT_MIN_WIDTH would): then each stage's result goes under the table."""
    words = [len(w) for r in table_rows for w in r.result.split()]
    return room if room >= max([RESULT_MIN_WIDTH, *words]) else None


def _results_under(table_rows: list[Row], width: int) -> list[str]:
    """The results of a table too narrow for them: `stage: result`, continued indented, between items."""
    lines = []
    for row in table_rows:
        if row.result:
            first, *rest = wrap_items(f"{row.stage}: {row.result}", width)
            lines += [first, *(f"  {line}" for line in wrap_items(" ".join(rest), width - 2))]
    return lines


def plain_table(
    title: str, status: Eagle3RunStatus, now: datetime | None = None, note: str = "", width: int | None = None
) -> str:
    """The table as aligned text (where rich is not installed: the operator's image); results wrapped in
    `width` columns (None: not wrapped). No stage observed: the headline and the note alone."""
    found = rows(status, now)
    shown = _columns(found)
    cells = [[astuple(r)[i] for i in shown] for r in found]
    under: list[str] = []
    if width is not None and found:
        others = sum(max(len(COLUMNS[i]), *(len(astuple(r)[i]) for r in found)) + 2 for i in shown[:-1])
        result_width = _result_width(found, width - others)
        if result_width is None:
            shown, under = shown[:-1], _results_under(found, width)
            cells = [line[:-1] for line in cells]
        else:
            cells = [
                part
                for line in cells
                for part in _continued(line[:-1], wrap_items(line[-1], result_width) or [""])
            ]
    table = [[COLUMNS[i] for i in shown], *cells]
    widths = [max(len(line[i]) for line in table) for i in range(len(shown))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in table
    ]
    lines = [*lines, *under] if found else []
    told = [note] if note else []
    extra = [*prediction_lines(status), *category_lines(status), *canary_lines(status)]
    return "\n".join([headline(title, status), *told, *lines, *extra]) + "\n"


def _continued(cells: list[str], result_lines: list[str]) -> Iterator[list[str]]:
    """A row whose result takes several lines: its cells, then blank cells beside each further line."""
    yield [*cells, result_lines[0]]
    for line in result_lines[1:]:
        yield [*([""] * len(cells)), line]


class _StageTable:
    """The rich table of the stages, laid out for the console's width when it is drawn: the result column
    wrapped between items, or the results under the table where their words would not fit beside it."""

    def __init__(self, table_rows: list[Row]) -> None:
        self.rows = table_rows

    def _table(self, shown: list[int], results: list[str] | None) -> Any:
        from rich.table import Table
        from rich.text import Text

        table = Table()
        for i in [*shown, *([len(COLUMNS) - 1] if results is not None else [])]:
            table.add_column(COLUMNS[i], no_wrap=True)
        for n, row in enumerate(self.rows):
            cells = [Text(astuple(row)[i]) for i in shown]  # Text: messages are no markup
            table.add_row(*cells, *([Text(results[n])] if results is not None else []))
        return table

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.measure import Measurement
        from rich.text import Text

        others = _columns(self.rows)[:-1]  # the result column is the last
        header = Measurement.get(console, options, self._table(others, [""] * len(self.rows))).maximum
        result_width = _result_width(self.rows, options.max_width - header + len(COLUMNS[-1]))
        if result_width is None:
            yield self._table(others, None)
            yield from (Text(line) for line in _results_under(self.rows, options.max_width))
            return
        results = ["\n".join(wrap_items(row.result, result_width)) for row in self.rows]
        yield self._table(others, results)


def rich_table(title: str, status: Eagle3RunStatus, now: datetime | None = None, note: str = "") -> Any:
    """The table for rich: the headline, the note, the stages (none: no table), the prediction and the
    canary."""
    from rich.console import Group
    from rich.text import Text

    found = rows(status, now)
    parts: list[Any] = [Text(headline(title, status))]
    parts += [Text(note)] if note else []
    parts += [_StageTable(found)] if found else []
    shown = [*prediction_lines(status), *category_lines(status), *canary_lines(status)]
    return Group(*parts, *(Text(line) for line in shown))

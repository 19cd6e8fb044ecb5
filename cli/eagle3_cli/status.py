"""`eagle3 status RUN|FILE`: one table of a run's stages, for an Eagle3Run in the cluster (`RUN`, read as
`kubectl get e3r RUN -o yaml` would) and for a local run (`FILE`, its manifest: the artifacts directory and
what `eagle3 run` records there). Both sides hand over a status in the Eagle3Run's shape (camelCase, as in
the object), so one renderer shows both; `rows` and `headline` are pure functions of that dict.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eagle3_contract.api.status import StageProgress
from eagle3_contract.results import parse_result
from eagle3_contract.stage_metrics import eta_text, summary
from eagle3_contract.stages import ORDER, Stage

# A watched run stops being watched in these phases (Serving once Ready: the rollout is done).
FINAL_PHASES = ("Succeeded", "Failed", "Invalid")
COLUMNS = ("stage", "phase", "progress", "rate", "ETA", "attempts", "duration", "result")
MESSAGE_CHARS = 160
SUMMARY_FIGURES = 3  # of a stage's summary fields (eagle3_contract.results), the first ones
ALWAYS_SHOWN = ("stage", "phase", "result")  # the other columns only where a row has a value

Reader = Callable[[], tuple[str, dict[str, Any]]]


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


def _time(text: Any) -> datetime | None:
    if not isinstance(text, str):
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


def _seconds(entry: Mapping[str, Any], now: datetime) -> float | None:
    started, finished = _time(entry.get("startTime")), _time(entry.get("completionTime"))
    if started is not None and (finished is not None or entry.get("phase") == "Running"):
        return ((finished or now) - started).total_seconds()
    for value in (entry.get("seconds"), (entry.get("result") or {}).get("seconds")):
        if isinstance(value, int | float):
            return float(value)
    return None


def _figure(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def result_text(stage: str, result: Mapping[str, Any] | None, progress: StageProgress | None) -> str:
    """The key figures: train's epochs, validation loss and estimated acceptance, evaluate's acceptance
    length; the other stages' summary fields (eagle3_contract.results)."""
    if stage == Stage.TRAIN and (result or progress):
        epochs = len(result["epochs"]) if result and isinstance(result.get("epochs"), list) else None
        if epochs is not None:  # the result's, once the stage finished
            epochs_text = f"{epochs} epochs"
        elif progress is not None and progress.epochs:
            epochs_text = f"epoch {progress.epochs_done or 0}/{progress.epochs}"
        else:
            epochs_text = ""
        loss = (result or {}).get("bestValLoss", progress.val_loss if progress else None)
        accept = (result or {}).get("estimatedAcceptanceLength")
        if accept is None and progress is not None:
            accept = progress.estimated_acceptance_length
        words = [epochs_text, f"val loss {loss:.4g}" if isinstance(loss, int | float) else ""]
        words.append(f"est. acceptance {accept:.3g}" if isinstance(accept, int | float) else "")
        return ", ".join(w for w in words if w)
    if not result:
        return ""
    if stage == Stage.EVALUATE and isinstance(result.get("acceptanceLength"), int | float):
        words = [f"acceptance length {result['acceptanceLength']:.3g}"]
        if isinstance(result.get("speedup"), int | float):
            words.append(f"speedup {result['speedup']:.3g}x")
        return ", ".join(words)
    try:
        parsed = parse_result(Stage(stage), dict(result))
    except ValueError:
        return ""
    figures = list((parsed.summary() if parsed is not None else {}).items())[:SUMMARY_FIGURES]
    return ", ".join(f"{k}={_figure(v)}" for k, v in figures)


def _progress(entry: Mapping[str, Any]) -> StageProgress | None:
    document = entry.get("progress")
    if not isinstance(document, Mapping):
        return None
    try:
        return StageProgress.model_validate(document)
    except ValueError:
        return None


def stage_row(stage: str, entry: Mapping[str, Any], now: datetime) -> Row:
    phase = str(entry.get("phase") or "Pending")
    progress = _progress(entry)
    running = phase == "Running"
    rate = f"{progress.rate:.3g} {progress.unit}/s" if running and progress and progress.rate else ""
    eta = (eta_text(progress.eta_seconds) or "") if running and progress else ""
    shown = summary(stage, progress).removeprefix(stage).strip() if progress else ""
    figures = result_text(stage, entry.get("result"), progress)
    blocked = entry.get("blockedBy") or {}
    message = blocked.get("message") or (entry.get("message") if phase in ("Failed", "Skipped") else None)
    if message:
        text = " ".join(str(message).split())
        text = text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."
        figures = f"{figures}; {text}" if figures else text
    attempts = entry.get("attempts")
    return Row(
        stage=stage,
        phase=f"{phase} ({blocked['reason']})" if blocked.get("reason") else phase,
        progress=shown,
        rate=rate,
        eta=eta,
        attempts=str(attempts) if attempts else "",
        duration=duration_text(_seconds(entry, now)),
        result=figures,
    )


def rows(status: Mapping[str, Any], now: datetime | None = None) -> list[Row]:
    """One row per stage of `status` (an Eagle3Run's status, camelCase), in the stages' order."""
    now = now or datetime.now(UTC)
    stages: Mapping[str, Any] = status.get("stages") or {}
    order = [s.value for s in ORDER if s.value in stages] + [s for s in stages if s not in set(ORDER)]
    return [stage_row(stage, stages[stage] or {}, now) for stage in order]


def _ready(status: Mapping[str, Any]) -> Mapping[str, Any]:
    conditions = status.get("conditions") or []
    return next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Ready"), {})


def headline(title: str, status: Mapping[str, Any]) -> str:
    """`Eagle3Run ns/tiny: Running, Ready False, train 3/6 ep, ETA 2m (reason: message)`."""
    ready = _ready(status)
    words = [f"{title}: {status.get('phase') or 'Pending'}", f"Ready {ready.get('status', 'Unknown')}"]
    words += [
        str(status[k]) if k == "progress" else f"ETA {status[k]}"
        for k in ("progress", "eta")
        if status.get(k)
    ]
    if isinstance(status.get("acceptanceLength"), int | float):
        words.append(f"acceptance length {status['acceptanceLength']:.3g}")
    line = ", ".join(words)
    if ready and ready.get("status") != "True" and ready.get("message"):
        line += f" ({ready.get('reason')}: {ready['message']})"
    return line


def _ratio(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, int | float) else "-"


def prediction_lines(status: Mapping[str, Any]) -> list[str]:
    """status.plan.prediction in a few lines: a line per acceptance length, the break-even, the verdict."""
    prediction = (status.get("plan") or {}).get("prediction")
    if not isinstance(prediction, Mapping) or not prediction.get("lengths"):
        return []
    columns = " / ".join(str(c) for c in prediction.get("concurrencies") or [])
    k = prediction.get("numSpeculativeTokens")
    lines = [f"predicted speedup ({prediction.get('method')}, k={k}) at concurrency {columns}:"]
    for row in prediction["lengths"]:
        speedups = " / ".join(_ratio(x) for x in row.get("speedup") or [])
        lines.append(
            f"  acceptance length {row.get('acceptanceLength'):.2f}: {speedups}  ({row.get('source')})"
        )
    evens = " / ".join(
        f"{b:.2f}" if isinstance(b, int | float) else "never" for b in prediction.get("breakEven") or []
    )
    lines.append(f"  break-even acceptance length: {evens}")
    if prediction.get("verdict"):
        lines.append(f"  {prediction['verdict']}")
    return lines


def finished(status: Mapping[str, Any]) -> bool:
    """Nothing more will happen without a change: a final phase, or Serving and Ready."""
    phase = status.get("phase")
    return phase in FINAL_PHASES or (phase == "Serving" and _ready(status).get("status") == "True")


def _columns(table_rows: list[Row]) -> list[int]:
    """The indexes of the columns to show: stage, phase, result, and any other that has a value."""
    cells = [astuple(r) for r in table_rows]
    return [i for i, c in enumerate(COLUMNS) if c in ALWAYS_SHOWN or any(row[i] for row in cells)]


def plain_table(title: str, status: Mapping[str, Any], now: datetime | None = None) -> str:
    """The table as aligned text (where rich is not installed: the operator's image)."""
    found = rows(status, now)
    shown = _columns(found)
    table = [[COLUMNS[i] for i in shown]] + [[astuple(r)[i] for i in shown] for r in found]
    widths = [max(len(line[i]) for line in table) for i in range(len(shown))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in table
    ]
    return "\n".join([headline(title, status), *lines, *prediction_lines(status)]) + "\n"


def rich_table(title: str, status: Mapping[str, Any], now: datetime | None = None) -> Any:
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
        "--interval", type=float, default=3.0, metavar="S", help="seconds between re-draws (default 3)"
    )
    status.set_defaults(func=_status)

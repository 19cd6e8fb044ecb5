"""What a stage's progress says at one moment (`Figures`), as Prometheus metrics and as the log line.

The metrics are the contract's (eagle3_contract.stage_metrics, whose `parse_progress` reads them back); what
is not known is absent, never a zero that would read as a figure.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from eagle3_contract import stage_metrics as names
from eagle3_contract.stage_metrics import eta_text

LOSS_STEPS = (
    50  # the train loss: the mean over this many recent steps (eagle3_pipeline.runtime.reporter keeps them)
)


@dataclass
class Figures:
    """What a reporter says at one moment (the metrics and the log line are made from this)."""

    stage: str
    unit: str | None
    done: int
    total: int | None
    rate: float | None
    eta_seconds: float | None
    start_time: float
    tokens: int | None
    failures: dict[str, int]
    token_budget: int | None
    epochs_done: int | None = None
    epochs: int | None = None
    step: int | None = None
    train_loss: float | None = None
    val_loss: float | None = None
    val_accuracy: list[float] = field(default_factory=list)
    acceptance: float | None = None
    tokens_per_second: float | None = None
    val_loss_rises: int | None = None


def metric_families(f: Figures) -> Iterator[Metric]:
    """The contract's metrics for `f`; what is unknown is absent (eagle3_contract.stage_metrics reads
    them)."""
    yield _gauge(names.START_TIME, "When the stage program started (Unix time).", f.start_time)
    if f.unit is not None:
        yield _gauge(names.UNITS_DONE, "Units done.", f.done, unit=f.unit)
        if f.total is not None:
            yield _gauge(names.UNITS, "Units the stage will do.", f.total, unit=f.unit)
        if f.rate is not None:
            yield _gauge(names.UNITS_RATE, "Recent rate, units per second.", f.rate, unit=f.unit)
        if f.eta_seconds is not None:
            yield _gauge(names.ETA_SECONDS, "Seconds left at the recent rate.", f.eta_seconds)
    if f.tokens is not None:
        yield CounterMetricFamily(names.TOKENS, "Tokens handled.", value=f.tokens)
    if f.failures:
        failures = CounterMetricFamily(names.FAILURES, "Rows or requests that failed.", labels=["reason"])
        for reason, count in sorted(f.failures.items()):
            failures.add_metric([reason], count)
        yield failures
    optional = [
        (names.TOKEN_BUDGET, "The current token budget.", f.token_budget),
        (names.TRAIN_EPOCHS_DONE, "Epochs completed.", f.epochs_done),
        (names.TRAIN_EPOCHS, "Epochs to train.", f.epochs),
        (names.TRAIN_STEP, "Optimizer steps so far.", f.step),
        (names.TRAIN_LOSS, f"Train loss, mean of the last {LOSS_STEPS} steps.", f.train_loss),
        (names.TRAIN_VAL_LOSS, "Validation loss of the last epoch.", f.val_loss),
        (names.TRAIN_ACCEPTANCE, "Acceptance length estimated from the last epoch.", f.acceptance),
        (names.TRAIN_TOKENS_RATE, "Recent training tokens per second.", f.tokens_per_second),
        (
            names.TRAIN_VAL_LOSS_RISES,
            "Epochs in a row, ending with the last one, whose validation loss rose.",
            f.val_loss_rises,
        ),
    ]
    for name, doc, value in optional:
        if value is not None:
            yield _gauge(name, doc, value)
    if f.val_accuracy:
        accuracy = GaugeMetricFamily(
            names.TRAIN_VAL_ACCURACY,
            "Conditional validation accuracy by draft position.",
            labels=["position"],
        )
        for position, value in enumerate(f.val_accuracy):
            accuracy.add_metric([str(position)], value)
        yield accuracy


def _gauge(name: str, doc: str, value: float, **labels: str) -> GaugeMetricFamily:
    if not labels:
        return GaugeMetricFamily(name, doc, value=value)
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def progress_line(f: Figures) -> str:
    """`stage train: 1200/5000 steps (24%), 3.1 steps/s, ETA 20m; epoch 2/10, loss 1.234, ...`."""
    if f.unit is None:
        return f"stage {f.stage}: starting"
    head = f"{f.done}/{f.total} {f.unit}" if f.total is not None else f"{f.done} {f.unit}"
    if f.total:
        head += f" ({100 * f.done // f.total}%)"
    if f.rate is not None:
        head += f", {_number(f.rate)} {f.unit}/s"
    eta = eta_text(f.eta_seconds) if f.done < (f.total or 0) else None
    if eta is not None:
        head += f", ETA {eta}"
    return f"stage {f.stage}: {head}" + "".join(f"; {part}" for part in _details(f) if part)


def _details(f: Figures) -> list[str]:
    train = []
    if f.epochs is not None:
        train.append(f"epoch {f.epochs_done or 0}/{f.epochs}")
    for label, value, digits in (
        ("loss", f.train_loss, 3),
        ("val loss", f.val_loss, 3),
        ("est. acceptance", f.acceptance, 2),
    ):
        if value is not None:
            train.append(f"{label} {value:.{digits}f}")
    other = []
    if f.tokens is not None:
        other.append(f"{f.tokens} tokens")
    if f.tokens_per_second is not None:
        other.append(f"{_number(f.tokens_per_second)} tokens/s")
    if f.failures:
        reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(f.failures.items()))
        other.append(f"{sum(f.failures.values())} failed ({reasons})")
    if f.token_budget is not None:
        other.append(f"token budget {f.token_budget}")
    return [", ".join(train), ", ".join(other)]


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 1 else f"{value:.3g}"

"""Live progress of a stage program: the metrics its pod exposes, and how a reader turns them into status.

Every stage program serves Prometheus metrics while it runs (prometheus-client, `ENV_METRICS_PORT`, path
`/metrics`). Three readers share them:
- Prometheus, through the run's stage PodMonitor (Grafana's training row, the stalled-stage alert);
- the operator, which reads a running stage pod's endpoint at a bounded rate and mirrors it into
  `status.stages.<stage>.progress` and the printer columns;
- the local executor (`eagle3 run`), which reads its stage subprocess's endpoint for one live line per stage.

`parse_progress` is the one reader of the exposition text; `summary` and `eta_text` make the printer
columns' strings. Names (gauges unless said; labels in brackets):

  eagle3_stage_units_done [unit]         units done (rows, samples, steps, prompts)
  eagle3_stage_units [unit]              units the stage will do (absent while unknown)
  eagle3_stage_units_per_second [unit]   recent rate (units/s, over the last RATE_WINDOW_SECONDS)
  eagle3_stage_eta_seconds               seconds left at the recent rate (absent while unknown)
  eagle3_stage_start_time_seconds        when the program started (Unix time)
  eagle3_stage_tokens_total              tokens handled (counter: generate, extract, train)
  eagle3_stage_failures_total [reason]   rows or requests that failed (counter)
  eagle3_stage_token_budget              the current token budget (generate, extract)
  eagle3_train_epochs_done, eagle3_train_epochs, eagle3_train_step, eagle3_train_loss (recent steps),
  eagle3_train_val_loss (last epoch), eagle3_train_val_accuracy [position] (last epoch, conditional),
  eagle3_train_estimated_acceptance_length (last epoch), eagle3_train_tokens_per_second,
  eagle3_train_val_loss_rises (epochs in a row, ending with the last finished one, whose validation loss was
  higher than the epoch before's)

The rate is absent until the first unit is done (a stage starting a vLLM server for minutes is not stalled),
and 0 once no unit was done for RATE_WINDOW_SECONDS (the stalled-stage alert).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from eagle3_contract.api.status import StageProgress

METRICS_PORT = 9400
METRICS_PORT_NAME = "metrics"
METRICS_PATH = "/metrics"
ENV_METRICS_PORT = "EAGLE3_METRICS_PORT"  # unset or 0: the program serves no metrics
ENV_METRICS_HOST = "EAGLE3_METRICS_HOST"  # default 0.0.0.0 (a pod); the local executor binds 127.0.0.1
ENV_PROGRESS_SECONDS = "EAGLE3_PROGRESS_SECONDS"  # the bounded rate of the program's progress log line
RATE_WINDOW_SECONDS = 120.0

UNITS_DONE = "eagle3_stage_units_done"
UNITS = "eagle3_stage_units"
UNITS_RATE = "eagle3_stage_units_per_second"
ETA_SECONDS = "eagle3_stage_eta_seconds"
START_TIME = "eagle3_stage_start_time_seconds"
TOKENS = "eagle3_stage_tokens"  # counter: exposed as eagle3_stage_tokens_total
FAILURES = "eagle3_stage_failures"  # counter: exposed as eagle3_stage_failures_total
TOKEN_BUDGET = "eagle3_stage_token_budget"
TRAIN_EPOCHS_DONE = "eagle3_train_epochs_done"
TRAIN_EPOCHS = "eagle3_train_epochs"
TRAIN_STEP = "eagle3_train_step"
TRAIN_LOSS = "eagle3_train_loss"
TRAIN_VAL_LOSS = "eagle3_train_val_loss"
TRAIN_VAL_ACCURACY = "eagle3_train_val_accuracy"
TRAIN_ACCEPTANCE = "eagle3_train_estimated_acceptance_length"
TRAIN_TOKENS_RATE = "eagle3_train_tokens_per_second"
TRAIN_VAL_LOSS_RISES = "eagle3_train_val_loss_rises"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _samples(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, dict(sample.labels), float(sample.value)


def parse_progress(text: str) -> StageProgress | None:
    """The progress in a stage program's /metrics text; None when it reports none (not a stage program,
    or it has not started counting). Raises ValueError on text that is not the exposition format."""
    values: dict[str, float] = {}
    unit: str | None = None
    accuracy: dict[int, float] = {}
    failures: float | None = None
    for name, labels, value in _samples(text):
        if name == TRAIN_VAL_ACCURACY and labels.get("position", "").isdigit():
            accuracy[int(labels["position"])] = value
        elif name == f"{FAILURES}_total":
            failures = (failures or 0.0) + value
        else:
            values[name] = value
            if name == UNITS_DONE:
                unit = labels.get("unit") or "units"
    if unit is None:
        return None
    return StageProgress.model_validate(_figures(unit, values, accuracy, failures))


def _figures(
    unit: str, values: dict[str, float], accuracy: dict[int, float], failures: float | None
) -> dict[str, Any]:
    def integer(name: str) -> int | None:
        value = values.get(name)
        return int(value) if value is not None and math.isfinite(value) else None

    def real(name: str, digits: int = 4) -> float | None:
        value = values.get(name)
        finite = _finite(value) if value is not None else None
        return round(finite, digits) if finite is not None else None

    return {
        "unit": unit,
        "done": integer(UNITS_DONE) or 0,
        "total": integer(UNITS),
        "rate": real(UNITS_RATE),
        "eta_seconds": real(ETA_SECONDS, 0),
        "tokens": integer(f"{TOKENS}_total"),
        "failures": int(failures) if failures is not None else None,
        "token_budget": integer(TOKEN_BUDGET),
        "epochs_done": integer(TRAIN_EPOCHS_DONE),
        "epochs": integer(TRAIN_EPOCHS),
        "step": integer(TRAIN_STEP),
        "train_loss": real(TRAIN_LOSS),
        "val_loss": real(TRAIN_VAL_LOSS),
        "val_accuracy_by_position": [round(accuracy[k], 4) for k in sorted(accuracy)] or None,
        "estimated_acceptance_length": real(TRAIN_ACCEPTANCE),
        "tokens_per_second": real(TRAIN_TOKENS_RATE, 1),
    }


def summary(stage: str, progress: StageProgress | None) -> str:
    """The Progress printer column: `train 6/10 ep`, `extract 1200/5000 samples`, `generate 340 rows`."""
    if progress is None:
        return stage
    if progress.epochs:
        return f"{stage} {progress.epochs_done or 0}/{progress.epochs} ep"
    if progress.total:
        return f"{stage} {progress.done}/{progress.total} {progress.unit}"
    return f"{stage} {progress.done} {progress.unit}"


def eta_text(seconds: float | None) -> str | None:
    """The ETA printer column: `45s`, `12m`, `3h20m`, `2d4h` (None when unknown)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return None
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        hours, minutes = divmod(s // 60, 60)
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    days, hours = divmod(s // 3600, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"

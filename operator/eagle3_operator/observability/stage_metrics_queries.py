"""The PromQL of the stage programs' live progress: the training row, the stage throughput panels and the
alerts on them, as pure functions of a `queries.Scope` (see `queries`).

Every stage pod serves the metrics of eagle3_contract.stage_metrics on its `metrics` port; the run's stage
PodMonitor gives its series `namespace`, `run`, `stage` (the pod's eagle3.dev/stage label) and `pod`, so
they join the operator's per-stage series on (namespace, run, stage).
"""

from __future__ import annotations

from eagle3_operator.observability.queries import DASHBOARD, ETA, LIVE_BY, STAGE_BY, Scope, selector

# --- Metric names (eagle3_contract.stage_metrics; counters with their `_total`). -------------------------
UNITS_DONE = "eagle3_stage_units_done"
UNITS_TOTAL = "eagle3_stage_units"
UNITS_RATE = "eagle3_stage_units_per_second"
STAGE_TOKENS = "eagle3_stage_tokens_total"
ROW_FAILURES = "eagle3_stage_failures_total"
TRAIN_EPOCHS_DONE = "eagle3_train_epochs_done"
TRAIN_LOSS = "eagle3_train_loss"
TRAIN_VAL_LOSS = "eagle3_train_val_loss"
TRAIN_VAL_LOSS_RISES = "eagle3_train_val_loss_rises"
TRAIN_VAL_ACCURACY = "eagle3_train_val_accuracy"
TRAIN_ACCEPTANCE = "eagle3_train_estimated_acceptance_length"
TRAIN_TOKENS_RATE = "eagle3_train_tokens_per_second"
UP = "up"  # Prometheus's own: 1 when the target's last scrape succeeded
TARGET = "job, instance"  # one scrape target (a stage pod's metrics endpoint): joins a series with its `up`
TRAIN_STAGE = 'stage="train"'


# --- Training and stage throughput. -------------------------------------------------------------------------
# Figures of one program (losses, accuracy, ETA) take the max over a stage's pods: one pod reports them. Rates
# and counts are summed: each pod counts its own work.
def train_loss(s: Scope = DASHBOARD) -> str:
    """The train loss of the recent steps, per run."""
    return f"max by ({LIVE_BY}) ({selector(TRAIN_LOSS, s.run)})"


def train_validation_loss(s: Scope = DASHBOARD) -> str:
    """The validation loss of the last finished epoch (a step each epoch), per run."""
    return f"max by ({LIVE_BY}) ({selector(TRAIN_VAL_LOSS, s.run)})"


def train_validation_accuracy(s: Scope = DASHBOARD) -> str:
    """The last epoch's conditional validation accuracy at each draft position, per run."""
    return f"max by ({LIVE_BY}, position) ({selector(TRAIN_VAL_ACCURACY, s.run)})"


def train_estimated_acceptance_length(s: Scope = DASHBOARD) -> str:
    """The acceptance length the last epoch's validation accuracy predicts, per run."""
    return f"max by ({LIVE_BY}) ({selector(TRAIN_ACCEPTANCE, s.run)})"


def train_tokens_per_second(s: Scope = DASHBOARD) -> str:
    return f"sum by ({LIVE_BY}) ({selector(TRAIN_TOKENS_RATE, s.run)})"


def train_epochs_done(s: Scope = DASHBOARD) -> str:
    return f"max by ({LIVE_BY}) ({selector(TRAIN_EPOCHS_DONE, s.run)})"


def train_eta_seconds(s: Scope = DASHBOARD) -> str:
    """Seconds the train stage has left at its recent rate, per run."""
    return f"max by ({LIVE_BY}) ({selector(ETA, s.run, TRAIN_STAGE)})"


def stage_eta_seconds(s: Scope = DASHBOARD) -> str:
    """Seconds each running stage has left at its recent rate (absent while its total or rate is unknown)."""
    return f"max by ({STAGE_BY}) ({selector(ETA, s.run)})"


def stage_progress(s: Scope = DASHBOARD) -> str:
    """Units done / units to do, per run and stage (absent while the stage's total is unknown)."""
    by = f"{STAGE_BY}, unit"
    return f"sum by ({by}) ({selector(UNITS_DONE, s.run)}) / sum by ({by}) ({selector(UNITS_TOTAL, s.run)})"


def stage_units_per_second(s: Scope = DASHBOARD) -> str:
    """Each stage's recent rate in its own unit (rows, samples, steps, prompts per second)."""
    return f"sum by ({STAGE_BY}, unit) ({selector(UNITS_RATE, s.run)})"


def stage_tokens_per_second(s: Scope = DASHBOARD) -> str:
    return f"sum by ({STAGE_BY}) (rate({selector(STAGE_TOKENS, s.run)}[{s.window}]))"


def stage_row_failures(s: Scope = DASHBOARD) -> str:
    """Rows or requests each stage program has failed so far, by reason (a retried pod counts from 0)."""
    return f"sum by ({STAGE_BY}, reason) ({selector(ROW_FAILURES, s.run)})"


STALL_FOR = "15m"  # Eagle3StageStalled's `for`: how long a running stage may do nothing


def alert_stage_stalled() -> str:
    """A stage pod is up (its endpoint answers) but its rate is 0 and it has not done all its units (or does
    not know how many): with the rule's `for`, no progress for that long."""
    return (
        f"{UNITS_RATE} == 0\nand on ({TARGET}) {UP} == 1\nunless on ({TARGET}) {UNITS_DONE} >= {UNITS_TOTAL}"
    )


VAL_LOSS_RISES = 2  # consecutive epochs of rising validation loss that fire Eagle3ValidationLossRising


def alert_validation_loss_rising() -> str:
    """The train stage's validation loss rose at each of the last VAL_LOSS_RISES epochs (the reporter counts
    the consecutive rises: a gauge set once per epoch needs no window to compare epochs)."""
    return f"{TRAIN_VAL_LOSS_RISES} >= {VAL_LOSS_RISES}"

"""The panels of the stage programs' live progress: the training row and the stage throughput row.

Each stage pod serves eagle3_contract.stage_metrics's metrics while it runs (scraped through the run's stage
PodMonitor), so these panels show the stage that runs now; a finished stage's lines end with its pod.
"""

from __future__ import annotations

from eagle3_operator.observability import queries as q
from eagle3_operator.observability import stage_metrics_queries as pq
from eagle3_operator.observability.panels import Panel, Target, graph, single

RUN = "{{namespace}}/{{run}}"
STAGE = "{{namespace}}/{{run}} {{stage}}"
LIVE = "Live, from the train stage's pod while it runs (its progress metrics, through the run's PodMonitor)."


def training_stats() -> list[Panel]:
    """The train stage now: epochs, the last epoch's validation figures, the time left."""
    return [
        single(
            "Epochs done",
            f"Epochs the train stage has finished ({pq.TRAIN_EPOCHS_DONE}), of training.epochs. {LIVE}",
            "none",
            Target(pq.train_epochs_done()),
            decimals=0,
        ),
        single(
            "Validation loss (last epoch)",
            f"The validation loss of the last finished epoch ({pq.TRAIN_VAL_LOSS}). Rising for "
            f"{pq.VAL_LOSS_RISES} epochs in a row fires Eagle3ValidationLossRising. {LIVE}",
            "none",
            Target(pq.train_validation_loss()),
            decimals=3,
        ),
        single(
            "Estimated acceptance length (last epoch)",
            "The mean acceptance length the last epoch's validation accuracy predicts, 1 + a0 + a0*a1 + ... "
            f"from the conditional accuracy a_i at each draft position ({pq.TRAIN_ACCEPTANCE}); the "
            f"evaluate stage measures the real one in vLLM. {LIVE}",
            "none",
            Target(pq.train_estimated_acceptance_length()),
        ),
        single(
            "Training ETA",
            "Time the train stage has left at its recent rate of optimizer steps "
            f'({q.ETA}{{stage="train"}}); absent until the trainer knows its steps. {LIVE}',
            "s",
            Target(pq.train_eta_seconds()),
            decimals=0,
        ),
    ]


def training_graphs() -> list[Panel]:
    """The train stage over time: losses, per-position accuracy, the acceptance estimate, tokens/s."""
    return [
        graph(
            "Train and validation loss",
            f"Train loss: the mean of the recent optimizer steps ({pq.TRAIN_LOSS}). Validation loss: the "
            f"last finished epoch's ({pq.TRAIN_VAL_LOSS}), a step at each epoch's end. Validation loss "
            "rising while train loss falls: the draft overfits (the stage keeps its best epoch's "
            f"checkpoint). {LIVE}",
            "none",
            [
                Target(pq.train_loss(), "train " + RUN),
                Target(pq.train_validation_loss(), "validation " + RUN),
            ],
            min_val=0,
        ),
        graph(
            "Validation accuracy by draft position",
            "The last epoch's conditional validation accuracy at each draft position: how often the draft's "
            f"token i is right given tokens 0..i-1 were ({pq.TRAIN_VAL_ACCURACY}). {LIVE}",
            "percentunit",
            [Target(pq.train_validation_accuracy(), RUN + " position {{position}}")],
            min_val=0,
            max_val=1,
        ),
        graph(
            "Estimated acceptance length (training)",
            "The mean acceptance length each epoch's validation accuracy predicts "
            f"({pq.TRAIN_ACCEPTANCE}); compare with the evaluated one once evaluate ran. {LIVE}",
            "none",
            [Target(pq.train_estimated_acceptance_length())],
            min_val=1,
        ),
        graph(
            "Training tokens/s",
            f"Tokens the trainer processes per second over its recent steps ({pq.TRAIN_TOKENS_RATE}). "
            + LIVE,
            "tps",
            [Target(pq.train_tokens_per_second())],
            min_val=0,
        ),
    ]


STAGES = (
    "Live, from each running stage's pod (its progress metrics, through the run's PodMonitor); a stage's "
    "line ends when its pod does."
)


def throughput_panels() -> list[Panel]:
    """Every running stage: progress, rate, tokens, failed rows, time left."""
    unit = STAGE + " ({{unit}})"
    return [
        graph(
            "Stage progress (done / total)",
            f"Units done / units to do ({pq.UNITS_DONE} / {pq.UNITS_TOTAL}) per stage, in the stage's unit: "
            "rows (prepare, generate), samples (extract), steps (train, vocab, export), prompts (evaluate). "
            f"Absent while a stage does not know its total. {STAGES}",
            "percentunit",
            [Target(pq.stage_progress(), unit)],
            min_val=0,
            max_val=1,
        ),
        graph(
            "Stage rate (units/s)",
            f"Each stage's recent rate in its own unit ({pq.UNITS_RATE}, over the program's last two "
            "minutes). 0 for 15 minutes while the pod runs and the stage is not done fires "
            f"Eagle3StageStalled. {STAGES}",
            "short",
            [Target(pq.stage_units_per_second(), STAGE + " {{unit}}/s")],
            min_val=0,
        ),
        graph(
            "Stage tokens/s",
            f"Tokens each stage handles per second (rate of {pq.STAGE_TOKENS}): generated (generate, "
            f"evaluate), stored (extract), trained on (train). {STAGES}",
            "tps",
            [Target(pq.stage_tokens_per_second(), STAGE)],
            width=8,
            min_val=0,
        ),
        graph(
            "Stage failed rows and requests",
            f"Rows or requests a stage program failed and skipped, by reason ({pq.ROW_FAILURES}): bad rows "
            "in prepare, regenerations in generate, requests in evaluate. A retried pod counts from 0. The "
            f"stage fails once they pass its limit (regeneration.maxFailedFraction). {STAGES}",
            "short",
            [Target(pq.stage_row_failures(), STAGE + " {{reason}}")],
            width=8,
            min_val=0,
        ),
        graph(
            "Stage ETA",
            f"Time each stage has left at its recent rate ({q.ETA}); absent while its total or "
            f"rate is unknown (a stalled stage has none). {STAGES}",
            "s",
            [Target(pq.stage_eta_seconds(), STAGE)],
            width=8,
            min_val=0,
        ),
    ]

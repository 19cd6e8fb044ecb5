"""The progress contract: parsing a stage's /metrics text, and the Progress and ETA columns' strings."""

from __future__ import annotations

import pytest

from eagle3_contract.api.status import StageProgress
from eagle3_contract.stage_metrics import eta_text, parse_progress, summary

TEXT = """# HELP eagle3_stage_units_done Units done.
# TYPE eagle3_stage_units_done gauge
eagle3_stage_units_done{unit="steps"} 1200.0
eagle3_stage_units{unit="steps"} 5000.0
eagle3_stage_units_per_second{unit="steps"} 3.14159
eagle3_stage_eta_seconds 1210.4
eagle3_stage_tokens_total 4.5e+06
eagle3_stage_failures_total{reason="timeout"} 2.0
eagle3_stage_failures_total{reason="too_long"} 1.0
eagle3_train_epochs_done 2.0
eagle3_train_epochs 10.0
eagle3_train_step 1200.0
eagle3_train_val_loss 1.40234
eagle3_train_val_accuracy{position="1"} 0.41
eagle3_train_val_accuracy{position="0"} 0.72
eagle3_train_estimated_acceptance_length NaN
python_gc_objects_collected_total{generation="0"} 12.0
"""


def test_a_stage_programs_metrics_parse_into_its_progress() -> None:
    progress = parse_progress(TEXT)
    assert progress == StageProgress(
        unit="steps", done=1200, total=5000, rate=3.1416, eta_seconds=1210.0, tokens=4_500_000, failures=3,
        epochs_done=2, epochs=10, step=1200, val_loss=1.4023, val_accuracy_by_position=[0.72, 0.41],
    )  # fmt: skip
    assert summary("train", progress) == "train 2/10 ep"


def test_text_without_progress_is_none_and_text_that_is_no_exposition_is_refused() -> None:
    assert parse_progress("python_gc_objects_collected_total 3\n") is None
    assert parse_progress("") is None
    with pytest.raises(ValueError):
        parse_progress("<html>not metrics</html>\n")


@pytest.mark.parametrize(
    ("progress", "text"),
    [
        (None, "extract"),
        (StageProgress(unit="samples", done=1200, total=5000), "extract 1200/5000 samples"),
        (StageProgress(unit="rows", done=340), "extract 340 rows"),
    ],
)
def test_the_progress_column(progress: StageProgress | None, text: str) -> None:
    assert summary("extract", progress) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, None), (float("nan"), None), (-3, None), (44.6, "45s"), (60, "1m"), (3599, "59m"), (3600, "1h"),
     (12000, "3h20m"), (86400 * 2 + 3600 * 4 + 59, "2d4h"), (86400, "1d")],
)  # fmt: skip
def test_the_eta_column(seconds: float | None, text: str | None) -> None:
    assert eta_text(seconds) == text

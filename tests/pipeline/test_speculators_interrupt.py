"""adapters.speculators_interrupt: a SIGTERM during speculators' training stops it at the end of a step,
however the signal lands; a step that does not end is interrupted where it is after the patience."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from speculators.train import graceful_shutdown
from speculators.train.graceful_shutdown import with_graceful_shutdown
from speculators.train.trainer import metric_logger as metrics_logger

from eagle3_contract.patch_guard import LibraryChanged
from eagle3_pipeline.adapters import speculators_interrupt
from eagle3_pipeline.adapters.speculators_interrupt import StepEndShutdown, stopping_at_step_end
from tests.patch_guards import another_version, check_both_directions


def swallowing_log_line() -> None:
    """A log line whose handler keeps any Exception, as logging's `handleError` does, with the signal
    arriving inside it."""
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs at the next bytecode; be sure it ran inside the `try`
    except Exception:  # what logging.Handler.emit does
        pass


class FakeTrainer:
    """speculators' trainer as its decorator sees it: steps that each end with a metrics record."""

    def __init__(self, tmp: Path, steps: int, step: Callable[[int], None]) -> None:
        self.checkpointer = SimpleNamespace(path=tmp)
        self.steps, self.step, self.done, self.saved = steps, step, 0, list[str]()

    def maybe_save_checkpoint(self, label: str) -> None:
        self.saved.append(label)

    @with_graceful_shutdown()
    def run_training(self) -> None:
        for n in range(self.steps):
            self.step(n)
            self.done += 1
            metrics_logger.info({"train": {"loss": 1.0}, "epoch": 0, "global_step": n})


@pytest.fixture(autouse=True)
def metrics_logged() -> None:
    level = metrics_logger.level
    metrics_logger.setLevel(logging.INFO)  # as the stage's recording does
    yield
    metrics_logger.setLevel(level)


def test_speculators_alone_loses_a_sigterm_that_lands_in_a_swallowing_handler(tmp_path: Path) -> None:
    """Why the adapter exists: without it the signal is spent and training runs to its end. (When this
    fails, speculators raises something no `except Exception` keeps: re-check whether the adapter is
    still needed.)"""
    trainer = FakeTrainer(tmp_path, 5, lambda n: swallowing_log_line() if n == 1 else None)
    trainer.run_training()
    assert (trainer.done, trainer.saved) == (5, [])


def test_a_sigterm_anywhere_in_a_step_stops_training_at_that_steps_end(tmp_path: Path) -> None:
    trainer = FakeTrainer(tmp_path, 5, lambda n: swallowing_log_line() if n == 1 else None)
    with stopping_at_step_end():
        trainer.run_training()
    assert trainer.done == 2, "step 1 ended, no step after it began"
    assert trainer.saved == ["interrupted"], "speculators' decorator still saves its checkpoint"


def test_the_adapter_is_undone_after_its_block(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    classes = graceful_shutdown.GracefulShutdownHandler, graceful_shutdown.TrainingInterruptedError
    handlers = list(metrics_logger.handlers)
    with stopping_at_step_end():
        assert graceful_shutdown.GracefulShutdownHandler is StepEndShutdown
        FakeTrainer(tmp_path, 2, lambda n: None).run_training()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert (graceful_shutdown.GracefulShutdownHandler, graceful_shutdown.TrainingInterruptedError) == classes
    assert metrics_logger.handlers == handlers and StepEndShutdown.active == []


def test_a_step_that_does_not_end_is_interrupted_after_the_patience(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collective or an online wait for hidden states: interrupted where it is, as speculators does."""
    monkeypatch.setattr(speculators_interrupt, "PATIENCE_SECONDS", 0.3)
    started: list[float] = []

    def stuck(n: int) -> None:
        if n == 1:
            started.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # torchrun's re-send at once: ignored
            time.sleep(60)

    trainer = FakeTrainer(tmp_path, 5, stuck)
    with stopping_at_step_end():
        trainer.run_training()
    assert trainer.done == 1 and trainer.saved == ["interrupted"]
    assert time.monotonic() - started[0] < 30, "the sleeping step was interrupted, not waited out"


def test_the_installed_speculators_has_what_the_adapter_relies_on_and_another_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    check_both_directions(monkeypatch, tmp_path, speculators_interrupt.GUARD)
    another_version(monkeypatch, speculators_interrupt.GUARD)
    handler = graceful_shutdown.GracefulShutdownHandler
    with pytest.raises(LibraryChanged, match=r"speculators==0\.9\.0"), stopping_at_step_end():
        pass
    assert graceful_shutdown.GracefulShutdownHandler is handler  # nothing replaced

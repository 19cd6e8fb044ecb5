"""speculators' SIGTERM handling during training, made to stop at the end of a step.

speculators 0.9.0 (`speculators.train.graceful_shutdown`) turns the first SIGINT or SIGTERM during
`Trainer.run_training` into `TrainingInterruptedError`, raised by the signal handler wherever the main thread
is, and catches it in `run_training`'s decorator to save `checkpoints/interrupted` and return. Raised at an
arbitrary bytecode, the exception is not always what arrives there:
  - inside a log line, logging's `Handler.emit` hands it (an Exception) to `handleError`, which prints "---
    Logging error ---" and goes on; inside a generator's finalizer Python ignores it (both are Python's
    documented handling of an exception raised there). The first signal is spent (the handler ignores later
    ones): training goes on, and a pod asked to stop trains until Kubernetes kills it;
  - inside torch's `vmap` (flex attention's mask), vmap's own clean-up fails an internal assert
    ("!dynamicLayerStack.empty()"), and that RuntimeError replaces the interruption: the stage fails with
    torch's message instead of "training stopped after epochs" (what made the SIGTERM test fail once in CI).

`stopping_at_step_end()` keeps speculators' decorator (it still saves `interrupted`) and replaces, for the
block, the two names it looks up in its module:
  - `GracefulShutdownHandler` with `StepEndShutdown`: the first signal only notes the request, and the
    interruption is raised at the end of the current step, from speculators' per-step metrics record (the
    trainer module's `metric_logger`, which logs every step at `log_freq` 1). Code stuck inside a step (a
    collective, an online run waiting for hidden states) is interrupted where it is, as before,
    PATIENCE_SECONDS after the first signal, or at a signal that arrives later than that; torchrun's
    immediate re-sends are ignored;
  - `TrainingInterruptedError` with a BaseException of that name, so that interruption is not swallowed
    by an `except Exception` either.
Written here because speculators has no option for either. Before it replaces anything, its `GUARD` checks
speculators 0.9.0 and the source of what this relies on (eagle3_contract.patch_guard).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

from eagle3_contract.patch_guard import PatchGuard, Source

logger = logging.getLogger(__name__)

MODULE = "speculators.train.graceful_shutdown"
TRAINER = "speculators.train.trainer"  # its module-level metric_logger records each step
PATIENCE_SECONDS = 10.0  # of Kubernetes' default 30 s grace: the rest for the save and the unwinding
SIGNALS = (signal.SIGINT, signal.SIGTERM)
GUARD = PatchGuard(
    patch=__name__,
    distribution="speculators",
    version="0.9.0",
    sources=(
        Source(
            f"{MODULE}:with_graceful_shutdown",
            "eedfb16059a4216c31e4a7a07008fa370960f7fb822d4f100b13ef0e916d9d2b",
            "its wrapper looks GracefulShutdownHandler and TrainingInterruptedError up in its module (both "
            "replaced), uses install(), restore() and timeout, and saves 'interrupted' on the error",
        ),
        Source(
            f"{TRAINER}:Trainer.run_training",
            "83e395bd403ee08f5d008fe6fa0695f21db4ba7cba7dc26d5d3fde312c74235c",
            "training runs inside @with_graceful_shutdown()",
        ),
        Source(
            f"{TRAINER}:Trainer.train_epoch",
            "a84f3c8000da1b71a9a0eab955b0398ce23b717986df94b65b9f6c71c054ac8c",
            "each step ends with a record on the module's metric_logger (where the step-end check runs)",
        ),
        Source(
            f"{TRAINER}:Trainer.val_epoch",
            "10da9d3279842a4c5316aea0d9e563a2667a78efee172ab066a14b0ba84a4b44",
            "a validation epoch ends with a record on the module's metric_logger",
        ),
    ),
    remove_when="speculators' graceful shutdown stops training at the end of a step, or raises its "
    "interruption as a BaseException where the signal lands",
)


class TrainingInterruptedError(BaseException):  # speculators' name: its decorator looks it up
    """A SIGINT or SIGTERM during training: unwinds to speculators' decorator, past `except Exception`."""


class StepEndShutdown:
    """What speculators' `with_graceful_shutdown` uses of `GracefulShutdownHandler` (install, restore,
    timeout), stopping at the end of a step (see the module)."""

    active: list[StepEndShutdown] = []  # installed now; the step-end check finds them here

    def __init__(self, timeout: int = 120) -> None:
        self.timeout = timeout
        self._saved: dict[int, Any] = {}
        self._owner = 0
        self._requested: float | None = None
        self._raised = False
        self._timer: threading.Timer | None = None
        self._expired = False

    def install(self) -> None:
        if self._saved:
            return
        self._owner = os.getpid()
        self._saved = {sig: signal.signal(sig, self._handler) for sig in SIGNALS}
        StepEndShutdown.active.append(self)

    def restore(self) -> None:
        if not self._saved:
            return
        for sig, previous in self._saved.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._saved = {}
        if self._timer is not None:
            self._timer.cancel()
        StepEndShutdown.active.remove(self)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._owner or self._raised:  # a forked loader worker; one interruption only
            return
        name, now = signal.Signals(signum).name, time.monotonic()
        if self._requested is None:
            self._requested = now
            logger.warning(
                "received %s: training stops at the end of this step (where it is, if the step has not "
                "ended in %.0f s)",
                name,
                PATIENCE_SECONDS,
            )
            self._timer = threading.Timer(PATIENCE_SECONDS, self._expire, (signum,))
            self._timer.daemon = True
            self._timer.start()
        elif self._expired or now - self._requested >= PATIENCE_SECONDS:
            self._raised = True
            logger.warning("%s: the step has not ended; interrupting it where it is", name)
            raise TrainingInterruptedError(name)

    def _expire(self, signum: int) -> None:
        """The timer: the step has not ended in PATIENCE_SECONDS; the signal again, to the main thread."""
        self._expired = True
        main = threading.main_thread().ident
        if main is not None:
            signal.pthread_kill(main, signum)

    def at_step_end(self) -> None:
        """Raise the interruption when one was requested (speculators' per-step record calls it)."""
        if self._requested is not None and not self._raised:
            self._raised = True
            if self._timer is not None:
                self._timer.cancel()
            raise TrainingInterruptedError("stopped at the end of a step")


class _StepEnd(logging.Handler):
    """On speculators' metric logger: each record ends a step (or a validation epoch)."""

    def emit(self, record: logging.LogRecord) -> None:
        for shutdown in list(StepEndShutdown.active):
            shutdown.at_step_end()


@contextlib.contextmanager
def stopping_at_step_end() -> Iterator[None]:
    """Within the block, a SIGINT or SIGTERM stops speculators' training at the end of a step. Raises
    LibraryChanged (nothing replaced) where speculators is not what the adapter was written for."""
    GUARD.check()
    module = importlib.import_module(MODULE)
    replaced = {
        "GracefulShutdownHandler": StepEndShutdown,
        "TrainingInterruptedError": TrainingInterruptedError,
    }
    saved = {name: getattr(module, name) for name in replaced}
    step_end, metrics = _StepEnd(), importlib.import_module(TRAINER).metric_logger
    for name, value in replaced.items():
        setattr(module, name, value)
    metrics.addHandler(step_end)  # after the metrics recorder: the step is recorded first
    try:
        yield
    finally:
        metrics.removeHandler(step_end)
        for name, value in saved.items():
            setattr(module, name, value)

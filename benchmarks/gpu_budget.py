"""Time budgets for `gpu_pipeline.py`'s phases, and the one way a run is stopped early.

A device session has minutes, and one slow phase (a compilation that takes longer than planned) must not take
the time of the next. `--budget PHASE=SECONDS` gives a phase a limit: `deadline` arms a real-time timer, and
when it fires, `StopRun("budget")` is raised in the main thread, wherever the phase is (between two bytecodes:
a long C call finishes first). The training phases catch it and keep the steps they recorded; any other phase
ends the run with the figures saved so far. `StopRun("steps")` is what a training run raises once it has
logged the steps it is measured on (`--stop-after-steps`).

StopRun is a BaseException, so the train stage's handlers (which turn an Exception into a failed stage and
discard its work) let it through: its work directory, with the run.yaml the stock command needs, is kept.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

BUDGET = "budget"  # StopRun reasons: the phase's time budget ran out
STEPS = "steps"  # the run logged the steps it is measured on


class StopRun(BaseException):
    """Ends a phase early: `reason` is BUDGET or STEPS."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_budgets(items: list[str] | None, phases: tuple[str, ...]) -> dict[str, float]:
    """`["train=105", "stock=45"]` as {"train": 105.0, "stock": 45.0}; ValueError names a wrong item."""
    budgets: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or name not in phases:
            raise ValueError(f"--budget {item}: expected PHASE=SECONDS with PHASE one of {', '.join(phases)}")
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"--budget {item}: {value!r} is not a number of seconds") from None
        if seconds <= 0:
            raise ValueError(f"--budget {item}: the seconds must be positive")
        budgets[name] = seconds
    return budgets


def _expired(signum: int, frame: FrameType | None) -> None:
    raise StopRun(BUDGET)


@contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise StopRun(BUDGET) in the block once `seconds` have passed (no limit for None). Main thread only."""
    if seconds is None:
        yield
        return
    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

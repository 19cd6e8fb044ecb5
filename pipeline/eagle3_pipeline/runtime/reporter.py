"""A stage program's live progress: the metrics its pod serves, and one bounded progress line in its log.

`StageReporter` holds a stage's figures (eagle3_contract.stage_metrics names them) and is cheap to update per
row or step: a lock, a few additions, no I/O. Its own CollectorRegistry computes what is derived (the recent
rate, the ETA) when it is read, so a stalled stage shows a rate of 0, not its last good one. `from_env`
serves the registry with prometheus-client's HTTP server when $EAGLE3_METRICS_PORT is set above 0 (on
$EAGLE3_METRICS_HOST, default 0.0.0.0), on a daemon thread that never keeps the process alive; `close` stops
it. The log gets one line when the stage starts counting, at most one every $EAGLE3_PROGRESS_SECONDS (60)
while it counts, and one at the end, e.g.

    stage train: 1200/5000 steps (24%), 3.1 steps/s, ETA 20m; epoch 2/10, loss 1.234, val loss 1.402, ...

A program gets its reporter as `ctx.progress` (eagle3_pipeline.runtime.context; stage_main makes it around the
run) and calls `begin(unit, total, done)` once it knows what it counts, then `advance`, `fail`,
`set_token_budget`, or for train `train_plan`, `train_steps` and `train_epoch`
(eagle3_pipeline.stages.train.events relays those from torchrun's workers).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import Metric

from eagle3_contract import stage_metrics as names
from eagle3_contract.stage_metrics import (
    ENV_METRICS_HOST,
    ENV_METRICS_PORT,
    ENV_PROGRESS_SECONDS,
    RATE_WINDOW_SECONDS,
)
from eagle3_pipeline.runtime.figures import LOSS_STEPS, Figures, metric_families, progress_line

logger = logging.getLogger(__name__)

DEFAULT_HOST = "0.0.0.0"
DEFAULT_LOG_SECONDS = 60.0
SAMPLE_SECONDS = 1.0  # the rate window keeps at most one point a second
MIN_RATE_SECONDS = 1.0  # no rate (nor ETA) from less than this
Clock = Callable[[], float]


class StageReporter:
    """One stage program's progress figures, their metrics endpoint and their bounded log line."""

    def __init__(
        self,
        stage: str,
        *,
        log_seconds: float = DEFAULT_LOG_SECONDS,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
        rate_window: float = RATE_WINDOW_SECONDS,
    ) -> None:
        self.stage = stage
        self.log_seconds = log_seconds
        self.registry = CollectorRegistry()
        self._clock, self._window = clock, rate_window
        self._lock = threading.Lock()
        self._start_time = wall()
        self._unit: str | None = None
        self._done = 0
        self._total: int | None = None
        self._tokens: int | None = None
        self._failures: dict[str, int] = {}
        self._budget: int | None = None
        self._points: deque[tuple[float, int, int]] = deque()  # (time, done, tokens)
        self._logged_at: float | None = None
        self._finished = False
        self._train = _TrainFigures()
        self._last_move = 0.0  # when the last unit was done
        # (time, done, tokens) at the first unit done since begin(): the rate's window starts there
        self._first_move: tuple[float, int, int] | None = None
        self._server: Any = None
        self.registry.register(self)

    @classmethod
    def from_env(cls, stage: str, env: Mapping[str, str] = os.environ) -> StageReporter:
        """A reporter for `stage`, serving its metrics when $EAGLE3_METRICS_PORT asks for it."""
        reporter = cls(stage, log_seconds=_seconds(env.get(ENV_PROGRESS_SECONDS)))
        port = _port(env.get(ENV_METRICS_PORT))
        if port:
            reporter.serve(port, env.get(ENV_METRICS_HOST) or DEFAULT_HOST)
        return reporter

    # --- what a stage program calls ------------------------------------------------------------------------

    def begin(self, unit: str, total: int | None = None, done: int = 0) -> None:
        """Start counting `unit` (done: what an earlier attempt finished); logs the start line once."""
        with self._lock:
            self._unit, self._total, self._done = unit, total, done
            self._restart_rate()
            first = self._logged_at is None
        if first:
            self._log(self._clock())

    def set_total(self, total: int | None) -> None:
        with self._lock:
            self._total = total

    def grow_total(self, more: int) -> None:
        """`more` units on top of the total (work found necessary on the way, e.g. more rounds)."""
        with self._lock:
            self._total = (self._total or self._done) + more

    def advance(self, n: int = 1, tokens: int = 0) -> None:
        """`n` more units done (failed ones included: they are handled), `tokens` more tokens."""
        with self._lock:
            self._done += n
            if tokens or self._tokens is not None:
                self._tokens = (self._tokens or 0) + tokens
            now = self._moved()
        self._maybe_log(now)

    def add_tokens(self, tokens: int) -> None:
        self.advance(0, tokens)

    def fail(self, reason: str, n: int = 1) -> None:
        """`n` rows or requests failed for `reason` (a short, bounded word: it is a label)."""
        with self._lock:
            self._failures[reason] = self._failures.get(reason, 0) + n

    def set_token_budget(self, budget: int | None) -> None:
        with self._lock:
            self._budget = budget

    def train_plan(
        self, epochs: int, steps_per_epoch: int | None, step: int = 0, epochs_done: int = 0
    ) -> None:
        """Training counts optimizer steps: epochs x steps per epoch (when known), from `step` on."""
        total = epochs * steps_per_epoch if steps_per_epoch is not None else None
        with self._lock:
            self._train.epochs, self._train.epochs_done, self._train.step = epochs, epochs_done, step
            first = self._logged_at is None
            self._unit, self._total, self._done = "steps", total, step
            self._restart_rate()
        if first:
            self._log(self._clock())

    def train_steps(self, step: int, loss: float | None = None, steps: int = 1, tokens: int = 0) -> None:
        """Training reached global step `step`; `loss`: the mean of the `steps` steps since the last call."""
        with self._lock:
            self._train.step = step
            if loss is not None and math.isfinite(loss):
                self._train.add_loss(loss, steps)
            self._done = step
            self._tokens = (self._tokens or 0) + tokens
            now = self._moved()
        self._maybe_log(now)

    def train_epoch(
        self, epochs_done: int, val_loss: float | None, accuracy: Sequence[float], acceptance: float | None
    ) -> None:
        """An epoch ended with these validation figures (accuracy: conditional, by draft position)."""
        with self._lock:
            t = self._train
            if val_loss is not None:
                rose = t.val_loss is not None and val_loss > t.val_loss
                t.rises = (t.rises or 0) + 1 if rose else 0
            t.epochs_done, t.val_loss, t.val_accuracy, t.acceptance = (
                epochs_done, val_loss, list(accuracy), acceptance,
            )  # fmt: skip
        self._maybe_log(self._clock())

    # --- reading it ----------------------------------------------------------------------------------------

    def figures(self) -> Figures:
        with self._lock:
            return self._figures(self._clock())

    def exposition(self) -> str:
        """The metrics as the endpoint serves them (Prometheus text format)."""
        return generate_latest(self.registry).decode()

    def collect(self) -> Iterator[Metric]:
        """The registry's collector: the contract's metrics, each only once it is known."""
        yield from metric_families(self.figures())

    def line(self, figures: Figures | None = None) -> str:
        return progress_line(figures or self.figures())

    # --- serving and closing -------------------------------------------------------------------------------

    def serve(self, port: int, host: str = DEFAULT_HOST) -> None:
        """Serve the metrics on host:port until close(); a port that cannot be bound is a warning only."""
        try:
            self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            logger.warning(
                "stage %s: cannot serve progress metrics on %s:%d: %s", self.stage, host, port, exc
            )
            return
        logger.info(
            "stage %s: progress metrics on http://%s:%d%s", self.stage, host, port, names.METRICS_PATH
        )

    def finish(self) -> None:
        """Log the end line (once; only for a stage that started counting), with the stage's mean rate."""
        with self._lock:
            if self._finished or self._logged_at is None:
                return
            self._finished = True
        self._log(self._clock(), final=True)

    def close(self) -> None:
        """The end line, and the metrics server stopped (its port is free again)."""
        self.finish()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> StageReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- inside (the caller holds the lock where it says so) ------------------------------------------------

    def _restart_rate(self) -> None:  # lock held
        self._points.clear()
        self._points.append((self._clock(), self._done, self._tokens or 0))
        self._first_move = None

    def _moved(self) -> float:  # lock held: one rate point a second at most
        now = self._clock()
        if self._first_move is None:
            # the first unit since begin(): the rate counts from here, not from a start-up (a vLLM server
            # loading for minutes) that would make the first ETA hours long, or count as a stall
            self._points.clear()
            self._first_move = (now, self._done, self._tokens or 0)
        self._last_move = now
        if not self._points or now - self._points[-1][0] >= SAMPLE_SECONDS:
            self._points.append((now, self._done, self._tokens or 0))
        self._prune(now)
        return now

    def _prune(self, now: float) -> None:  # lock held: keep the last point at or before the window's start
        while len(self._points) >= 2 and self._points[1][0] <= now - self._window:
            self._points.popleft()

    def _rates(self, now: float) -> tuple[float | None, float | None]:  # lock held: (units/s, tokens/s)
        self._prune(now)
        if not self._points or self._first_move is None:
            return None, None  # nothing done yet: a start-up, not a stall
        if now - self._last_move >= self._window:
            return 0.0, 0.0  # stalled: exactly 0 (units within one sample second would leave a trickle)
        t0, done0, tokens0 = self._points[0]
        elapsed = now - t0
        if elapsed < MIN_RATE_SECONDS:
            return None, None
        return (self._done - done0) / elapsed, ((self._tokens or 0) - tokens0) / elapsed

    def _mean_rates(self) -> tuple[float | None, float | None]:  # lock held: over the whole stage
        # the end line's figure: from the first unit to the last, however short (a fast stage that ends
        # within the window's first second still says how fast it went; a stall before the end is no 0)
        if self._first_move is None or self._last_move <= self._first_move[0]:
            return None, None
        t0, done0, tokens0 = self._first_move
        elapsed = self._last_move - t0
        return (self._done - done0) / elapsed, ((self._tokens or 0) - tokens0) / elapsed

    def _figures(self, now: float, final: bool = False) -> Figures:  # lock held
        if self._unit is None:
            rate, token_rate = None, None
        else:
            rate, token_rate = self._mean_rates() if final else self._rates(now)
        t = self._train
        return Figures(
            stage=self.stage,
            unit=self._unit,
            done=self._done,
            # a total estimated from the first epoch's batches can fall short by a step or two
            total=max(self._total, self._done) if self._total is not None else None,
            rate=rate,
            eta_seconds=_eta(self._done, self._total, rate),
            start_time=self._start_time,
            tokens=self._tokens,
            failures=dict(self._failures),
            token_budget=self._budget,
            epochs_done=t.epochs_done,
            epochs=t.epochs,
            step=t.step,
            train_loss=t.loss(),
            val_loss=t.val_loss,
            val_accuracy=list(t.val_accuracy),
            val_loss_rises=t.rises,
            acceptance=t.acceptance,
            tokens_per_second=token_rate if t.epochs is not None else None,
        )

    def _maybe_log(self, now: float) -> None:
        with self._lock:
            logged = self._logged_at
            if logged is None or self.log_seconds <= 0 or now - logged < self.log_seconds:
                return
            self._logged_at = now
            text = progress_line(self._figures(now))
        logger.info("%s", text)

    def _log(self, now: float, final: bool = False) -> None:
        with self._lock:
            self._logged_at = now
            text = progress_line(self._figures(now, final))
        logger.info("%s", text)


@dataclass
class _TrainFigures:
    epochs_done: int | None = None
    epochs: int | None = None
    step: int | None = None
    losses: deque[tuple[float, int]] = field(default_factory=deque)  # (sum, steps), newest last
    val_loss: float | None = None
    val_accuracy: list[float] = field(default_factory=list)
    acceptance: float | None = None
    rises: int | None = None  # epochs in a row whose validation loss rose

    def add_loss(self, mean: float, steps: int) -> None:
        self.losses.append((mean * steps, steps))
        while len(self.losses) > 1 and sum(n for _, n in self.losses) - self.losses[0][1] >= LOSS_STEPS:
            self.losses.popleft()

    def loss(self) -> float | None:
        steps = sum(n for _, n in self.losses)
        return sum(s for s, _ in self.losses) / steps if steps else None


def _eta(done: int, total: int | None, rate: float | None) -> float | None:
    if total is None:
        return None
    if done >= total:
        return 0.0
    return (total - done) / rate if rate else None


def _port(text: str | None) -> int | None:
    if not text:
        return None
    try:
        port = int(text)
    except ValueError:
        logger.warning("$%s is %r, not a port number: serving no progress metrics", ENV_METRICS_PORT, text)
        return None
    return port if port > 0 else None


def _seconds(text: str | None) -> float:
    if not text:
        return DEFAULT_LOG_SECONDS
    try:
        return float(text)
    except ValueError:
        logger.warning("$%s is %r, not seconds: using %g", ENV_PROGRESS_SECONDS, text, DEFAULT_LOG_SECONDS)
        return DEFAULT_LOG_SECONDS

"""Training figures for `gpu_pipeline.py`: our train stage and the stock `speculators train`, measured alike.

speculators' trainer logs every step (`log_freq: 1`, as the train stage configures it) to the
`speculators.metrics` logger: the losses and a profile whose `step_ms` (fetch + forward + backward +
optimizer, the accelerator synchronized) and `tokens_per_s` (non-padding tokens / step time) it measures
itself. Both runs are measured from these records:
  * ours, in this process: a handler on that logger notes each record and when it arrived;
  * stock, in a subprocess: speculators' console handler (rich) prints each record
    (`train/loss=..., profile/step_ms=..., profile/tokens_per_s=..., ..., global_step=N`), read as it comes.
Figures cover the steps after the first `warmup` ones (flex attention and the fused loss compile in the first
steps) up to the last: steps/s and tokens/s over the time between their records (everything in the training
loop, validation and checkpoints excluded), and the median `step_ms`. Model loading, the data loader's
workers and compilation only count in the time to the first step and the wall time, which differ in kind:
ours runs in a process that has imported torch, transformers and speculators already, the stock command
starts a new interpreter. One difference is inside the loop: the stock command renders every step's record on
its console (rich), ours only records it; the rendering falls into the next step's fetch time.

Compilation (flex attention and the fused loss, with torch.compile on a GPU) happens inside the first steps
(and again in any step that recompiles): `compile_s` is the compute time (step time less its data fetch) of
the steps that took more than SLOW times the steady median, above that median. The warm-up left out of the
rates is `warmup` steps, longer while a step in the first half still compiles. `--stop-after-steps` ends a run
once it has logged that many steps (StopRun; the stock subprocess is killed): the rates need no checkpoint
and no validation, whose compilation is a minute of a short device session.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from gpu_budget import STEPS, StopRun

METRICS_LOGGER = "speculators.metrics"
PROGRESS_S = 15.0  # at most one progress line per run this often: a run cut short shows how far it got
SLOW = 3.0  # a step whose compute time is this many times the steady median's is compiling (or autotuning)
PEAK_PREFIX = "EAGLE3_BENCH_PEAK_BYTES="
# Wide enough for a step record on one line (about 1000 characters); rich pads every line to this width.
CONSOLE_COLUMNS = 2000
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# A record's first line in RichHandler's layout: "[12:00:00] INFO     ...", or "   INFO ..." when the time is
# the previous record's; the lines it wraps a long record onto start with spaces only.
_RECORD_START = re.compile(r"^(\[[^\]]*\])?\s*(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s")
_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
_FIELDS = {
    "step": re.compile(r"\bglobal_step=(\d+)"),
    "step_ms": re.compile(r"\bprofile/step_ms=" + _NUMBER),
    "fetch_ms": re.compile(r"\bprofile/fetch_ms=" + _NUMBER),
    "tokens_per_s": re.compile(r"\bprofile/tokens_per_s=" + _NUMBER),
    "loss": re.compile(r"\btrain/loss=" + _NUMBER),
}

# The stock command, in a `python -c` wrapper only to read the CUDA allocator's peak after every step and at
# exit (a run stopped after its steps has no exit), to die with the benchmark (it runs in a session of its
# own, so that stopping it stops its loader workers too), and, without an accelerator, to apply
# eagle3_pipeline.adapters.speculators_cpu's adaptation (speculators 0.9.0 trains on CUDA only); with one, the
# stage's workaround for the fused loss kernels, eagle3_pipeline.adapters.fused_loss_kernels, without which it
# fails on torch 2.11 as the stage would. The per-step handler goes on the metric logger after speculators'
# own setup, whose dictConfig drops the handlers that logger had.
STOCK_WRAPPER = """\
import atexit, contextlib, ctypes, logging, signal, sys
import torch
import speculators.train.cli as train_cli
from speculators.cli import app

with contextlib.suppress(OSError, AttributeError):
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: end with the benchmark

def _peak():
    if torch.cuda.is_available():
        print("{prefix}%d" % torch.cuda.max_memory_allocated(), flush=True)

class _PeakAtEachStep(logging.Handler):
    def emit(self, record):
        if isinstance(record.msg, dict) and "global_step" in record.msg and "train" in record.msg:
            _peak()

_setup = train_cli.setup_metric_logger
def _setup_then_peak(*args, **kwargs):
    _setup(*args, **kwargs)
    logging.getLogger("{metrics}").addHandler(_PeakAtEachStep())

train_cli.setup_metric_logger = _setup_then_peak
atexit.register(_peak)
sys.argv = ["speculators", *sys.argv[1:]]
if torch.accelerator.is_available():
    from eagle3_pipeline.adapters.fused_loss_kernels import separate_autotune_configs
    separate_autotune_configs()  # as the stage does: torch 2.11 cannot trace the fused loss otherwise
    adapted = contextlib.nullcontext()
else:
    from eagle3_pipeline.adapters.speculators_cpu import cpu_adapted
    adapted = cpu_adapted()
with adapted:
    app()
""".replace("{prefix}", PEAK_PREFIX).replace("{metrics}", METRICS_LOGGER)


@dataclass(frozen=True)
class Step:
    step: int
    at: float  # when the record was seen (time.perf_counter() of this process)
    step_ms: float
    tokens: float  # non-padding tokens of the step (tokens_per_s * step time)
    loss: float | None
    fetch_ms: float = 0.0  # waiting for the batch (the first step's includes starting the loader workers)

    @property
    def compute_ms(self) -> float:
        """The step less its fetch: forward, backward and optimizer, where compilation happens."""
        return max(0.0, self.step_ms - self.fetch_ms)


@dataclass
class TrainFigures:
    steps: int  # every step logged
    measured_steps: int  # those after the warm-up
    warmup_steps: int  # left out of the rates: the warm-up asked for, longer while steps still compiled
    steps_per_s: float | None  # None: no step after the warm-up (a run stopped by its budget)
    tokens_per_s: float | None
    median_step_ms: float | None
    compile_s: float | None  # compute time of the compiling steps above the steady median (SLOW)
    first_loss: float | None
    last_loss: float | None
    first_step_s: float | None  # from the start (of the stage, or the subprocess) to the first step's record
    wall_s: float
    after_loop_s: float | None  # from the last step's record to the end: checkpoint, validation (compiling)
    peak_memory_gib: float | None
    stopped: str | None = None  # None: ran to its end; "steps": after the steps measured; "budget": its time

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def step_from_record(message: Mapping[str, Any], at: float) -> Step | None:
    """A training step from one of speculators' metric mappings (None for the other records)."""
    profile, train = message.get("profile"), message.get("train")
    if not isinstance(profile, Mapping) or not isinstance(train, Mapping):
        return None
    step_ms, rate = float(profile["step_ms"]), float(profile["tokens_per_s"])
    fetch_ms = float(profile.get("fetch_ms", 0.0))
    loss = _float(train.get("loss"))
    return Step(int(message["global_step"]), at, step_ms, rate * step_ms / 1000, loss, fetch_ms)


def step_from_line(line: str, at: float) -> Step | None:
    """A training step from speculators' console line of that record (None for other lines)."""
    line = _ANSI.sub("", line)
    found = {name: pattern.search(line) for name, pattern in _FIELDS.items()}
    step, step_ms, rate, loss, fetch = (
        found[k] for k in ("step", "step_ms", "tokens_per_s", "loss", "fetch_ms")
    )
    if step is None or step_ms is None or rate is None:
        return None
    ms = float(step_ms.group(1))
    tokens = float(rate.group(1)) * ms / 1000
    fetch_ms = float(fetch.group(1)) if fetch else 0.0
    return Step(int(step.group(1)), at, ms, tokens, _float(loss and loss.group(1)), fetch_ms)


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float | str) and value != "" else None


class Progress:
    """A line on stderr at most every PROGRESS_S seconds while steps arrive: the step, its time, its loss;
    `snapshot`, called at the same moments, saves the figures so far (a run cut short keeps them)."""

    def __init__(
        self, label: str, started: float, snapshot: Callable[[list[Step]], None] | None = None
    ) -> None:
        self.label, self.started, self.last = label, started, started
        self.snapshot = snapshot

    def step(self, steps: list[Step]) -> None:
        at = steps[-1].at
        if len(steps) > 1 and at - self.last < PROGRESS_S:
            return
        self.last = at
        first, now = steps[0].at - self.started, at - self.started
        print(
            f"  {self.label}: step {steps[-1].step} at {now:.1f}s (first step at {first:.1f}s), "
            f"{steps[-1].step_ms:.1f} ms/step, loss {steps[-1].loss}",
            file=sys.stderr,
            flush=True,
        )
        if self.snapshot is not None:
            self.snapshot(steps)


class ConsoleReader:
    """speculators' console, line by line: a record's lines joined (rich wraps long ones), its step read."""

    def __init__(self, progress: Progress | None = None) -> None:
        self.steps: list[Step] = []
        self.progress = progress
        self.peak: int | None = None
        self._record: list[str] = []

    def feed(self, line: str, at: float) -> None:
        line = _ANSI.sub("", line).rstrip()
        if line.startswith(PEAK_PREFIX):
            self.peak = int(line[len(PEAK_PREFIX) :])
            return
        if _RECORD_START.match(line):
            self._record = []
        self._record.append(line.strip())
        if "global_step=" in line and (step := step_from_line(" ".join(self._record), at)):
            self.steps.append(step)
            self._record = []
            if self.progress:
                self.progress.step(self.steps)


class StepRecorder(logging.Handler):
    """Notes every training-step record of speculators' metric logger, with its arrival time; with
    `stop_after`, raises StopRun(STEPS) from the trainer's logging call once that many steps are noted."""

    def __init__(self, progress: Progress | None = None, stop_after: int | None = None) -> None:
        super().__init__(logging.INFO)
        self.steps: list[Step] = []
        self.progress = progress
        self.stop_after = stop_after

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, Mapping) and (step := step_from_record(record.msg, time.perf_counter())):
            self.steps.append(step)
            if self.progress:
                self.progress.step(self.steps)
            if self.stop_after is not None and len(self.steps) >= self.stop_after:
                raise StopRun(STEPS)


@contextmanager
def recording_steps(
    progress: Progress | None = None, stop_after: int | None = None
) -> Iterator[StepRecorder]:
    """A StepRecorder on speculators' metric logger for the block (the train stage sets its level)."""
    recorder = StepRecorder(progress, stop_after)
    metrics = logging.getLogger(METRICS_LOGGER)
    metrics.addHandler(recorder)
    try:
        yield recorder
    finally:
        metrics.removeHandler(recorder)


def warm_up(steps: list[Step], warmup: int) -> int:
    """How many first steps the rates leave out: `warmup`, and past it every step of the first half that
    still compiles (compute time above SLOW times the median of the steps after `warmup`); at least one step
    is kept as the start mark."""
    start = min(warmup, len(steps) - 1)
    typical = statistics.median(s.compute_ms for s in steps[start:])
    slow = [i for i, s in enumerate(steps[: len(steps) // 2]) if s.compute_ms > SLOW * typical]
    return min(max(start, slow[-1] + 1 if slow else 0), len(steps) - 1)


def compile_seconds(steps: list[Step], steady_ms: float) -> float | None:
    """Seconds the compiling steps (compute time above SLOW times `steady_ms`) took beyond a steady step."""
    if steady_ms <= 0:
        return None
    excess = sum(s.compute_ms - steady_ms for s in steps if s.compute_ms > SLOW * steady_ms)
    return round(excess / 1000, 2)


def summarize(
    steps: list[Step],
    warmup: int,
    started: float,
    ended: float,
    peak_bytes: int | None,
    stopped: str | None = None,
) -> TrainFigures:
    """Figures over the steps after the warm-up (`warm_up`); `started` and `ended` bound the whole run
    (perf_counter times). A run with no step (stopped by its budget while compiling) has no rates."""
    peak = round(peak_bytes / 2**30, 3) if peak_bytes is not None else None
    wall = round(ended - started, 2)
    if not steps:
        return TrainFigures(0, 0, 0, None, None, None, None, None, None, None, wall, None, peak, stopped)
    warm = warm_up(steps, warmup)
    span = steps[warm:]
    measured = span[1:]
    seconds = span[-1].at - span[0].at
    steady = statistics.median(s.compute_ms for s in (measured or span))
    return TrainFigures(
        steps=len(steps),
        measured_steps=len(measured),
        warmup_steps=warm,
        steps_per_s=round(len(measured) / seconds, 3) if seconds > 0 else None,
        tokens_per_s=round(sum(s.tokens for s in measured) / seconds, 1) if seconds > 0 else None,
        median_step_ms=round(statistics.median(s.step_ms for s in (measured or span)), 2),
        compile_s=compile_seconds(steps, steady),
        first_loss=steps[0].loss,
        last_loss=steps[-1].loss,
        first_step_s=round(steps[0].at - started, 2),
        wall_s=wall,
        after_loop_s=round(ended - steps[-1].at, 2),
        peak_memory_gib=peak,
        stopped=stopped,
    )


def stock_command(config: Path, save_path: Path) -> list[str]:
    """`speculators train --config run.yaml`, saving elsewhere (the same directory would resume ours)."""
    return [
        sys.executable,
        "-c",
        STOCK_WRAPPER,
        "train",
        "--config",
        str(config),
        "--save-path",
        str(save_path),
    ]


def stock_env(pythonpath: list[Path], threads: int | None) -> dict[str, str]:
    """A wide console, unbuffered output, the project importable for the wrapper."""
    env = {**os.environ, "COLUMNS": str(CONSOLE_COLUMNS), "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in pythonpath), env.get("PYTHONPATH", "")]).strip(
        os.pathsep
    )
    if threads is not None:  # on the CPU, as many torch threads as the stage used
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_stock(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    log: Path,
    warmup: int,
    stop_after: int | None = None,
    snapshot: Callable[[list[Step]], None] | None = None,
) -> TrainFigures:
    """Run the stock command: its steps (read as they come), wall time and CUDA peak, summarized. With
    `stop_after`, it is killed once it has logged that many steps; a StopRun (the phase's budget) kills it
    too, and the steps logged by then are summarized."""
    started = time.perf_counter()
    reader = ConsoleReader(Progress("stock", started, snapshot))
    stopped: str | None = None
    with log.open("w") as sink:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # its loader workers go with it when it is stopped
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                reader.feed(line, time.perf_counter())
                sink.write(line)
                if stop_after is not None and len(reader.steps) >= stop_after:
                    raise StopRun(STEPS)
        except StopRun as stop:
            stopped = stop.reason
            kill_group(proc)
        except BaseException:  # stopped early (a time limit, an interrupt): the training goes with us
            kill_group(proc)
            raise
        code = proc.wait()
    ended = time.perf_counter()
    if code != 0 and stopped is None:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise RuntimeError(f"stock `speculators train` exited with {code}; its log ends:\n{tail}")
    return summarize(reader.steps, warmup, started, ended, reader.peak, stopped)


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process and its session (it was started in a new one), then reap it."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def ratios(ours: TrainFigures, stock: TrainFigures) -> dict[str, float | None]:
    """ours / stock for the rates (above 1: ours is faster) and the times (below 1: ours is faster)."""
    pairs = {
        "stepsPerSecond": (ours.steps_per_s, stock.steps_per_s),
        "tokensPerSecond": (ours.tokens_per_s, stock.tokens_per_s),
        "firstStep": (ours.first_step_s, stock.first_step_s),
        "wall": (ours.wall_s, stock.wall_s),
    }
    return {k: round(a / b, 3) if a and b else None for k, (a, b) in pairs.items()}


def run_settings(run_yaml: Path) -> dict[str, Any]:
    """The run.yaml fields that differ between the CPU and a GPU, and those that size a step."""
    flat: dict[str, Any] = {}
    for group in yaml.safe_load(run_yaml.read_text())["train"].values():
        if isinstance(group, dict):
            flat.update(group)
    keys = ("draft_attn_impl", "loss_implementation", "num_workers", "total_seq_len", "ttt_steps", "epochs")
    return {k: flat.get(k) for k in keys}

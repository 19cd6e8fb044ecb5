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
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

METRICS_LOGGER = "speculators.metrics"
PROGRESS_S = 15.0  # at most one progress line per run this often: a run cut short shows how far it got
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
    "tokens_per_s": re.compile(r"\bprofile/tokens_per_s=" + _NUMBER),
    "loss": re.compile(r"\btrain/loss=" + _NUMBER),
}

# The stock command, in a `python -c` wrapper only to read the CUDA allocator's peak at exit (and, without an
# accelerator, to apply eagle3_pipeline.speculators_cpu's adaptation: speculators 0.9.0 trains on CUDA only;
# with one, the stage's workaround for the fused loss kernels, eagle3_pipeline.fused_loss_kernels, without
# which it fails on torch 2.11 as the stage would).
STOCK_WRAPPER = """\
import atexit, contextlib, sys
import torch
from speculators.cli import app

def _peak():
    if torch.cuda.is_available():
        print("{prefix}%d" % torch.cuda.max_memory_allocated(), flush=True)

atexit.register(_peak)
sys.argv = ["speculators", *sys.argv[1:]]
if torch.accelerator.is_available():
    from eagle3_pipeline.fused_loss_kernels import separate_autotune_configs
    separate_autotune_configs()  # as the stage does: torch 2.11 cannot trace the fused loss otherwise
    adapted = contextlib.nullcontext()
else:
    from eagle3_pipeline.speculators_cpu import cpu_adapted
    adapted = cpu_adapted()
with adapted:
    app()
""".replace("{prefix}", PEAK_PREFIX)


@dataclass(frozen=True)
class Step:
    step: int
    at: float  # when the record was seen (time.perf_counter() of this process)
    step_ms: float
    tokens: float  # non-padding tokens of the step (tokens_per_s * step time)
    loss: float | None


@dataclass
class TrainFigures:
    steps: int  # every step logged
    measured_steps: int  # those after the warmup
    steps_per_s: float
    tokens_per_s: float
    median_step_ms: float
    first_loss: float | None
    last_loss: float | None
    first_step_s: float  # from the start (of the stage, or of the subprocess) to the first step's record
    wall_s: float
    peak_memory_gib: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def step_from_record(message: Mapping[str, Any], at: float) -> Step | None:
    """A training step from one of speculators' metric mappings (None for the other records)."""
    profile, train = message.get("profile"), message.get("train")
    if not isinstance(profile, Mapping) or not isinstance(train, Mapping):
        return None
    step_ms, rate = float(profile["step_ms"]), float(profile["tokens_per_s"])
    loss = train.get("loss")
    return Step(int(message["global_step"]), at, step_ms, rate * step_ms / 1000, _float(loss))


def step_from_line(line: str, at: float) -> Step | None:
    """A training step from speculators' console line of that record (None for other lines)."""
    line = _ANSI.sub("", line)
    found = {name: pattern.search(line) for name, pattern in _FIELDS.items()}
    step, step_ms, rate, loss = (found[k] for k in ("step", "step_ms", "tokens_per_s", "loss"))
    if step is None or step_ms is None or rate is None:
        return None
    ms = float(step_ms.group(1))
    return Step(int(step.group(1)), at, ms, float(rate.group(1)) * ms / 1000, _float(loss and loss.group(1)))


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float | str) and value != "" else None


class Progress:
    """A line on stderr at most every PROGRESS_S seconds while steps arrive: the step, its time, its loss."""

    def __init__(self, label: str, started: float) -> None:
        self.label, self.started, self.last = label, started, started

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
    """Notes every training-step record of speculators' metric logger, with its arrival time."""

    def __init__(self, progress: Progress | None = None) -> None:
        super().__init__(logging.INFO)
        self.steps: list[Step] = []
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, Mapping) and (step := step_from_record(record.msg, time.perf_counter())):
            self.steps.append(step)
            if self.progress:
                self.progress.step(self.steps)


@contextmanager
def recording_steps(progress: Progress | None = None) -> Iterator[StepRecorder]:
    """A StepRecorder on speculators' metric logger for the block (the train stage sets its level)."""
    recorder = StepRecorder(progress)
    metrics = logging.getLogger(METRICS_LOGGER)
    metrics.addHandler(recorder)
    try:
        yield recorder
    finally:
        metrics.removeHandler(recorder)


def summarize(
    steps: list[Step], warmup: int, started: float, ended: float, peak_bytes: int | None
) -> TrainFigures:
    """Figures over the steps after the first `warmup` (at least one step is kept as the start mark);
    `started` and `ended` bound the whole run (perf_counter times)."""
    if not steps:
        raise RuntimeError("no training step was logged")
    start = min(warmup, len(steps) - 1)
    span = steps[start:]
    measured = span[1:]
    seconds = span[-1].at - span[0].at
    return TrainFigures(
        steps=len(steps),
        measured_steps=len(measured),
        steps_per_s=round(len(measured) / seconds, 3) if seconds > 0 else 0.0,
        tokens_per_s=round(sum(s.tokens for s in measured) / seconds, 1) if seconds > 0 else 0.0,
        median_step_ms=round(statistics.median(s.step_ms for s in (measured or span)), 2),
        first_loss=steps[0].loss,
        last_loss=steps[-1].loss,
        first_step_s=round(steps[0].at - started, 2),
        wall_s=round(ended - started, 2),
        peak_memory_gib=round(peak_bytes / 2**30, 3) if peak_bytes is not None else None,
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


def run_stock(argv: list[str], env: dict[str, str], cwd: Path, log: Path, warmup: int) -> TrainFigures:
    """Run the stock command: its steps (read as they come), wall time and CUDA peak, summarized."""
    started = time.perf_counter()
    reader = ConsoleReader(Progress("stock", started))
    with log.open("w") as sink:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                reader.feed(line, time.perf_counter())
                sink.write(line)
        except BaseException:  # stopped early (a time limit, an interrupt): the training goes with us
            proc.kill()
            raise
        code = proc.wait()
    ended = time.perf_counter()
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise RuntimeError(f"stock `speculators train` exited with {code}; its log ends:\n{tail}")
    return summarize(reader.steps, warmup, started, ended, reader.peak)


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

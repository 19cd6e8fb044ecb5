"""`benchmarks/gpu_pipeline.py` without a GPU: its arithmetic and its reading of speculators' step records.
Its CPU smoke run (tiny verifier, a few steps; the stock `speculators train` adapted to the CPU) is part of
the session's (tests/benchmarks/test_gpu_session.py); the GPU runs are tests/gpu's."""

from __future__ import annotations

import importlib
import io
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"


def bench(name: str) -> ModuleType:
    """A module of benchmarks/ (they import each other as top-level modules, as scripts do)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)


def step_record(step: int, step_ms: float, tokens_per_s: float, loss: float) -> dict[str, Any]:
    """A training-step record as speculators' trainer logs it to `speculators.metrics`."""
    return {
        "train": {"loss_0": loss / 3, "cond_acc_0": 0.25, "loss": loss, "error_records": 0.0},
        "profile": {
            "fetch_ms": 1.5,
            "step_ms": step_ms,
            "tokens_per_s": tokens_per_s,
            "memory_mb": {"fwd": 2e3},
        },
        "epoch": 0,
        "lr": {"Muon": 0.02, "AdamW": 1e-4},
        "global_step": step,
    }


def test_the_1b_verifier_has_about_a_billion_parameters_and_a_roofline_from_its_matmuls() -> None:
    roofline = bench("gpu_roofline")
    shape = roofline.SIZES["1b"]
    assert 1.0e9 < shape.total_params() < 1.2e9 and shape.matmul_params() == 16 * 60_821_504 + 2048
    flops = roofline.prefill_flops_per_token(shape, 640)
    assert flops == 2 * shape.matmul_params() + 2 * 16 * 640 * 2048
    peak = roofline.peak_flops("NVIDIA H200", None)
    assert peak == 989e12 and roofline.roofline_tokens_per_s(shape, 640, peak) == pytest.approx(peak / flops)
    assert (
        roofline.peak_flops("NVIDIA H100 PCIe", None)
        == 756e12
        != roofline.peak_flops("NVIDIA H100 80GB", None)
    )
    assert roofline.peak_flops("NVIDIA A100-SXM4-80GB", None) == 312e12
    assert roofline.peak_flops("Some GPU", None) is None and roofline.peak_flops("Some GPU", 2.0) == 2e12
    assert roofline.fraction(100.0, None) is None and roofline.fraction(50.0, 200.0) == 0.25


@pytest.mark.parametrize("width", [100, 2000])
def test_speculators_console_reads_as_the_records_it_prints(width: int) -> None:
    """The stock command is read from its console: records as speculators' own handler and filter print them,
    one line each on a wide console, wrapped over several on a narrow one."""
    from rich.console import Console
    from rich.logging import RichHandler
    from speculators.train.logger import FormatDictFilter

    train_bench = bench("gpu_train_bench")
    out = io.StringIO()
    handler = RichHandler(console=Console(file=out, width=width))
    handler.addFilter(FormatDictFilter())
    log = logging.getLogger(f"test.gpu_pipeline.console{width}")
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    records = [step_record(7, 45.123, 45_400.0, 2.5), step_record(8, 1234.5, 512.25, 0.125)]
    log.info("Training epoch 1/1 started")
    for record in records:
        log.info(dict(record))
    log.info({"val": {"loss_epoch": 0.151}, "epoch": 0})
    log.removeHandler(handler)
    assert (out.getvalue().count("\n") > 4 * len(records)) == (width < 1000), "wrapped only when narrow"
    reader = train_bench.ConsoleReader()
    for line in [*out.getvalue().splitlines(keepends=True), f"{train_bench.PEAK_PREFIX}1073741824\n"]:
        reader.feed(line, 1.0)
    direct = [train_bench.step_from_record(r, 1.0) for r in records]
    assert (
        [(s.step, s.loss) for s in reader.steps]
        == [(d.step, d.loss) for d in direct]
        == [(7, 2.5), (8, 0.125)]
    )
    for parsed, expected in zip(reader.steps, direct, strict=True):
        assert parsed.step_ms == pytest.approx(expected.step_ms, rel=5e-3)  # 3 digits above 999 ms
        assert parsed.tokens == pytest.approx(expected.tokens, rel=1e-2)
        assert parsed.fetch_ms == expected.fetch_ms == 1.5
    assert reader.peak == 2**30


def test_rates_count_the_steps_after_the_warmup_between_their_records() -> None:
    train_bench = bench("gpu_train_bench")
    steps = [train_bench.Step(i, 10.0 + i * 0.5, 400.0, 1000.0, 3.0 - i) for i in range(5)]
    figures = train_bench.summarize(steps, warmup=1, started=8.0, ended=20.0, peak_bytes=2**30)
    assert (figures.steps, figures.measured_steps) == (5, 3)
    assert figures.steps_per_s == pytest.approx(3 / 1.5) and figures.tokens_per_s == pytest.approx(3000 / 1.5)
    assert (figures.first_loss, figures.last_loss, figures.first_step_s, figures.wall_s) == (
        3.0,
        -1.0,
        2.0,
        12.0,
    )
    assert figures.peak_memory_gib == 1.0


def online_run(tokens_per_s: float, estimate: float, stored: int) -> dict[str, Any]:
    return {
        "trainTokensPerSecond": tokens_per_s,
        "trainSeconds": 12.5,
        "estimatedAcceptanceLength": estimate,
        "storedBytes": stored,
        "peakStagingBytes": stored // 10,
        "log": "x.log",
    }


def test_the_online_comparison_reports_ratios_and_what_was_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    online, report = bench("gpu_online"), bench("gpu_report")
    monkeypatch.delenv("EAGLE3_VLLM", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    vllm, why = online.find_vllm(None)
    assert vllm is None and "no vLLM" in why and "64 MiB" in why
    assert "mooncake_master" in online.mooncake_problem()
    runs = {
        "offline": online_run(1000.0, 2.0, 3 * 2**30),
        "volume": online_run(900.0, 2.06, 0),
        "mooncake": {"mode": "mooncake", "error": "stopped at its time limit", "log": "m.log"},
    }
    ratio = online.compare(runs)
    assert ratio == {
        "volume": {
            "trainTokensPerSecond": 0.9,
            "estimatedAcceptanceLength": 1.03,
            "estimatedAcceptanceLengthWithin5Percent": True,
        }
    }
    producer = [
        {
            "concurrency": 1,
            "rows": 64,
            "samplesPerSecond": 5.0,
            "tokensPerSecond": 3200.0,
            "megabytesPerSecond": 50.0,
        }
    ]
    text = "\n".join(
        report.online(
            {"runs": runs, "ratio": ratio, "producer": producer, "skipped": {"mooncake": "no master"}}
        )
    )
    assert "| offline, vLLM extraction | 1,000 | 1 | 12.5 | 3.00 GiB | 0.30 GiB |" in text
    assert "| online, volume transfer | 900 | 0.9 |" in text
    assert (
        "stopped at its time limit (log: m.log)" in text
        and "| concurrency 1 | 64 | 5.0 | 3,200 | 50.0 |" in text
    )
    assert "estimatedAcceptanceLength 1.03 (within 5%)" in text and "mooncake: skipped: no master" in text
    skipped = report.online({"runs": {}, "skipped": {"all": why}})
    assert skipped == [f"Online comparison, all: skipped: {why}."]


def test_compilation_is_counted_apart_and_the_warm_up_lasts_while_steps_compile() -> None:
    """Steps 0 and 1 compile (step 1 recompiles for a new shape), step 6 recompiles late: the rates start
    after step 1 (the configured warm-up is 1 step), and the compile seconds are the slow steps' excess over
    the steady median; the first step's fetch (starting the loader) is not compilation."""
    train_bench = bench("gpu_train_bench")
    compute = [60_000.0, 20_000.0, 100.0, 100.0, 100.0, 100.0, 5_100.0, 100.0, 100.0, 100.0]
    steps, at = [], 30.0
    for i, ms in enumerate(compute):
        fetch = 8_000.0 if i == 0 else 1.0
        at += (ms + fetch) / 1000
        steps.append(train_bench.Step(i, at, ms + fetch, 1000.0, 1.0, fetch))
    figures = train_bench.summarize(steps, warmup=1, started=0.0, ended=at + 50.0, peak_bytes=None)
    assert figures.warmup_steps == 2 and figures.measured_steps == 7
    assert figures.compile_s == pytest.approx((59_900 + 19_900 + 5_000) / 1000)
    assert figures.first_step_s == pytest.approx(30 + 68.0) and figures.after_loop_s == 50.0
    assert figures.median_step_ms == 101.0 and figures.stopped is None
    empty = train_bench.summarize([], warmup=10, started=0.0, ended=120.0, peak_bytes=None, stopped="budget")
    assert (empty.steps, empty.tokens_per_s, empty.compile_s, empty.wall_s) == (0, None, None, 120.0)
    assert empty.stopped == "budget"


def test_a_run_stops_from_the_trainers_logging_call_once_it_has_its_steps() -> None:
    train_bench, budget = bench("gpu_train_bench"), bench("gpu_budget")
    metrics = logging.getLogger(train_bench.METRICS_LOGGER)
    level = metrics.level
    metrics.setLevel(logging.INFO)
    logged = 0
    try:
        with (
            pytest.raises(budget.StopRun) as stop,
            train_bench.recording_steps(stop_after=3) as recorder,
        ):
            for step in range(10):
                metrics.info(step_record(step, 50.0, 1000.0, 1.0))
                logged += 1
    finally:
        metrics.setLevel(level)
    assert stop.value.reason == budget.STEPS and logged == 2 and len(recorder.steps) == 3
    assert recorder not in metrics.handlers


def test_phase_budgets_parse_and_a_deadline_stops_the_block() -> None:
    budget = bench("gpu_budget")
    phases = ("build", "train")
    assert budget.parse_budgets(["train=105", "build=2.5"], phases) == {"train": 105.0, "build": 2.5}
    assert budget.parse_budgets(None, phases) == {}
    for wrong in ("train", "stock=5", "train=soon", "train=0"):
        with pytest.raises(ValueError, match="--budget"):
            budget.parse_budgets([wrong], phases)
    with pytest.raises(budget.StopRun) as stop, budget.deadline(0.05):
        while True:  # ended by the timer, however long the machine takes to fire it
            pass
    assert stop.value.reason == budget.BUDGET
    with budget.deadline(None):
        pass


def test_the_benchmark_options_parse_into_its_plan() -> None:
    pipeline = bench("gpu_pipeline")
    argv = ["--size", "1b", "--steps", "60", "--stop-after-steps", "50", "--budget", "train=115"]
    plan = pipeline.plan(pipeline.parse_args(argv))
    assert plan["warmup"] == 6 and plan["stop_after_steps"] == 50 and plan["seq_len"] == 2048
    assert plan["budgets"] == {"train": 115.0}
    for wrong in (["--budget", "lunch=5"], ["--steps", "60", "--stop-after-steps", "7"]):
        with pytest.raises(SystemExit):
            pipeline.parse_args(wrong)

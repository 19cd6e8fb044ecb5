"""`benchmarks/train_cpu.py` without training: its manifest, its observer's records, its figures and table.

The benchmark itself (two trainings per repeat, minutes on a small CPU) is run by hand; docs/benchmarks.md.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from benchmarks import train_cpu
from benchmarks.train_cpu import Run, Span


def test_the_benchmark_spec_is_the_tiny_example_without_regeneration(tmp_path: Path) -> None:
    from eagle3_contract.api.manifest import load_manifest
    from eagle3_contract.stages import Stage, plan_stages

    run = load_manifest(train_cpu.bench_manifest(tmp_path, epochs=2))
    assert not run.spec.regeneration.enabled and run.spec.training.epochs == 2
    plans = {p.stage: p for p in plan_stages(run.spec)}
    assert plans[Stage.GENERATE].skipped, "no vLLM needed"
    assert plans[Stage.TRAIN].inputs["prepare"] == plans[Stage.PREPARE].output_dir


def test_the_100m_shape_trains_a_real_checkpoints_draft_on_the_same_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: hidden 576, vocabulary 49,152 (the verifier's), draft vocabulary 8,192, sequences of 512."""
    from eagle3_contract.api.manifest import load_manifest

    assert train_cpu.SHAPE_100M["hidden_size"] == 576 and train_cpu.SHAPE_100M["vocab_size"] == 49_152
    monkeypatch.setattr(train_cpu, "verifier_100m", lambda root: "/models/bench-100m-llama")
    run = load_manifest(train_cpu.bench_manifest(tmp_path, epochs=1, shape="100m"))
    tiny = load_manifest(train_cpu.bench_manifest(tmp_path, epochs=1))
    assert run.spec.verifier.model == "/models/bench-100m-llama" and run.spec.draft.vocab_size == 8192
    assert run.spec.training.sequence_length == 512 and run.spec.dataset.max_sequence_length == 512
    assert run.spec.dataset.source == tiny.spec.dataset.source and run.name != tiny.name


def emit_training(epochs: int, steps: int) -> None:
    """The records speculators' Trainer logs, in its order, on its loggers."""
    text, metrics = logging.getLogger("speculators"), logging.getLogger("speculators.metrics")
    for epoch in range(epochs):
        text.info(f"Training epoch {epoch + 1}/{epochs} started")
        for step in range(steps):
            profile = {"step_ms": 100.0, "fetch_ms": 10.0, "tokens_per_s": 500.0}
            record = {"train": {"loss": float(epoch * 10 + step)}, "profile": profile, "epoch": epoch}
            metrics.info(record)
        text.info(f"Training epoch {epoch + 1}/{epochs} completed")
        text.info(f"Validation epoch {epoch + 1}/{epochs} started")
        metrics.info({"val": {"loss_epoch": 5.0 - epoch}, "epoch": epoch})
        text.info(f"Validation epoch {epoch + 1}/{epochs} completed")


def test_the_observer_records_what_the_figures_are_measured_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv(train_cpu.EVENTS_ENV, str(events))
    caplog.set_level(logging.INFO, logger="speculators")
    namespace: dict[str, Any] = {}
    exec(train_cpu.OBSERVER, namespace)  # what both benchmark processes run first
    try:
        emit_training(epochs=2, steps=3)
    finally:
        for name in ("speculators", "speculators.metrics"):
            for f in [f for f in logging.getLogger(name).filters if type(f).__name__ == "_Observer"]:
                logging.getLogger(name).removeFilter(f)
        namespace["_sink"].close()
    run = train_cpu.measure("ours", 0, events, Span(start=0.0, end=1e12, cpu=2.0))
    assert (run.epochs, run.steps, run.tokens) == (2, 6, 300)
    assert run.step_s == pytest.approx(0.6) and run.fetch_s == pytest.approx(0.06)
    assert run.final_train_loss == 11.0 and run.val_losses == [5.0, 4.0]
    assert 0 < run.val_s < run.loop_s and run.loop_cpu_s >= 0 and run.cpu_s == 2.0
    assert run.threads >= 1


def fake(tool: str, step_s: float, steps: int = 10) -> Run:
    return Run(
        tool=tool, index=0, threads=1, epochs=1, steps=steps, tokens=1000, step_s=step_s, fetch_s=0.1,
        val_s=0.2, loop_s=step_s + 1, startup_s=5.0, wall_s=step_s + 8, loop_cpu_s=step_s + 1,
        startup_cpu_s=5.0, cpu_s=step_s + 7, final_train_loss=1.0, val_losses=[2.0],
    )  # fmt: skip


def test_the_ratio_is_ours_over_stock_of_the_medians() -> None:
    runs = [fake("ours", 1.0), fake("stock", 2.0), fake("stock", 4.0), fake("ours", 3.0)]
    s = train_cpu.summary(runs)
    assert s["medians"]["ours"]["step_tokens_per_s"] == pytest.approx((1000 + 1000 / 3) / 2)
    assert s["ratio"]["step_s"] == pytest.approx(2.0 / 3.0)
    text = train_cpu.table(runs, s, train_cpu.WALL_HEAD, train_cpu.WALL)
    rows = text.splitlines()
    assert len(rows) == 5 and all(r.count("|") == rows[0].count("|") for r in rows)
    assert rows[-1].startswith("| ratio ours / stock |")
    assert len(train_cpu.equivalence(runs)) == 4


def test_runs_of_different_lengths_are_refused() -> None:
    with pytest.raises(SystemExit, match="differ in steps"):
        train_cpu.equivalence([fake("ours", 1.0), fake("stock", 1.0, steps=11)])

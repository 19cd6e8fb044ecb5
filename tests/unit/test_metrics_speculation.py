"""The canary's and evaluate's sweep's gauges: read from status.canary and status.checkpoint.speculation."""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.speculation import BaselineCell, SpeculationTable, SweepCell, plan_schedule
from eagle3_contract.api.status import Eagle3RunStatus, RunPhase
from eagle3_operator.metrics import OperatorMetrics
from eagle3_operator.reconcile.planner import previous_status
from tests.unit.test_metrics import report, sample, series

MODEL = "Qwen/Qwen3-8B"
CELLS = [
    SweepCell(num_speculative_tokens=k, concurrency=c, acceptance_length=al, output_tokens_per_second=tps,
              speedup=tps / base)
    for c, base, rows in (
        (1, 100.0, ((1, 1.6, 150.0), (3, 2.1, 190.0))),
        (8, 400.0, ((1, 1.6, 420.0), (3, 2.1, 380.0))),
        (32, 900.0, ((1, 1.5, 850.0), (3, 2.0, 700.0))),
    )
    for k, al, tps in rows
]  # fmt: skip
BASELINES = [
    BaselineCell(concurrency=c, output_tokens_per_second=t) for c, t in ((1, 100.0), (8, 400.0), (32, 900.0))
]


def table(cells: list[SweepCell] = CELLS) -> dict[str, Any]:
    concurrencies = {c.concurrency for c in cells}
    baselines = [b for b in BASELINES if b.concurrency in concurrencies]
    return SpeculationTable(cells=cells, baselines=baselines, schedule=plan_schedule(cells)).model_dump(
        mode="json", by_alias=True
    )


def with_sweep(speculation: dict[str, Any] | None) -> dict[str, Any]:
    checkpoint: dict[str, Any] = {"path": "export/abc", "sha256": "f" * 64}
    if speculation is not None:
        checkpoint["speculation"] = speculation
    return {"phase": "Serving", "checkpoint": checkpoint}


def cell(metrics: OperatorMetrics, name: str, k: str, concurrency: str) -> float | None:
    labels = {"namespace": "ns", "run": "a", "model": MODEL, "k": k, "concurrency": concurrency}
    return sample(metrics, name, **labels)


def schedule_of(metrics: OperatorMetrics) -> dict[tuple[str, str], float]:
    return {
        (s.labels["min_batch_size"], s.labels["max_batch_size"]): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "eagle3_run_speculation_length" and s.labels["run"] == "a"
    }


def test_every_sweep_cell_and_the_baseline_as_k_zero() -> None:
    metrics = OperatorMetrics()
    metrics.observe(report(RunPhase.SERVING, status=with_sweep(table()), model=MODEL))
    assert cell(metrics, "eagle3_run_sweep_acceptance_length", "3", "1") == 2.1
    assert cell(metrics, "eagle3_run_sweep_output_tokens_per_second", "1", "8") == 420.0
    assert cell(metrics, "eagle3_run_sweep_speedup", "3", "32") == 700.0 / 900.0
    assert cell(metrics, "eagle3_run_sweep_output_tokens_per_second", "0", "32") == 900.0
    assert cell(metrics, "eagle3_run_sweep_speedup", "0", "8") == 1.0
    assert cell(metrics, "eagle3_run_sweep_acceptance_length", "0", "8") is None  # no draft, no acceptance
    # k 3 at 1, k 1 at 8, nothing beats the verifier alone at 32: off there
    assert schedule_of(metrics) == {("1", "2"): 3.0, ("3", "16"): 1.0, ("17", "32"): 0.0}


def test_a_new_table_replaces_every_sweep_series_and_none_removes_them() -> None:
    metrics = OperatorMetrics()
    metrics.observe(report(RunPhase.SERVING, status=with_sweep(table()), model=MODEL))
    narrower = [c for c in CELLS if c.concurrency == 1]
    metrics.observe(report(RunPhase.SERVING, status=with_sweep(table(narrower)), model=MODEL))
    assert cell(metrics, "eagle3_run_sweep_output_tokens_per_second", "1", "8") is None
    assert cell(metrics, "eagle3_run_sweep_output_tokens_per_second", "0", "32") is None
    assert cell(metrics, "eagle3_run_sweep_speedup", "3", "1") == 1.9
    assert schedule_of(metrics) == {("1", "1"): 3.0}
    metrics.observe(report(RunPhase.SERVING, status=with_sweep(None), model=MODEL))
    assert not {name for name, _ in series(metrics, "a")} & {
        "eagle3_run_sweep_acceptance_length", "eagle3_run_sweep_output_tokens_per_second",
        "eagle3_run_sweep_speedup", "eagle3_run_speculation_length",
    }  # fmt: skip


def test_a_malformed_table_in_the_stored_status_reaches_no_gauge() -> None:
    """The API server may hold a status this operator cannot read (another version wrote a table it does not
    know): the planner reads it as empty (planner.previous_status) and writes its own, so the metrics, which
    read the planned status, never see the malformed table."""
    bad = with_sweep({"cells": [{"numSpeculativeTokens": "many", "concurrency": 1}]})
    read = previous_status(bad)
    assert read == Eagle3RunStatus()
    metrics = OperatorMetrics()
    metrics.observe(report(RunPhase.SERVING, status=read.document(), model=MODEL))
    assert not [name for name, _ in series(metrics, "a") if "sweep" in name or "speculation" in name]


def canary_status(phase: str, **fields: Any) -> dict[str, Any]:
    return {
        "phase": "Serving",
        "canary": {"phase": phase, "deployment": "a-vllm-canary", "draft": "export/new", **fields},
    }


def figures(acceptance: float | None, speed: float | None, requests: int | None) -> dict[str, Any]:
    return {"acceptanceLength": acceptance, "outputTokensPerSecond": speed, "requests": requests}


def canary_of(metrics: OperatorMetrics, name: str, track: str) -> float | None:
    return sample(metrics, name, namespace="ns", run="a", track=track)


def phases(metrics: OperatorMetrics) -> dict[str, float | None]:
    return {
        p: sample(metrics, "eagle3_run_canary_phase", namespace="ns", run="a", phase=p)
        for p in ("Observing", "Promoted", "RolledBack")
    }


def test_an_observing_canary_before_its_figures_has_its_phase_only() -> None:
    metrics = OperatorMetrics()
    metrics.observe(report(RunPhase.SERVING, status=canary_status("Observing")))
    assert phases(metrics) == {"Observing": 1.0, "Promoted": 0.0, "RolledBack": 0.0}
    assert canary_of(metrics, "eagle3_run_canary_acceptance_length", "canary") is None


def test_both_tracks_figures_then_the_decision() -> None:
    metrics = OperatorMetrics()
    observing = canary_status("Observing", incumbent=figures(2.0, 41.5, 120), canary=figures(1.0, None, 7))
    metrics.observe(report(RunPhase.SERVING, status=observing))
    assert canary_of(metrics, "eagle3_run_canary_acceptance_length", "stable") == 2.0
    assert canary_of(metrics, "eagle3_run_canary_acceptance_length", "canary") == 1.0
    assert canary_of(metrics, "eagle3_run_canary_output_tokens_per_second", "stable") == 41.5
    assert canary_of(metrics, "eagle3_run_canary_output_tokens_per_second", "canary") is None
    assert canary_of(metrics, "eagle3_run_canary_requests", "canary") == 7
    assert sample(metrics, "eagle3_run_canary_decision_seconds", namespace="ns", run="a") is None
    decided = canary_status(
        "RolledBack",
        incumbent=figures(2.0, 41.5, 300),
        canary=figures(1.0, 40.0, 150),
        secondsToDecision=21.5,
    )
    metrics.observe(report(RunPhase.SERVING, status=decided))
    assert phases(metrics) == {"Observing": 0.0, "Promoted": 0.0, "RolledBack": 1.0}
    assert canary_of(metrics, "eagle3_run_canary_requests", "stable") == 300
    assert canary_of(metrics, "eagle3_run_canary_output_tokens_per_second", "canary") == 40.0
    assert sample(metrics, "eagle3_run_canary_decision_seconds", namespace="ns", run="a") == 21.5


def test_the_canary_series_go_with_status_canary_and_with_the_run() -> None:
    metrics = OperatorMetrics()
    status = canary_status("Promoted", incumbent=figures(1.5, 40.0, 10), canary=figures(1.6, 41.0, 10))
    metrics.observe(report(RunPhase.SERVING, status=status))
    assert [name for name, _ in series(metrics, "a") if name.startswith("eagle3_run_canary_")]
    metrics.observe(report(RunPhase.SERVING, status={"phase": "Serving"}))
    assert not [name for name, _ in series(metrics, "a") if name.startswith("eagle3_run_canary_")]
    metrics.observe(report(RunPhase.SERVING, status=status | with_sweep(table()), model=MODEL))
    metrics.forget_run("ns", "a")
    assert series(metrics, "a") == set()


def test_the_drafts_evaluate_chose_from_each_have_their_figures_and_the_chosen_is_marked() -> None:
    """Issue 31: draft.candidates (and checkpoint selection) on the dashboard: each draft evaluate measured,
    from its result's checkpointSelection; the series go with the choice."""
    checkpoints = [
        {"epoch": 5, "checkpoint": f"candidates/{m}/checkpoints/checkpoint_best", "method": m,
         "acceptanceLength": length, "outputTokensPerSecond": speed}
        for m, length, speed in (("eagle3", 3.1, 410.0), ("dflash", 2.4, 520.0))
    ]  # fmt: skip
    choice = {"by": "outputTokensPerSecond", "epoch": 5, "checkpoint": checkpoints[1]["checkpoint"]}
    evaluate = {
        "phase": "Succeeded",
        "result": {"checkpointSelection": choice | {"checkpoints": checkpoints}},
    }
    metrics = OperatorMetrics()
    metrics.observe(report(RunPhase.SERVING, status={"stages": {"evaluate": evaluate}}, model=MODEL))
    labels = {"namespace": "ns", "run": "a", "model": MODEL}
    speed = "eagle3_run_choice_output_tokens_per_second"
    assert sample(metrics, speed, **labels, draft="dflash", chosen="1") == 520.0
    assert sample(metrics, speed, **labels, draft="eagle3", chosen="0") == 410.0
    length = "eagle3_run_choice_acceptance_length"
    assert sample(metrics, length, **labels, draft="eagle3", chosen="0") == 3.1
    metrics.observe(report(RunPhase.SERVING, status={"stages": {}}, model=MODEL))
    assert sample(metrics, speed, **labels, draft="dflash", chosen="1") is None  # gone with the choice


def with_categories(rows: list[dict[str, Any]] | None) -> dict[str, Any]:
    checkpoint: dict[str, Any] = {"path": "export/abc", "sha256": "f" * 64}
    if rows is not None:
        checkpoint["categories"] = rows
    return {"phase": "Serving", "checkpoint": checkpoint}


def test_acceptance_per_category_is_labelled_by_category_and_goes_with_it() -> None:
    rows = [
        {"category": "add", "prompts": 3, "acceptanceLength": 2.4, "acceptanceRate": 0.47, "speedup": 1.6},
        {"category": "other", "prompts": 2, "acceptanceLength": 1.2, "acceptanceRate": None, "speedup": None},
    ]
    metrics = OperatorMetrics()
    metrics.observe(report(RunPhase.SERVING, status=with_categories(rows), model=MODEL))

    def of(name: str, category: str) -> float | None:
        return sample(metrics, name, namespace="ns", run="a", model=MODEL, category=category)

    assert of("eagle3_run_category_acceptance_length", "add") == 2.4
    assert of("eagle3_run_category_acceptance_rate", "add") == 0.47
    assert of("eagle3_run_category_speedup", "add") == 1.6
    assert of("eagle3_run_category_acceptance_length", "other") == 1.2
    assert of("eagle3_run_category_speedup", "other") is None  # unknown: no series, not 0
    metrics.observe(report(RunPhase.SERVING, status=with_categories(rows[1:]), model=MODEL))
    assert of("eagle3_run_category_acceptance_length", "add") is None  # a category gone drops its series
    metrics.observe(report(RunPhase.SERVING, status=with_categories(None), model=MODEL))
    assert not {name for name, _ in series(metrics, "a") if name.startswith("eagle3_run_category_")}


def test_both_comparisons_as_the_median_ratio_and_its_interval() -> None:
    metrics = OperatorMetrics()
    ratio = {"confidence": 0.969, "rounds": 6, "spread": 0.05}
    status = canary_status(
        "Promoted",
        acceptanceRatio=ratio | {"ratio": 1.5, "low": 1.4, "high": 1.6},
        speedRatio=ratio | {"ratio": 1.2, "low": 0.9, "high": 1.3},
    )
    metrics.observe(report(RunPhase.SERVING, status=status))

    def bound(figure: str, which: str) -> float | None:
        labels = {"namespace": "ns", "run": "a", "figure": figure, "bound": which}
        return sample(metrics, "eagle3_run_canary_ratio", **labels)

    assert [bound("acceptance_length", b) for b in ("ratio", "low", "high")] == [1.5, 1.4, 1.6]
    assert [bound("output_tokens_per_second", b) for b in ("ratio", "low", "high")] == [1.2, 0.9, 1.3]
    metrics.observe(report(RunPhase.SERVING, status=canary_status("Observing")))
    assert bound("acceptance_length", "low") is None  # no comparison yet: no series

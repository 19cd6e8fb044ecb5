"""One speedup, one meaning (issue 29): evaluate's headline speedup as `eagle3 run`'s summary, `eagle3
status`, the operator's metrics and the dashboard show it, against the sweep table printed beside it.

The demo's summary once said `speedup=0.7059` (the main runs, 8 requests in flight) while the sweep under it
said 1.02x and 1.07x for the same k: two figures under one name. Now the headline is the sweep's cell at
evaluate's k nearest the main runs' concurrency, and every place names the k and the concurrency."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rich.console import Console

from eagle3_cli.status import result_text
from eagle3_contract.api.status import Eagle3RunStatus, RunPhase
from eagle3_contract.results import EvaluateResult
from eagle3_contract.stages import Stage
from eagle3_operator.metrics import OperatorMetrics
from eagle3_operator.observability import speculation_queries as sq
from eagle3_operator.observability.dashboard import build_dashboard
from eagle3_operator.reconcile.run_report import RunReport
from eagle3_pipeline.local.display import StageOutcome, summary_table
from eagle3_pipeline.local.evaluation_tables import sweep_table
from eagle3_pipeline.stages.evaluate.summary import with_sweep
from eagle3_pipeline.stages.evaluate.sweep import SpeculationSweep
from tests.pipeline.test_evaluate_sweep import context, measured, prompts_of, steady
from tests.unit.test_metrics import NOW

# the demo's shape: k 1 and 3 at concurrency 1 and 4; evaluate's own k is 3, its main runs had 8 in flight
CELLS = ((3, 1, 25.5), (3, 4, 64.2), (1, 1, 22.0), (1, 4, 70.0))
BASELINES = ((1, 25.0), (4, 60.0))
MAIN = {"numSpeculativeTokens": 3, "acceptanceLength": 3.28, "speedup": 0.7059, "speedupConcurrency": 8}


def evaluated(tmp_path: Path) -> EvaluateResult:
    """evaluate's result as the stage writes it, from a sweep measured at the demo's cells."""
    ctx = context(tmp_path, sweep={"numSpeculativeTokens": [1, 3]}, concurrencies=[1, 4])
    sweep = SpeculationSweep.of(ctx, prompts_of(16))
    assert sweep is not None
    base = dict(BASELINES)
    for k in (3, 1):
        measured(sweep, k, {c: (steady(base[c]), steady(t)) for kk, c, t in CELLS if kk == k})
    return EvaluateResult.model_validate(with_sweep(MAIN | {"message": None}, sweep))


def rendered(table: Any) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def exported(result: EvaluateResult) -> dict[str, Any]:
    """The operator's eagle3_run_speedup sample for a run whose evaluate finished with `result`."""
    document = {
        "phase": "Succeeded",
        "stages": {
            "evaluate": {"phase": "Succeeded", "result": result.model_dump(mode="json", by_alias=True)}
        },
    }
    metrics = OperatorMetrics()
    metrics.observe(
        RunReport(
            namespace="ns", run="tiny", phase=RunPhase.SUCCEEDED, now=NOW, model="tiny",
            status=Eagle3RunStatus.model_validate(document),
        )
    )  # fmt: skip
    (sample,) = [
        s for family in metrics.registry.collect() for s in family.samples if s.name == sq.EVALUATED_SPEEDUP
    ]
    return {**sample.labels, "value": sample.value}


def test_the_summary_status_metrics_and_dashboard_show_the_sweeps_figure(tmp_path: Path) -> None:
    result = evaluated(tmp_path)
    assert (result.speedup, result.speedup_concurrency) == (1.07, 4)  # 64.2 / 60, the sweep's k-3 cell at 4
    outcome = StageOutcome(stage=Stage.EVALUATE, status="done", seconds=1.0, attempts=1, result=result)
    # eagle3 run's summary: the figure and where it was measured
    summary = rendered(summary_table([outcome]))
    assert "speedup=1.07, speedupConcurrency=4" in summary, summary
    # the sweep table under it: k 3's cell at concurrency 4 says the same
    sweep = rendered(sweep_table([outcome]))
    (k3,) = [line for line in sweep.splitlines() if re.match(r"^\W*3\s", line)]
    assert "(1.50, 1.07x [" in k3.split("│")[3], sweep  # columns: k, concurrency 1, concurrency 4
    # eagle3 status
    assert (
        result_text(Stage.EVALUATE, result, None)
        == "acceptance length 3.28, speedup 1.07x [1.07, 1.07] at k=3, 4 in flight"  # steady rounds
    )
    # the operator's metric, labelled with the k and the concurrency the dashboard's legend names
    assert exported(result) == {
        "namespace": "ns", "run": "tiny", "model": "tiny", "k": "3", "concurrency": "4", "value": 1.07,
    }  # fmt: skip
    panels = [p for p in build_dashboard()["panels"] if p.get("title") == "Evaluated speedup"]
    (target,) = panels[0]["targets"]
    assert target["expr"] == sq.evaluated_speedup()
    assert "{{k}}" in target["legendFormat"] and "{{concurrency}} in flight" in target["legendFormat"]


def test_without_a_sweep_at_its_k_the_headline_is_the_main_runs_and_says_so(tmp_path: Path) -> None:
    result = EvaluateResult.model_validate(MAIN)
    assert result_text(Stage.EVALUATE, result, None) == (
        "acceptance length 3.28, speedup 0.706x at k=3, 8 in flight (one run each, unpaired)"
    )
    assert exported(result)["concurrency"] == "8" and exported(result)["value"] == 0.7059

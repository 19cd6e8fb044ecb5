"""The dashboard has the panels, variables and annotations the issue asks for, each panel explained."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_operator.observability import queries as q
from eagle3_operator.observability import speculation_queries as sq
from eagle3_operator.observability import stage_metrics_queries as pq
from eagle3_operator.observability.dashboard import build_dashboard
from tests.unit.observability.obs_support import dashboard, panels

# title -> (type, unit, the queries it must show)
REQUIRED: dict[str, tuple[str, str, list[str]]] = {
    "Acceptance rate": ("timeseries", "percentunit", [q.acceptance_rate()]),
    "Mean acceptance length: live vs evaluated": (
        "timeseries",
        "none",
        [q.mean_acceptance_length(), q.evaluated_acceptance_length()],
    ),
    "Acceptance by draft position": ("timeseries", "percentunit", [q.acceptance_by_position()]),
    "Accepted tokens/s": ("timeseries", "tps", [q.accepted_tokens_per_second()]),
    "Generation tokens/s": ("timeseries", "tps", [q.generation_tokens_per_second()]),
    "Time to first token (p50, p95)": ("timeseries", "s", [q.ttft_quantile(0.5), q.ttft_quantile(0.95)]),
    "Inter-token latency (p50, p95)": ("timeseries", "s", [q.itl_quantile(0.5), q.itl_quantile(0.95)]),
    "Running and waiting requests": ("timeseries", "short", [q.requests_running(), q.requests_waiting()]),
    "KV-cache usage": ("timeseries", "percentunit", [q.kv_cache_usage()]),
    "Runs by phase": ("timeseries", "short", [q.runs_by_phase()]),
    "Stage duration (p50, p95) by stage": (
        "timeseries",
        "s",
        [q.stage_duration_quantile(0.5), q.stage_duration_quantile(0.95)],
    ),
    "Live / evaluated acceptance length": ("timeseries", "percentunit", [q.live_over_evaluated()]),
    "Running stages: elapsed / expected time": ("timeseries", "percentunit", [q.stage_elapsed_fraction()]),
    # the training row and the stage throughput row: the stage pods' live progress
    "Epochs done": ("stat", "none", [pq.train_epochs_done()]),
    "Validation loss (last epoch)": ("stat", "none", [pq.train_validation_loss()]),
    "Estimated acceptance length (last epoch)": ("stat", "none", [pq.train_estimated_acceptance_length()]),
    "Training ETA": ("stat", "s", [pq.train_eta_seconds()]),
    "Train and validation loss": ("timeseries", "none", [pq.train_loss(), pq.train_validation_loss()]),
    "Validation accuracy by draft position": ("timeseries", "percentunit", [pq.train_validation_accuracy()]),
    "Estimated acceptance length (training)": (
        "timeseries",
        "none",
        [pq.train_estimated_acceptance_length()],
    ),
    "Training tokens/s": ("timeseries", "tps", [pq.train_tokens_per_second()]),
    "Stage progress (done / total)": ("timeseries", "percentunit", [pq.stage_progress()]),
    "Stage rate (units/s)": ("timeseries", "short", [pq.stage_units_per_second()]),
    "Stage tokens/s": ("timeseries", "tps", [pq.stage_tokens_per_second()]),
    "Stage failed rows and requests": ("timeseries", "short", [pq.stage_row_failures()]),
    "Stage ETA": ("timeseries", "s", [pq.stage_eta_seconds()]),
    # the canary row: incumbent vs canary live, by track, then what the operator decided on
    "Canary vs incumbent: mean acceptance length": ("timeseries", "none", [sq.track_acceptance_length()]),
    "Canary vs incumbent: output tokens/s per request": (
        "timeseries",
        "tps",
        [sq.track_output_tokens_per_second()],
    ),
    "Canary vs incumbent: finished requests/s": ("timeseries", "reqps", [sq.track_requests_per_second()]),
    "Canary phase": ("stat", "none", [sq.canary_phase()]),
    "Canary decision: acceptance length": ("stat", "none", [sq.canary_figure(sq.CANARY_LENGTH)]),
    "Canary decision: output tokens/s": ("stat", "tps", [sq.canary_figure(sq.CANARY_SPEED)]),
    "Canary decision: requests": ("stat", "short", [sq.canary_figure(sq.CANARY_REQUESTS)]),
    "Canary comparison: canary / incumbent with the 95 % interval": (
        "timeseries",
        "none",
        [sq.canary_ratio()],
    ),
    "Canary time to decision": ("stat", "s", [sq.canary_decision_seconds()]),
    # the speedup and speculation-length row: evaluate's speedup, its sweep and the schedule it justifies
    "Evaluated speedup": ("stat", "none", [sq.evaluated_speedup()]),
    "Speculation sweep: k x concurrency": (
        "table",
        "none",
        [sq.sweep_cells(m) for m in (sq.SWEEP_SPEED, sq.SWEEP_LENGTH, sq.SWEEP_SPEEDUP)],
    ),
    "Tuned speculation length by batch size": ("table", "none", [sq.speculation_schedule()]),
}


def by_title(kind: str | None = None) -> dict[str, dict[str, Any]]:
    return {p["title"]: p for p in panels() if kind is None or p["type"] == kind}


@pytest.mark.parametrize("title", list(REQUIRED))
def test_required_panel(title: str) -> None:
    kind, unit, exprs = REQUIRED[title]
    panel = by_title(kind).get(title)
    assert panel is not None, f"no {kind} panel {title!r}"
    assert panel["fieldConfig"]["defaults"]["unit"] == unit
    assert [t["expr"] for t in panel["targets"]][: len(exprs)] == exprs
    assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_every_panel_has_a_title_description_unit_and_legend() -> None:
    for panel in panels():
        assert panel["title"] and len(panel["description"]) > 30, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        assert all(t["legendFormat"] for t in panel["targets"]), panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"]), panel["title"]


def test_acceptance_panels_state_their_formula() -> None:
    for panel in panels():
        exprs = " ".join(t["expr"] for t in panel["targets"])
        if q.ACCEPTED in exprs and q.DRAFTS in exprs and "/" in exprs:
            assert "1 + accepted draft tokens / drafts" in panel["description"], panel["title"]
        if q.DRAFT_TOKENS in exprs:
            assert "accepted draft tokens / proposed draft tokens" in panel["description"], panel["title"]
        if q.ACCEPTED_PER_POS in exprs:
            assert "accepted tokens at position i / drafts" in panel["description"], panel["title"]


def test_the_evaluated_acceptance_is_beside_the_live_one() -> None:
    panel = by_title("timeseries")["Mean acceptance length: live vs evaluated"]
    legends = [t["legendFormat"] for t in panel["targets"]]
    assert legends == ["live {{namespace}}/{{run}}", "evaluated ({{sampling}}) {{namespace}}/{{run}}"]
    sampled = 'model=~"$model", sampling="sampled"}'
    assert sampled in panel["targets"][1]["expr"]  # like for like: the sampled figure where the run has one


def test_the_evaluated_acceptance_by_position_is_beside_the_live_one() -> None:
    panel = by_title("timeseries")["Acceptance by draft position"]
    exprs = [t["expr"] for t in panel["targets"]]
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in exprs[0]
    assert exprs[1].startswith(
        "max by (namespace, run, sampling, position) (eagle3_run_acceptance_by_position{"
    )


def test_rows_and_layout() -> None:
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert rows == [
        "Speculative decoding (live, vLLM)",
        "Serving latency and load (vLLM)",
        "Canary: incumbent vs canary (vLLM live, operator's decision)",
        "Speedup and speculation length (evaluate's sweep)",
        "Live capture for the next generation (serving.capture)",
        "Training pipeline (operator)",
        "Training (train stage, live)",
        "Stage throughput (stage pods, live)",
    ]
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(set(ids)) == len(ids)
    titles = [p["title"] for p in dashboard()["panels"]]
    assert len(set(titles)) == len(titles), "two panels with one title"
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    cells = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in dashboard()["panels"]]
    assert len(set(cells)) == len(cells), "two panels at the same place"


def test_template_variables() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "model", "run"]
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for name, label in (("namespace", "namespace"), ("model", "model_name"), ("run", "run")):
        variable = variables[name]
        assert variable["type"] == "query"
        assert variable["query"].startswith("label_values(") and variable["query"].endswith(f", {label})")
        assert variable["datasource"]["uid"] == "${datasource}"
        assert variable["multi"] and variable["includeAll"] and variable["allValue"] == ".*"


def test_rollout_annotations() -> None:
    (annotation,) = dashboard()["annotations"]["list"]
    assert annotation["expr"] == q.rollout_annotation()
    assert annotation["enable"] and annotation["useValueForTime"]
    assert annotation["datasource"]["uid"] == "${datasource}"
    assert "{{checkpoint}}" in annotation["textFormat"] and "{{sha256}}" in annotation["textFormat"]


def test_build_is_deterministic() -> None:
    assert build_dashboard() == build_dashboard()


def test_the_elapsed_panel_uses_the_live_eta_before_the_operators_expected_time() -> None:
    (target,) = by_title("timeseries")["Running stages: elapsed / expected time"]["targets"]
    assert "max by (namespace, run, stage) (eagle3_stage_eta_seconds{" in target["expr"]
    assert target["expr"].index(q.ETA) < target["expr"].index(
        " or max by (namespace, run, stage) (eagle3_run_stage_"
    )


def test_the_canary_panels_put_the_tracks_side_by_side() -> None:
    """Every canary panel is by track (stable: the incumbent, canary), named so in its legend."""
    for title in [t for t in REQUIRED if t.startswith(("Canary vs", "Canary decision"))]:
        (target,) = by_title()[title]["targets"]
        assert "by (namespace, run, track)" in target["expr"], title
        assert target["legendFormat"].startswith("{{track}}"), title
    (live,) = by_title("timeseries")["Canary vs incumbent: mean acceptance length"]["targets"]
    assert 'track!=""' in live["expr"]  # runs without a canary have no track: not shown as one


def test_the_sweep_table_merges_its_three_figures_into_one_row_per_cell() -> None:
    panel = by_title("table")["Speculation sweep: k x concurrency"]
    assert all(t["instant"] and t["format"] == "table" for t in panel["targets"])
    merge, organize = panel["transformations"]
    assert merge["id"] == "merge" and organize["id"] == "organize"
    renamed = organize["options"]["renameByName"]
    assert renamed == {"Value #A": "output tokens/s", "Value #B": "acceptance length", "Value #C": "speedup"}
    assert organize["options"]["excludeByName"] == {"Time": True}


def test_the_stage_panels_name_each_stage_in_their_legends() -> None:
    for title in ("Stage progress (done / total)", "Stage rate (units/s)", "Stage tokens/s", "Stage ETA"):
        (target,) = by_title("timeseries")[title]["targets"]
        assert "{{stage}}" in target["legendFormat"], title
    (accuracy,) = by_title("timeseries")["Validation accuracy by draft position"]["targets"]
    assert accuracy["legendFormat"].endswith("position {{position}}")

"""Every query of the dashboard and of the alerts parses, reads only the contract's metrics, with the right
selectors, and never divides draft tokens by drafts (that is k, not acceptance)."""

from __future__ import annotations

import re

import pytest

from eagle3_contract import stage_metrics
from eagle3_operator.observability import queries as q
from eagle3_operator.observability import stage_metrics_queries as pq
from tests.unit.observability.obs_support import (
    CONTRACT_METRICS,
    DRAFT_TOKENS,
    DRAFTS,
    SERIES_LABELS,
    VLLM_LABELS,
    VLLM_METRICS,
    Query,
    alert_queries,
    all_queries,
    annotation_queries,
    divisions,
    matchers,
    metric_names,
    panel_queries,
    parse,
    selectors,
    variable_queries,
)

ALL = all_queries()
DASHBOARD = panel_queries() + annotation_queries()
IDS = [query.where for query in ALL]


@pytest.mark.parametrize("query", ALL, ids=IDS)
def test_parses(query: Query) -> None:
    parse(query)


@pytest.mark.parametrize("query", ALL, ids=IDS)
def test_reads_only_contract_metrics(query: Query) -> None:
    names = metric_names(parse(query))
    assert names, f"{query.where} reads no metric"
    assert names <= CONTRACT_METRICS, (
        f"{query.where} reads metrics outside the contract: {names - CONTRACT_METRICS}"
    )


@pytest.mark.parametrize("query", ALL, ids=IDS)
def test_matches_only_labels_the_series_have(query: Query) -> None:
    for selector in selectors(parse(query)):
        if not selector.name:
            continue
        labels = VLLM_LABELS if selector.name in VLLM_METRICS else SERIES_LABELS[selector.name]
        extra = set(matchers(selector)) - labels - {"le"}
        assert not extra, f"{query.where}: {selector.name} has no label {extra}"


@pytest.mark.parametrize("query", ALL, ids=IDS)
def test_never_divides_draft_tokens_by_drafts(query: Query) -> None:
    for numerator, denominator in divisions(parse(query)):
        assert not (DRAFT_TOKENS in numerator and DRAFTS in denominator), (
            f"{query.where} divides draft tokens by drafts: that is k, the number of speculative tokens"
        )


@pytest.mark.parametrize("query", DASHBOARD, ids=[x.where for x in DASHBOARD])
def test_dashboard_queries_use_the_template_variables(query: Query) -> None:
    """Every selector of a panel is scoped to the selected namespace, model and run, where it has them."""
    for selector in selectors(parse(query)):
        got = matchers(selector)
        labels = VLLM_LABELS if selector.name in VLLM_METRICS else SERIES_LABELS[str(selector.name)]
        wanted = {"namespace": "=~$namespace", "run": "=~$run", "model": "=~$model", "model_name": "=~$model"}
        for label, matcher in wanted.items():
            if label in labels:
                assert got.get(label) == matcher, f"{query.where}: {selector.name} lacks {label}{matcher}"


@pytest.mark.parametrize("query", DASHBOARD, ids=[x.where for x in DASHBOARD])
def test_dashboard_rates_use_the_rate_interval(query: Query) -> None:
    assert set(re.findall(r"\[([^\]]+)\]", query.expr)) <= {"$__rate_interval"}, query.expr


@pytest.mark.parametrize("query", alert_queries(), ids=[x.where for x in alert_queries()])
def test_alerts_use_fixed_windows_and_no_template_variables(query: Query) -> None:
    assert "$" not in query.expr, query.expr


def test_variables_list_namespaces_models_and_runs_from_both_sources() -> None:
    found = {x.where: metric_names(parse(x)) for x in variable_queries()}
    assert found["variable 'namespace'"] == {"eagle3_operator_runs", "vllm:num_requests_running"}
    assert found["variable 'model'"] == {"vllm:num_requests_running"}
    assert found["variable 'run'"] == {"eagle3_operator_stage_attempts_total", "vllm:num_requests_running"}


def test_acceptance_formulas() -> None:
    """The three ratios, spelled out: numerator and denominator of each division."""
    s = q.scoped("5m")
    cases = {
        q.acceptance_rate(s): [({q.ACCEPTED}, {q.DRAFT_TOKENS})],
        q.mean_acceptance_length(s): [({q.ACCEPTED}, {q.DRAFTS})],
        q.acceptance_by_position(s): [({q.ACCEPTED_PER_POS}, {q.DRAFTS})],
    }
    for expr, wanted in cases.items():
        assert divisions(parse(Query("formula", expr))) == wanted, expr
    assert q.mean_acceptance_length(s).startswith("1 + ")
    assert "/ on (namespace, run) group_left () " in q.acceptance_by_position(s)


def test_scopes_render_the_same_shape() -> None:
    """The dashboard's query and the alert's differ only in selectors and window."""
    dashboard, alert = q.mean_acceptance_length(), q.mean_acceptance_length(q.scoped("15m"))
    stripped = re.sub(r"\{[^}]*\}", "", dashboard).replace("$__rate_interval", "15m")
    assert stripped == alert


def test_the_stage_metrics_are_the_contracts() -> None:
    """The names the stage panels and alerts read are those the stage programs serve (counters: `_total`)."""
    pairs = [
        (pq.UNITS_DONE, stage_metrics.UNITS_DONE),
        (pq.UNITS_TOTAL, stage_metrics.UNITS),
        (pq.UNITS_RATE, stage_metrics.UNITS_RATE),
        (q.ETA, stage_metrics.ETA_SECONDS),
        (pq.STAGE_TOKENS, f"{stage_metrics.TOKENS}_total"),
        (pq.ROW_FAILURES, f"{stage_metrics.FAILURES}_total"),
        (pq.TRAIN_EPOCHS_DONE, stage_metrics.TRAIN_EPOCHS_DONE),
        (pq.TRAIN_LOSS, stage_metrics.TRAIN_LOSS),
        (pq.TRAIN_VAL_LOSS, stage_metrics.TRAIN_VAL_LOSS),
        (pq.TRAIN_VAL_ACCURACY, stage_metrics.TRAIN_VAL_ACCURACY),
        (pq.TRAIN_ACCEPTANCE, stage_metrics.TRAIN_ACCEPTANCE),
        (pq.TRAIN_TOKENS_RATE, stage_metrics.TRAIN_TOKENS_RATE),
    ]
    assert [ours for ours, _ in pairs] == [theirs for _, theirs in pairs]


def test_the_consecutive_rises_gauge_is_the_contracts() -> None:
    """Eagle3ValidationLossRising reads the reporter's count of epochs in a row of rising validation loss."""
    assert getattr(stage_metrics, "TRAIN_VAL_LOSS_RISES", None) == pq.TRAIN_VAL_LOSS_RISES


def test_stage_queries_group_by_run_and_stage() -> None:
    """Per-stage panels keep (namespace, run, stage), the key of the operator's per-stage series."""
    for expr in (pq.stage_progress(), pq.stage_units_per_second(), pq.stage_tokens_per_second()):
        assert expr.startswith("sum by (namespace, run, stage"), expr
    assert pq.stage_eta_seconds().startswith("max by (namespace, run, stage) (")
    assert pq.train_eta_seconds() == (
        'max by (namespace, run) (eagle3_stage_eta_seconds{namespace=~"$namespace", run=~"$run", '
        'stage="train"})'
    )


def test_the_expected_time_is_elapsed_plus_the_live_eta_or_the_operators() -> None:
    s = q.scoped("5m")
    assert q.stage_expected_seconds(s) == (
        "(time() - eagle3_run_stage_started_timestamp_seconds) + on (namespace, run, stage) "
        "max by (namespace, run, stage) (eagle3_stage_eta_seconds) "
        "or max by (namespace, run, stage) (eagle3_run_stage_expected_seconds)"
    )
    assert q.stage_elapsed_fraction(s) == (
        "(time() - eagle3_run_stage_started_timestamp_seconds) / on (namespace, run, stage) "
        f"({q.stage_expected_seconds(s)})"
    )


def test_the_stalled_alert_reads_a_running_target_that_is_not_done() -> None:
    assert pq.alert_stage_stalled() == (
        "eagle3_stage_units_per_second == 0\n"
        "and on (job, instance) up == 1\n"
        "unless on (job, instance) eagle3_stage_units_done >= eagle3_stage_units"
    )
    assert pq.alert_validation_loss_rising() == "eagle3_train_val_loss_rises >= 2"

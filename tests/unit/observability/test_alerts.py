"""The alerting rules: the nine alerts, each with a severity, a wait, a description and its runbook's URL."""

from __future__ import annotations

import pytest

from eagle3_operator.observability import queries as q
from eagle3_operator.observability import stage_metrics_queries as pq
from eagle3_operator.observability.alerts import RUNBOOK_BASE_URL, build_prometheus_rule, build_rule_groups

ALERTS = {
    "Eagle3AcceptanceBelowEvaluated",
    "Eagle3NoAcceptedTokens",
    "Eagle3RunFailed",
    "Eagle3StageFailed",
    "Eagle3StageOOMRetry",
    "Eagle3RunStuck",
    "Eagle3PodNotRunning",
    "Eagle3StageStalled",
    "Eagle3ValidationLossRising",
}


def rules() -> dict[str, dict[str, object]]:
    return {r["alert"]: r for g in build_rule_groups()["groups"] for r in g["rules"]}


def test_the_nine_alerts() -> None:
    assert set(rules()) == ALERTS
    groups = [g["name"] for g in build_rule_groups()["groups"]]
    assert groups == ["eagle3-serving", "eagle3-pipeline", "eagle3-stages"]


def test_each_alert_is_explained() -> None:
    for name, rule in rules().items():
        assert rule["labels"] in ({"severity": "critical"}, {"severity": "warning"}, {"severity": "info"}), (
            name
        )
        assert isinstance(rule["for"], str) and rule["for"].endswith("m"), name
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert "{{ $labels.run }}" in annotations["summary"], name
        assert len(annotations["description"]) > 100, f"{name}: the description should say what happened"
        assert annotations["runbook_url"] == f"{RUNBOOK_BASE_URL}#{name.lower()}", name


def test_acceptance_alert_compares_like_with_like() -> None:
    """Live (sampled) traffic against the sampled evaluation where the run has one, else the greedy one; the
    alert's `sampling` label and its description say which."""
    rule = rules()["Eagle3AcceptanceBelowEvaluated"]
    expr = rule["expr"]
    assert isinstance(expr, str)
    assert q.mean_acceptance_length(q.scoped("15m")) in expr
    sampled = 'max by (namespace, run, sampling) (eagle3_run_acceptance_length{sampling="sampled"})'
    greedy = 'max by (namespace, run, sampling) (eagle3_run_acceptance_length{sampling="greedy"})'
    assert (
        f"< on (namespace, run) group_left (sampling) 0.8 * ({sampled} or on (namespace, run) {greedy})"
        in expr
    )
    annotations = rule["annotations"]
    assert (
        isinstance(annotations, dict) and "with {{ $labels.sampling }} decoding" in annotations["description"]
    )
    assert (
        "and on (namespace, run) sum by (namespace, run) (rate(vllm:spec_decode_num_drafts_total[15m])) > 0"
        in expr
    )


def test_failure_alerts_split_on_out_of_memory() -> None:
    assert 'reason!="OutOfMemory"' in str(rules()["Eagle3StageFailed"]["expr"])
    assert 'reason="OutOfMemory"' in str(rules()["Eagle3StageOOMRetry"]["expr"])


@pytest.mark.parametrize("name", ["Eagle3StageFailed", "Eagle3StageOOMRetry"])
def test_failure_alerts_fire_for_the_window_after_each_failure(name: str) -> None:
    """Read from the last-failure timestamp, not increase() of the counter: a counter whose first scrape
    already holds the failure shows no increase (see tests/observability/eagle3-rules.test.yaml)."""
    expr = str(rules()[name]["expr"])
    last = "eagle3_run_stage_last_failure_timestamp_seconds{reason"
    assert expr.startswith(f"time() - max by (namespace, run, stage, reason) ({last}")
    assert expr.endswith(") < 600") and q.duration_seconds(q.FAILURE_WINDOW) == 600
    assert "increase(" not in expr and "eagle3_operator_stage_failures_total" not in expr
    assert rules()[name]["for"] == "0m"


def test_a_failed_run_alerts_for_as_long_as_it_stays_failed() -> None:
    rule = rules()["Eagle3RunFailed"]
    assert rule["expr"] == 'eagle3_run_phase{phase="Failed"} == 1' and rule["for"] == "5m"
    assert rule["labels"] == {"severity": "warning"}
    assert rules()["Eagle3StageFailed"]["labels"] == {"severity": "info"}  # the event; the run's state warns


@pytest.mark.parametrize(("duration", "seconds"), [("45s", 45), ("10m", 600), ("2h", 7200), ("1d", 86400)])
def test_duration_seconds(duration: str, seconds: int) -> None:
    assert q.duration_seconds(duration) == seconds


@pytest.mark.parametrize("duration", ["10", "m", "1.5m", "1h30m", "10ms", "-1m"])
def test_duration_seconds_refuses_what_it_cannot_read(duration: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        q.duration_seconds(duration)


def test_prometheus_rule_object() -> None:
    rule = build_prometheus_rule("monitoring", {"release": "kube-prometheus-stack"})
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["metadata"] == {
        "name": "eagle3-operator",
        "namespace": "monitoring",
        "labels": {"release": "kube-prometheus-stack"},
    }
    assert rule["spec"] == build_rule_groups()


def test_the_stalled_alert_waits_fifteen_minutes() -> None:
    rule = rules()["Eagle3StageStalled"]
    assert rule["for"] == "15m" and rule["expr"] == pq.alert_stage_stalled()
    annotations = rule["annotations"]
    assert isinstance(annotations, dict)
    assert "{{ $labels.pod }}" in annotations["description"]


def test_the_validation_loss_alert_fires_at_the_epoch_of_the_second_rise() -> None:
    rule = rules()["Eagle3ValidationLossRising"]
    assert rule["for"] == "0m" and rule["expr"] == "eagle3_train_val_loss_rises >= 2"

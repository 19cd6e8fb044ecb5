"""A wrong value fails `helm template` (so `helm install`) with values.schema.json's message, or the
chart's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.helm import template_error

SCHEMA_ERROR = "values don't meet the specifications of the schema(s)"

CASES = {
    "replicas-not-a-number": (["replicas=two"], "at '/replicas': got string, want integer"),
    "two-replicas": (["replicas=2"], "at '/replicas': maximum: got 2, want 1"),
    "unknown-key": (["replica=1"], "at '': additional properties 'replica' not allowed"),
    "unknown-nested-key": (["image.name=x"], "at '/image': additional properties 'name' not allowed"),
    "bad-pull-policy": (
        ["image.pullPolicy=Sometimes"],
        "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'",
    ),
    "bad-namespace": (
        ["watchNamespaces={Team_A}"],
        "at '/watchNamespaces/0': 'Team_A' does not match pattern",
    ),
    "privileged-port": (
        ["operator.metricsPort=80"],
        "at '/operator/metricsPort': minimum: got 80, want 1,024",
    ),
    "zero-api-timeout": (
        ["operator.apiTimeoutSeconds=0"],
        "at '/operator/apiTimeoutSeconds': exclusiveMinimum: got 0, want 0",
    ),
    "bad-log-format": (
        ["operator.logFormat=yaml"],
        "at '/operator/logFormat': value must be one of 'text', 'json'",
    ),
    "root-user": (
        ["podSecurityContext.runAsUser=0"],
        "at '/podSecurityContext/runAsUser': minimum: got 0, want 1",
    ),
    "bad-interval": (
        ["metrics.serviceMonitor.interval=soon"],
        "at '/metrics/serviceMonitor/interval': 'soon' does not match pattern",
    ),
    "label-value-not-a-string": (
        ["grafanaDashboard.labelValue=1"],
        "at '/grafanaDashboard/labelValue': got number",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_wrong_value_fails_with_the_schema_message(helm: Path, case: str) -> None:
    sets, message = CASES[case]
    error = template_error(helm, sets)
    assert SCHEMA_ERROR in error and message in error, error


def test_one_port_for_health_and_metrics_fails(helm: Path) -> None:
    error = template_error(helm, ["operator.healthPort=9090"])
    assert "operator.healthPort and operator.metricsPort are both 9090" in error, error


def test_an_existing_service_account_must_be_named(helm: Path) -> None:
    error = template_error(helm, ["serviceAccount.create=false"])
    assert "serviceAccount.name: name an existing ServiceAccount" in error, error

"""A wrong value fails `helm template` (so `helm install`) with values.schema.json's message, or the
chart's own; the usual extra keys are accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.helm import template, template_error

SCHEMA_ERROR = "values don't meet the specifications of the schema(s)"

CASES = {
    "replicas-not-a-number": (["replicas=two"], "at '/replicas': got string, want integer"),
    "negative-replicas": (["replicas=-1"], "at '/replicas': minimum: got -1, want 0"),
    "unknown-nested-key": (["image.name=x"], "at '/image': additional properties 'name' not allowed"),
    "bad-digest": (["image.digest=sha256:abc"], "at '/image/digest': 'sha256:abc' does not match pattern"),
    "digest-without-algorithm": (
        ["pipelineImage.digest=" + "a" * 64],
        "at '/pipelineImage/digest': '" + "a" * 64 + "' does not match pattern",
    ),
    "registry-with-scheme": (
        ["global.imageRegistry=https://registry.example.internal"],
        "at '/global/imageRegistry': 'https://registry.example.internal' does not match pattern",
    ),
    "repository-with-tag": (
        ["pipelineImage.repository=eagle3/pipeline:1.0"],
        "at '/pipelineImage/repository': 'eagle3/pipeline:1.0' does not match pattern",
    ),
    "pull-secret-as-a-string": (["runImagePullSecrets={regcred}"], "at '/runImagePullSecrets/0': got string"),
    "priority-not-a-number": (["operator.priority=high"], "at '/operator/priority': got string"),
    "extra-args-not-a-list": (["extraArgs=--verbose"], "at '/extraArgs': got string, want array"),
    "common-label-not-a-string": (
        ["commonLabels.tier=1"],
        "at '/commonLabels/tier': got number, want string",
    ),
    "crds-install-not-a-boolean": (
        ["crds.install=sometimes"],
        "at '/crds/install': got string, want boolean",
    ),
    "bad-min-available": (
        ["podDisruptionBudget.minAvailable=half"],
        "at '/podDisruptionBudget/minAvailable'",
    ),
    "bad-spread": (
        [
            "topologySpreadConstraints[0].maxSkew=1",
            "topologySpreadConstraints[0].topologyKey=zone",
            "topologySpreadConstraints[0].whenUnsatisfiable=Never",
        ],
        "at '/topologySpreadConstraints/0/whenUnsatisfiable': value must be one of 'DoNotSchedule', "
        "'ScheduleAnyway'",
    ),
    "root-container": (
        ["securityContext.runAsUser=0"],
        "at '/securityContext/runAsUser': minimum: got 0, want 1",
    ),
    "relabelings-not-a-list": (
        ["metrics.serviceMonitor.relabelings=drop"],
        "at '/metrics/serviceMonitor/relabelings': got string, want array",
    ),
    "pod-monitor-label-not-a-string": (
        ["podMonitor.labels.release=true"],
        "at '/podMonitor/labels/release': got boolean, want string",
    ),
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
    "bad-pod-security-level": (
        ["podSecurity.minimumLevel=root"],
        "at '/podSecurity/minimumLevel': value must be one of 'restricted', 'baseline', 'privileged'",
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


# The usual extra keys of a chart: each is accepted (what each does: test_chart_conventions, test_chart_ha).
ACCEPTED = {
    "podDisruptionBudget": ["podDisruptionBudget.enabled=false"],
    "podDisruptionBudget-percent": ["podDisruptionBudget.minAvailable=50%"],
    "securityContext": ["securityContext.runAsUser=1000", "securityContext.seLinuxOptions.level=s0:c1"],
    "podSecurityContext": ["podSecurityContext.supplementalGroups={1000}", "podSecurityContext.sysctls=null"],
    "extraArgs": ["extraArgs={--resync-seconds=30}"],
    "extraEnv": ["extraEnv[0].name=A", "extraEnv[0].valueFrom.secretKeyRef.name=s"],
    "topologySpreadConstraints": [
        "topologySpreadConstraints[0].maxSkew=2",
        "topologySpreadConstraints[0].topologyKey=zone",
        "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
    ],
    "commonLabels": ["commonLabels.team=ml"],
    "image.digest": ["image.digest=sha256:" + "0" * 64],
    "global.imageRegistry": ["global.imageRegistry=localhost:5000"],
    "relabelings": [
        "metrics.serviceMonitor.relabelings[0].targetLabel=node",
        "metrics.serviceMonitor.metricRelabelings[0].action=drop",
    ],
    "operator.priority": ["operator.priority=-5"],
    "an-unknown-top-level-key": ["someParentChartKey.enabled=true"],
    "a-global-of-a-parent-chart": ["global.storageClass=fast"],
}


@pytest.mark.parametrize("case", ACCEPTED)
def test_the_usual_extra_keys_are_accepted(helm: Path, case: str) -> None:
    assert template(helm, sets=ACCEPTED[case], include_crds=False)

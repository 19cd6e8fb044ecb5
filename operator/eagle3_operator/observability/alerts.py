"""The alerting rules: a plain Prometheus rules file and the same groups as a PrometheusRule object.

Every expression comes from `queries` (fixed windows, no template variables); `tests/observability/
eagle3-rules.test.yaml` holds promtool unit tests proving each alert fires when it should and stays quiet when
healthy. Annotations: `summary`, `description` and `runbook_url`: the alert's section of
docs/troubleshooting.md (what it means, what to do), one anchor per alert (the heading is the alert's name).
The URL's base is RUNBOOK_BASE_URL; the chart's PrometheusRule replaces it with
`prometheusRule.runbookBaseUrl` when that is set (a fork's or a mirror's copy of the docs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagle3_operator.observability import queries as q
from eagle3_operator.observability import stage_metrics_queries as pq

RUNBOOK_BASE_URL = "https://github.com/eagle3-operator/eagle3-operator/blob/main/docs/troubleshooting.md"
RUN = "{{ $labels.namespace }}/{{ $labels.run }}"
STAGE = "stage {{ $labels.stage }} of Eagle3Run " + RUN
STAGE_TITLE = "Stage {{ $labels.stage }} of Eagle3Run " + RUN


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    @property
    def runbook_url(self) -> str:
        """The alert's section of docs/troubleshooting.md (GitHub's anchor of the heading `### <name>`)."""
        return f"{RUNBOOK_BASE_URL}#{self.name.lower()}"

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": self.runbook_url,
            },
        }


ACCEPTANCE_BELOW_EVALUATED = Alert(
    name="Eagle3AcceptanceBelowEvaluated",
    expr=q.alert_acceptance_below_evaluated(),
    for_="10m",
    severity="warning",
    summary=f"Live acceptance length of {RUN} is below {q.ACCEPTANCE_FLOOR:.0%} of the evaluated one",
    description=(
        f"Over the last {q.ACCEPTANCE_WINDOW} the draft serving Eagle3Run {RUN} reached a mean acceptance "
        "length of {{ $value | humanize }} tokens per verifier step (1 + accepted tokens / drafts), less "
        f"than {q.ACCEPTANCE_FLOOR} x the length its evaluate stage measured with {{{{ $labels.sampling }}}} "
        "decoding (eagle3_run_acceptance_length: sampled at the spec's evaluation.sampling, the serving "
        "traffic's settings, when the run has that figure, else greedy at temperature 0)."
    ),
)

NO_ACCEPTED_TOKENS = Alert(
    name="Eagle3NoAcceptedTokens",
    expr=q.alert_no_accepted_tokens(),
    for_="5m",
    severity="critical",
    summary=f"The draft serving {RUN} has not had a single token accepted",
    description=(
        f"For {q.NO_ACCEPTED_WINDOW} vLLM generated tokens and proposed drafts for Eagle3Run {RUN} but "
        "accepted none of them: every request pays for speculation and gains nothing."
    ),
)

STAGE_FAILED = Alert(
    name="Eagle3StageFailed",
    expr=q.alert_stage_failed(),
    for_="0m",
    severity="info",
    summary=f"{STAGE_TITLE} failed ({{{{ $labels.reason }}}})",
    description=(
        f"A Job attempt of {STAGE} failed with reason {{{{ $labels.reason }}}} in the last "
        f"{q.FAILURE_WINDOW} (this alert fires for {q.FAILURE_WINDOW} after each failure); the run turns "
        "Failed, its Failed condition names the Job and the container's last message, and Eagle3RunFailed "
        "fires while it stays Failed."
    ),
)

RUN_FAILED = Alert(
    name="Eagle3RunFailed",
    expr=q.alert_run_failed(),
    for_=q.RUN_FAILED_FOR,
    severity="warning",
    summary=f"Eagle3Run {RUN} has failed",
    description=(
        f"Eagle3Run {RUN} has been in phase Failed for {q.RUN_FAILED_FOR} (eagle3_run_phase): a stage "
        "failed for good, or its draft did not pass the evaluation gate. Nothing more runs until the spec "
        "changes or the failed Job is deleted; a draft already serving keeps serving."
    ),
)

STAGE_OOM_RETRY = Alert(
    name="Eagle3StageOOMRetry",
    expr=q.alert_stage_oom_retry(),
    for_="0m",
    severity="info",
    summary=f"{STAGE_TITLE} ran out of memory",
    description=(
        f"A Job attempt of {STAGE} ran out of memory in the last {q.FAILURE_WINDOW}. The operator retries "
        "the stage with half its token budget (Jobs ...-r1, ...-r2) until one sample of "
        "dataset.maxSequenceLength no longer fits, then fails the run."
    ),
)

RUN_STUCK = Alert(
    name="Eagle3RunStuck",
    expr=q.alert_run_stuck(),
    for_="5m",
    severity="warning",
    summary=f"{STAGE_TITLE} is running past its expected time",
    description=(
        f"The current attempt of {STAGE} has run for {{{{ $value | humanizeDuration }}}}, longer than the "
        "stage's expected time (eagle3_run_stage_expected_seconds: its activeDeadlineSeconds, else the "
        "operator's default for the stage)."
    ),
)

POD_NOT_RUNNING = Alert(
    name="Eagle3PodNotRunning",
    expr=q.alert_pod_not_running(),
    for_="10m",
    severity="warning",
    summary=f"A pod of {STAGE} does not run: {{{{ $labels.reason }}}}",
    description=(
        f"For 10 minutes a pod of {STAGE} (stage serve: its vLLM Deployment) has not been running: "
        "{{ $labels.reason }}. Neither a Job nor a Deployment fails for this, so the run waits until the "
        "cause is fixed (or the Job's activeDeadlineSeconds)."
    ),
)

STAGE_STALLED = Alert(
    name="Eagle3StageStalled",
    expr=pq.alert_stage_stalled(),
    for_=pq.STALL_FOR,
    severity="warning",
    summary=f"{STAGE_TITLE} makes no progress",
    description=(
        f"For {pq.STALL_FOR} the pod {{{{ $labels.pod }}}} of {STAGE} has been running and answering "
        "Prometheus, but its rate of {{ $labels.unit }} (eagle3_stage_units_per_second) has been 0 while "
        "it has not done all of them (eagle3_stage_units_done < eagle3_stage_units, or no total yet)."
    ),
)

VALIDATION_LOSS_RISING = Alert(
    name="Eagle3ValidationLossRising",
    expr=pq.alert_validation_loss_rising(),
    for_="0m",
    severity="warning",
    summary=f"The validation loss of Eagle3Run {RUN}'s training has risen for {{{{ $value }}}} epochs",
    description=(
        f"The train stage of Eagle3Run {RUN} has finished {{{{ $value }}}} epochs in a row with a higher "
        "validation loss than the epoch before (eagle3_train_val_loss_rises), while it keeps training: the "
        "draft overfits the training data, or the learning rate is too high."
    ),
)

GROUPS: dict[str, tuple[Alert, ...]] = {
    "eagle3-serving": (ACCEPTANCE_BELOW_EVALUATED, NO_ACCEPTED_TOKENS),
    "eagle3-pipeline": (RUN_FAILED, STAGE_FAILED, STAGE_OOM_RETRY, RUN_STUCK, POD_NOT_RUNNING),
    "eagle3-stages": (STAGE_STALLED, VALIDATION_LOSS_RISING),
}
ALL_ALERTS: tuple[Alert, ...] = tuple(a for group in GROUPS.values() for a in group)


def build_rule_groups() -> dict[str, Any]:
    """The Prometheus rules file (`rule_files:`), as a dict."""
    return {
        "groups": [
            {"name": name, "interval": "1m", "rules": [a.rule() for a in alerts]}
            for name, alerts in GROUPS.items()
        ]
    }


def build_prometheus_rule(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """The same groups as a prometheus-operator PrometheusRule; `labels`: what its Prometheus selects."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "eagle3-operator", "namespace": namespace, "labels": dict(labels)},
        "spec": build_rule_groups(),
    }

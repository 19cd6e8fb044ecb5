"""The alerting rules: a plain Prometheus rules file and the same groups as a PrometheusRule object.

Every expression comes from `queries` (fixed windows, no template variables); `tests/observability/
eagle3-rules.test.yaml` holds promtool unit tests proving each alert fires when it should and stays quiet when
healthy. Annotations: `summary`, `description` and `runbook` (what to do, in words; no URL to keep current).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagle3_operator.observability import progress_queries as pq
from eagle3_operator.observability import queries as q

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
    runbook: str

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook": self.runbook,
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
        f"than {q.ACCEPTANCE_FLOOR} x the length its evaluate stage measured (eagle3_run_acceptance_length)."
    ),
    runbook=(
        "The live traffic differs from the evaluation prompts, or the pods do not serve the evaluated "
        "draft. Compare the dashboard's 'Mean acceptance length: live vs evaluated' and 'Acceptance by "
        "draft position' panels; check that the serving Deployment runs the run's checkpoint "
        "(eagle3_serving_draft_info: sha256) with the verifier the run was trained for. If the traffic "
        "shifted, retrain the draft on prompts sampled from it (the run's dataset); until then the draft "
        "still speeds decoding up, only less."
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
    runbook=(
        "The draft does not fit the served verifier: another model or revision, another tokenizer or "
        "vocabulary mapping (d2t/t2d), or a broken checkpoint. Check the serving pods' vLLM logs and that "
        "the served model is the run's spec.verifier.model; roll the Deployment back to the previous draft, "
        "or serve without speculative decoding, until a draft trained for this verifier is exported."
    ),
)

STAGE_FAILED = Alert(
    name="Eagle3StageFailed",
    expr=q.alert_stage_failed(),
    for_="0m",
    severity="warning",
    summary=f"{STAGE_TITLE} failed ({{{{ $labels.reason }}}})",
    description=(
        f"A Job attempt of {STAGE} failed with reason {{{{ $labels.reason }}}} in the last "
        f"{q.FAILURE_WINDOW}; the run turns Failed and its Failed condition names the Job and the "
        "container's last message."
    ),
    runbook=(
        "Read the run's Failed condition (kubectl -n {{ $labels.namespace }} describe eagle3run "
        "{{ $labels.run }}) and the stage Job's logs. DeadlineExceeded: the stage outran "
        "spec.stages.{{ $labels.stage }}.activeDeadlineSeconds; raise it or shrink the dataset. Error: fix "
        "the cause the logs name (data, storage, image, credentials), then delete the failed Job to retry "
        "the stage, or change the spec."
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
    runbook=(
        "Nothing to do for a single retry. Repeated retries slow the stage down: set the stage's "
        "tokenBudget (regeneration.tokenBudget, extraction.tokenBudget) to the budget that succeeded. If the "
        "run failed on OutOfMemory, lower dataset.maxSequenceLength, use more GPUs "
        "(verifier.tensorParallelSize) or give the stage's pods more memory "
        "(spec.stages.{{ $labels.stage }})."
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
    runbook=(
        "Look at the stage's pod (kubectl -n {{ $labels.namespace }} get pods -l "
        "eagle3.dev/run={{ $labels.run }}): Pending means no node has the GPUs or memory it asks for; "
        "Running means a slow or hung program: read its logs for progress. Delete the Job to retry it, or "
        "set spec.stages.{{ $labels.stage }}.activeDeadlineSeconds so a hung attempt fails on its own."
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
    runbook=(
        "Read the run's status: kubectl -n {{ $labels.namespace }} get eagle3run {{ $labels.run }} -o "
        "jsonpath='{.status.stages.{{ $labels.stage }}.blockedBy.message}' (stage serve: "
        "'{.status.serving.blockedBy.message}'). ImagePullBackOff or ErrImagePull: push the image or fix "
        "spec.images / the chart's pipelineImage, and give the namespace its pull secret. "
        "CreateContainerConfigError: create the Secret or ConfigMap it names (spec.hfTokenSecret). "
        "Unschedulable: no node has the GPUs, memory or labels the pod asks for (spec.nodePool). "
        "CrashLoopBackOff: the message holds the container's last exit code and log lines."
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
    runbook=(
        "Read the pod's log (kubectl -n {{ $labels.namespace }} logs {{ $labels.pod }}): its progress line "
        "says where it stopped. generate, extract and evaluate wait on a vLLM server: a hung engine or a "
        "server still loading a large verifier (its log in the stage's work directory); train waits on its "
        "torchrun workers, or online on the producers (status.producers). Delete the pod's Job to retry "
        "the stage (finished work is kept), or set "
        "spec.stages.{{ $labels.stage }}.activeDeadlineSeconds so a hung attempt fails on its own."
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
    runbook=(
        "Compare the dashboard's 'Train and validation loss' panel: a falling train loss beside a rising "
        "validation loss is overfitting. The stage keeps the epoch with the lowest validation loss "
        "(checkpoint_best), so the run goes on safely but spends its remaining epochs for nothing: lower "
        "training.epochs or training.learningRate, or add data (dataset, regeneration) and edit the spec, "
        "which retrains. A validation loss that rises from the first epochs on with a falling train loss "
        "can also mean that the validation rows differ from the training rows (dataset.validationFraction)."
    ),
)

GROUPS: dict[str, tuple[Alert, ...]] = {
    "eagle3-serving": (ACCEPTANCE_BELOW_EVALUATED, NO_ACCEPTED_TOKENS),
    "eagle3-pipeline": (STAGE_FAILED, STAGE_OOM_RETRY, RUN_STUCK, POD_NOT_RUNNING),
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

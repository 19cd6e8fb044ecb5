"""The batch/v1 Job of one attempt of one pipeline stage."""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.spec import DEFAULT_PIPELINE_IMAGE, Eagle3RunSpec
from eagle3_contract.exit_codes import CHECK_FAILED_EXIT_CODE, OOM_EXIT_CODE
from eagle3_contract.mounts import ARTIFACTS_MOUNT, SPEC_MOUNT
from eagle3_contract.policy import stage_deadline, stage_override
from eagle3_contract.stage_metrics import ENV_METRICS_PORT, METRICS_PORT, METRICS_PORT_NAME
from eagle3_contract.stages import Stage, StagePlan, stage_argv
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.pod import (
    PIPELINE_GID,
    STAGE_POD_SECURITY,
    PodShape,
    env,
    pod_spec,
    pod_template,
    resources,
    volume_mounts,
)
from eagle3_operator.builders.training import indexed, train_env, train_nodes

__all__ = ["PIPELINE_GID", "STAGE_POD_SECURITY", "build_job"]

DEFAULT_BACKOFF_LIMIT = 2


def pod_labels(run: RunRef, plan: StagePlan, attempt: int) -> dict[str, str]:
    """Labels of a stage Job and its pods: selectable by run, stage, hash and attempt."""
    return names.labels(run.name, plan.stage.value) | {
        names.LABEL_HASH: plan.hash,
        names.LABEL_ATTEMPT: str(attempt),
    }


def fail_fast_exit_codes(plan: StagePlan) -> list[int]:
    """Exit codes that fail the stage's Job at once: out of memory where the operator retries with half the
    budget, a failed check (verify) that the same files would fail again."""
    codes = [OOM_EXIT_CODE] if plan.retries_oom else []
    return codes + ([CHECK_FAILED_EXIT_CODE] if plan.stage == Stage.VERIFY else [])


def pod_failure_policy(container: str, exit_codes: list[int]) -> dict[str, Any]:
    """Disruptions do not count against the backoff limit; the given exit codes fail the Job at once."""
    return {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": container, "operator": "In", "values": exit_codes},
            },
        ]
    }


def stage_container(
    run: RunRef, spec: Eagle3RunSpec, plan: StagePlan, token_budget: int | None, shape: PodShape, name: str
) -> dict[str, Any]:
    """The one container of a stage pod (Job `name`), running `eagle3 stage <stage> ...` in the pipeline
    image. It serves its progress on the `metrics` port (eagle3_contract.stage_metrics): the run's stage
    PodMonitor and the operator read it."""
    metrics = [{"name": ENV_METRICS_PORT, "value": str(METRICS_PORT)}]
    return {
        "name": plan.stage.value,
        "image": spec.images.pipeline or DEFAULT_PIPELINE_IMAGE,
        "command": stage_argv(plan, SPEC_MOUNT, ARTIFACTS_MOUNT, token_budget),
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "env": env(run, spec, plan.stage.value) + train_env(run, spec, plan, name) + metrics,
        "resources": resources(spec, stage_override(spec, plan.stage), plan.gpus),
        "volumeMounts": volume_mounts(shape),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def job_spec(
    run: RunRef,
    spec: Eagle3RunSpec,
    plan: StagePlan,
    token_budget: int | None,
    labels: dict[str, str],
    spec_configmap: str,
    name: str,
) -> dict[str, Any]:
    """Retries, deadline, failure policy and the pod template of a stage Job (an Indexed one for a train
    stage of several nodes)."""
    shape = PodShape(plan.stage.value, plan.gpus, plan.uses_vllm, spec_configmap=spec_configmap)
    container = stage_container(run, spec, plan, token_budget, shape, name)
    override = stage_override(spec, plan.stage)
    backoff = override.backoff_limit if override is not None else None
    out: dict[str, Any] = {"backoffLimit": DEFAULT_BACKOFF_LIMIT if backoff is None else backoff}
    if (deadline := stage_deadline(spec, plan.stage)) is not None:
        out["activeDeadlineSeconds"] = deadline
    fail_fast = fail_fast_exit_codes(plan)
    if fail_fast:
        out["podFailurePolicy"] = pod_failure_policy(container["name"], fail_fast)
    pod = {"restartPolicy": "Never", **pod_spec(run, spec, shape, container)}
    out["template"] = pod_template(spec, labels, pod)
    nodes = train_nodes(spec, plan)
    return indexed(out, nodes, name) if nodes > 1 else out


def build_job(
    run: RunRef,
    spec: Eagle3RunSpec,
    plan: StagePlan,
    attempt: int,
    token_budget: int | None,
    spec_configmap: str,
) -> dict[str, Any]:
    """The Job of `attempt` of `plan`'s stage; `token_budget` overrides the plan's after an out-of-memory."""
    labels = pod_labels(run, plan, attempt)
    job_labels = dict(labels)
    if spec.queue_name:
        job_labels[names.LABEL_KUEUE_QUEUE] = spec.queue_name
    annotations = {} if token_budget is None else {names.ANNOTATION_TOKEN_BUDGET: str(token_budget)}
    name = names.job_name(run.name, plan.stage.value, plan.hash, attempt, train_nodes(spec, plan))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": names.metadata(run, name, plan.stage.value, labels=job_labels, annotations=annotations),
        "spec": job_spec(run, spec, plan, token_budget, labels, spec_configmap, name),
    }

"""The vLLM speculative-decoding Deployment, its Service and its PodMonitor."""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.mounts import DRAFT_WEIGHTS, draft_path
from eagle3_contract.stages import content_hash
from eagle3_contract.vllm_command import Endpoint, VllmEngine, eagle3_speculative_config, vllm_serve_args
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.pod import PodShape, env, pod_spec, resources, volume_mounts

PORT = 8000
PORT_NAME = "http"
CONTAINER = "vllm"
DRAFT_CHECK_CONTAINER = "check-draft"
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
STARTUP_PERIOD_SECONDS = 10
# Big verifiers take long to download and load: up to an hour before the first /health.
STARTUP_FAILURE_THRESHOLD = 360
# A rollout waits out the startup probe before the Deployment reports ProgressDeadlineExceeded.
PROGRESS_DEADLINE_SECONDS = STARTUP_PERIOD_SECONDS * STARTUP_FAILURE_THRESHOLD + 600


def serving_selector(run: RunRef) -> dict[str, str]:
    """The labels selecting a run's vLLM pods (Deployment, Service and PodMonitor agree on them)."""
    return {
        names.LABEL_RUN: names.labels(run.name, names.SERVE_STAGE)[names.LABEL_RUN],
        names.LABEL_STAGE: names.SERVE_STAGE,
    }


def vllm_args(spec: Eagle3RunSpec, draft_dir: str) -> list[str]:
    """`vllm serve` arguments: the verifier, its engine options and the EAGLE-3 draft (the contract's one
    command builder, as evaluate measured it), then `serving.extraArgs`."""
    return vllm_serve_args(
        VllmEngine.of(spec.verifier),
        Endpoint(host="0.0.0.0", port=PORT),
        speculative_config=eagle3_speculative_config(
            draft_path(draft_dir), spec.serving.num_speculative_tokens
        ),
        extra_args=spec.serving.extra_args,
    )


def _probe(period: int, failures: int | None = None) -> dict[str, Any]:
    probe: dict[str, Any] = {"httpGet": {"path": HEALTH_PATH, "port": PORT_NAME}, "periodSeconds": period}
    if failures is not None:
        probe["failureThreshold"] = failures
    return probe


def vllm_container(run: RunRef, spec: Eagle3RunSpec, draft_dir: str, shape: PodShape) -> dict[str, Any]:
    return {
        "name": CONTAINER,
        "image": spec.serving.image or spec.images.vllm,
        "command": ["vllm", "serve"],
        "args": vllm_args(spec, draft_dir),
        "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
        "startupProbe": _probe(STARTUP_PERIOD_SECONDS, STARTUP_FAILURE_THRESHOLD),
        "readinessProbe": _probe(10),
        "livenessProbe": _probe(30, 5),
        "env": env(run, spec, names.SERVE_STAGE),
        "resources": resources(spec, None, shape.gpus),
        "volumeMounts": volume_mounts(shape),
        # a crash-looping vLLM's last log lines reach the pod status, and the run's (serving.blockedBy)
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def draft_check_container(
    spec: Eagle3RunSpec, draft_dir: str, sha256: str, shape: PodShape
) -> dict[str, Any]:
    """An init container that refuses to start vLLM unless the draft's weights still have `sha256`.

    The second guard after the verify stage: a draft whose files change on the volume after it was verified
    (or exported) never serves from a new pod; the pods of the previous ReplicaSet keep serving. It runs in
    the vLLM image (pulled for the pod anyway); the digest and path reach the shell as variables, not code.
    """
    return {
        "name": DRAFT_CHECK_CONTAINER,
        "image": spec.serving.image or spec.images.vllm,
        "command": ["sh", "-c", 'echo "$EAGLE3_DRAFT_SHA256  $EAGLE3_DRAFT_WEIGHTS" | sha256sum -c -'],
        "env": [
            {"name": "EAGLE3_DRAFT_SHA256", "value": sha256},
            {"name": "EAGLE3_DRAFT_WEIGHTS", "value": f"{draft_path(draft_dir)}/{DRAFT_WEIGHTS}"},
        ],
        "volumeMounts": volume_mounts(shape),  # vLLM's: the draft is where vLLM will read it
        "terminationMessagePolicy": "FallbackToLogsOnError",  # sha256sum's "FAILED" line
    }


def deployment_spec(
    run: RunRef, spec: Eagle3RunSpec, draft_dir: str, sha256: str | None = None
) -> dict[str, Any]:
    shape = PodShape(names.SERVE_STAGE, spec.verifier.tensor_parallel_size, uses_vllm=True, serving=True)
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(PORT),
        "prometheus.io/path": METRICS_PATH,
        names.ANNOTATION_DRAFT: draft_dir,
    }
    pod = pod_spec(run, spec, shape, vllm_container(run, spec, draft_dir, shape))
    if sha256 is not None:
        pod["initContainers"] = [draft_check_container(spec, draft_dir, sha256, shape)]
    template = {
        "metadata": {"labels": names.labels(run.name, names.SERVE_STAGE), "annotations": annotations},
        "spec": pod,
    }
    return {
        "replicas": spec.serving.replicas,
        "selector": {"matchLabels": serving_selector(run)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS,
        "template": template,
    }


def build_deployment(
    run: RunRef, spec: Eagle3RunSpec, draft_dir: str, sha256: str | None = None
) -> dict[str, Any]:
    """vLLM serving the verifier with the draft; `eagle3.dev/spec-hash` hashes the Deployment's spec.

    With the draft's `sha256` (pinned in git or computed by export), an init container checks the weights
    before vLLM starts."""
    body = deployment_spec(run, spec, draft_dir, sha256)
    annotations = {names.ANNOTATION_SPEC_HASH: content_hash(body)}
    name = names.serving_name(run.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": names.metadata(run, name, names.SERVE_STAGE, annotations=annotations),
        "spec": body,
    }


def build_service(run: RunRef) -> dict[str, Any]:
    """A ClusterIP Service in front of the run's vLLM pods (`eagle3.dev/spec-hash` hashes its spec)."""
    port = {"name": PORT_NAME, "port": PORT, "targetPort": PORT_NAME, "protocol": "TCP"}
    spec = {"type": "ClusterIP", "selector": serving_selector(run), "ports": [port]}
    return _hashed(run, "v1", "Service", spec)


def pod_label(label: str) -> str:
    """A pod label as service discovery names it: `eagle3.dev/run` is `..._pod_label_eagle3_dev_run`."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in label)


def pod_monitor_relabelings() -> list[dict[str, Any]]:
    """vLLM's series get `namespace` and `run`: the labels the dashboard, alerts and operator series use."""
    return [
        {"action": "replace", "sourceLabels": [pod_label(names.LABEL_RUN)], "targetLabel": "run"},
        {"action": "replace", "sourceLabels": ["__meta_kubernetes_namespace"], "targetLabel": "namespace"},
    ]


def build_pod_monitor(run: RunRef) -> dict[str, Any]:
    """A Prometheus Operator PodMonitor scraping vLLM's /metrics, labelling its series with the run."""
    endpoint = {
        "port": PORT_NAME,
        "path": METRICS_PATH,
        "interval": "15s",
        "relabelings": pod_monitor_relabelings(),
    }
    spec = {"selector": {"matchLabels": serving_selector(run)}, "podMetricsEndpoints": [endpoint]}
    return _hashed(run, "monitoring.coreos.com/v1", "PodMonitor", spec)


def _hashed(run: RunRef, api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A serving child whose `eagle3.dev/spec-hash` lets the planner patch it when this builder changes
    (an operator upgrade), as it does the Deployment."""
    annotations = {names.ANNOTATION_SPEC_HASH: content_hash(spec)}
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": names.metadata(
            run, names.serving_name(run.name), names.SERVE_STAGE, annotations=annotations
        ),
        "spec": spec,
    }


def serving_url(run: RunRef) -> str:
    """The in-cluster URL of the run's OpenAI-compatible endpoint."""
    return f"http://{names.serving_name(run.name)}.{run.namespace}.svc:{PORT}"

"""Online extraction's hidden-state producers: a Deployment of vLLM servers (`eagle3 produce`), its Service.

The producers belong to one train stage (its hash is their `eagle3.dev/hash` label): the planner creates them
before that stage's Job and deletes them once it finished, so their GPUs are held only while it trains.
"""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.spec import DEFAULT_PIPELINE_IMAGE, Eagle3RunSpec
from eagle3_contract.mounts import ARTIFACTS_MOUNT, SPEC_MOUNT
from eagle3_contract.online import ENV_MOONCAKE_MASTER, PRODUCER_PORT, endpoint_url, produce_argv
from eagle3_contract.policy import stage_override
from eagle3_contract.stages import Stage, content_hash, on_cpu
from eagle3_operator.builders import names
from eagle3_operator.builders.mooncake import mooncake_address
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.pod import (
    PodShape,
    container_resources,
    default_vllm_resources,
    env,
    pod_spec,
    pod_template,
    volume_mounts,
)

CONTAINER = "producer"
PORT_NAME = "http"
HEALTH_PATH = "/health"
STARTUP_PERIOD_SECONDS = 10
# A big verifier takes long to download and load: up to an hour before the first /health.
STARTUP_FAILURE_THRESHOLD = 360
PROGRESS_DEADLINE_SECONDS = STARTUP_PERIOD_SECONDS * STARTUP_FAILURE_THRESHOLD + 600


def producers_selector(run: RunRef) -> dict[str, str]:
    """The labels selecting a run's producer pods (the Deployment and the Service agree on them)."""
    return {
        names.LABEL_RUN: names.run_label(run.name),
        names.LABEL_STAGE: names.PRODUCERS_STAGE,
    }


def producers_endpoint(run: RunRef) -> str:
    """The producers' OpenAI API behind their Service, as the train stage's ENV_HIDDEN_STATES_ENDPOINT."""
    return endpoint_url(f"{names.producers_name(run.name)}.{run.namespace}.svc", PRODUCER_PORT)


def _probe(period: int, failures: int | None = None) -> dict[str, Any]:
    probe: dict[str, Any] = {"httpGet": {"path": HEALTH_PATH, "port": PORT_NAME}, "periodSeconds": period}
    if failures is not None:
        probe["failureThreshold"] = failures
    return probe


def producer_container(run: RunRef, spec: Eagle3RunSpec, shape: PodShape) -> dict[str, Any]:
    """`eagle3 produce` (it execs `vllm serve`) in the pipeline image, ready once vLLM answers /health.

    Resources: the extract stage's override (spec.stages.extract: online, the producers do its work), else
    the serving vLLM's default (pod.default_vllm_resources), plus the verifier's tensor-parallel GPUs."""
    override = stage_override(spec, Stage.EXTRACT)
    given = override.resources if override is not None else None
    variables = env(run, spec, names.PRODUCERS_STAGE)
    if spec.extraction.transfer == "mooncake":
        variables.append({"name": ENV_MOONCAKE_MASTER, "value": mooncake_address(run)})
    return {
        "name": CONTAINER,
        "image": spec.images.pipeline or DEFAULT_PIPELINE_IMAGE,
        "command": produce_argv(SPEC_MOUNT, ARTIFACTS_MOUNT, PRODUCER_PORT),
        "ports": [{"name": PORT_NAME, "containerPort": PRODUCER_PORT, "protocol": "TCP"}],
        "startupProbe": _probe(STARTUP_PERIOD_SECONDS, STARTUP_FAILURE_THRESHOLD),
        "readinessProbe": _probe(10),
        "livenessProbe": _probe(30, 5),
        "env": variables,
        "resources": container_resources(spec, given or default_vllm_resources(spec), shape.gpus),
        "volumeMounts": volume_mounts(shape),
        # a crash-looping producer's last log lines reach the pod status, and the run's (producers.blockedBy)
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def producers_spec(run: RunRef, spec: Eagle3RunSpec, train_hash: str, spec_configmap: str) -> dict[str, Any]:
    shape = PodShape(
        names.PRODUCERS_STAGE,
        0 if on_cpu(spec) else spec.verifier.tensor_parallel_size,
        uses_vllm=True,
        spec_configmap=spec_configmap,
    )
    # the volume transfer writes samples onto the artifacts volume as the stages do: the same user and group
    pod = pod_spec(run, spec, shape, producer_container(run, spec, shape))
    labels = names.labels(run.name, names.PRODUCERS_STAGE) | {names.LABEL_HASH: train_hash}
    return {
        "replicas": spec.extraction.servers,
        "selector": {"matchLabels": producers_selector(run)},
        # a new producer before an old one goes would need a node's GPUs more: replace them in place
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS,
        "template": pod_template(spec, labels, pod),
    }


def build_producers(run: RunRef, spec: Eagle3RunSpec, train_hash: str, spec_configmap: str) -> dict[str, Any]:
    """The producers of the train stage with hash `train_hash`: `extraction.servers` replicas of
    `verifier.tensorParallelSize` GPUs each on the run's node pool, reading the run document of
    `spec_configmap` (as that stage's Job does).

    With `queueName`, the Deployment carries Kueue's queue label: where Kueue manages Deployments, their GPUs
    are admitted through the run's queue as the stage Jobs' are (elsewhere the label is inert)."""
    body = producers_spec(run, spec, train_hash, spec_configmap)
    extra = {names.LABEL_HASH: train_hash}
    if spec.queue_name:
        extra[names.LABEL_KUEUE_QUEUE] = spec.queue_name
    annotations = {names.ANNOTATION_SPEC_HASH: content_hash(body)}
    name = names.producers_name(run.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": names.metadata(run, name, names.PRODUCERS_STAGE, labels=extra, annotations=annotations),
        "spec": body,
    }


def build_producers_service(run: RunRef) -> dict[str, Any]:
    """One ClusterIP Service in front of every producer: the train stage's endpoint spreads its requests."""
    port = {"name": PORT_NAME, "port": PRODUCER_PORT, "targetPort": PORT_NAME, "protocol": "TCP"}
    name = names.producers_name(run.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.metadata(run, name, names.PRODUCERS_STAGE),
        "spec": {"type": "ClusterIP", "selector": producers_selector(run), "ports": [port]},
    }

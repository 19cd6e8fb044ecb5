"""The Mooncake master (`extraction.transfer: mooncake`): one `mooncake_master` pod and its Service.

The master only keeps the store's metadata; the hidden states themselves live in the producers' and the
trainers' segments, so it needs no GPU and schedules anywhere. It runs in the pipeline image (vLLM's image
plus hs-connectors, whose Mooncake connector the producers load): the image that has to carry the
`mooncake-transfer-engine` package anyway, so one image serves the producers, the trainer and the master.
"""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.spec import DEFAULT_PIPELINE_IMAGE, Eagle3RunSpec
from eagle3_contract.online import MOONCAKE_MASTER_PORT, MOONCAKE_METRICS_PORT, mooncake_master_argv
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.pod import PodShape, customise, pod_template

CONTAINER = "mooncake-master"
RPC_PORT_NAME = "rpc"
METRICS_PORT_NAME = "metrics"
REQUESTS = {"cpu": "1", "memory": "2Gi"}
SHAPE = PodShape(names.MOONCAKE_STAGE, gpus=0, uses_vllm=False)  # off the GPU pool, no volumes


def mooncake_selector(run: RunRef) -> dict[str, str]:
    return {names.LABEL_RUN: names.run_label(run.name), names.LABEL_STAGE: names.MOONCAKE_STAGE}


def mooncake_address(run: RunRef) -> str:
    """`host:port` of the master behind its Service (ENV_MOONCAKE_MASTER of the producers and the trainer)."""
    return f"{names.mooncake_name(run.name)}.{run.namespace}.svc:{MOONCAKE_MASTER_PORT}"


def _ports() -> list[dict[str, Any]]:
    return [
        {"name": RPC_PORT_NAME, "containerPort": MOONCAKE_MASTER_PORT, "protocol": "TCP"},
        {"name": METRICS_PORT_NAME, "containerPort": MOONCAKE_METRICS_PORT, "protocol": "TCP"},
    ]


def _health(**timing: int) -> dict[str, Any]:
    """A probe of the master's metrics port, which answers GET /health (its RPC port speaks no HTTP)."""
    return {"httpGet": {"path": "/health", "port": METRICS_PORT_NAME}, **timing}


def master_container(spec: Eagle3RunSpec) -> dict[str, Any]:
    return {
        "name": CONTAINER,
        "image": spec.images.pipeline or DEFAULT_PIPELINE_IMAGE,
        "command": mooncake_master_argv(MOONCAKE_MASTER_PORT, MOONCAKE_METRICS_PORT),
        "ports": _ports(),
        "readinessProbe": _health(periodSeconds=5),
        "livenessProbe": _health(periodSeconds=30, failureThreshold=5),
        "resources": {"requests": dict(REQUESTS)},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def build_mooncake_master(run: RunRef, spec: Eagle3RunSpec, train_hash: str) -> dict[str, Any]:
    """One replica (a second master would split the store), replaced by Recreate, never beside itself."""
    labels = names.labels(run.name, names.MOONCAKE_STAGE) | {names.LABEL_HASH: train_hash}
    body = {
        "replicas": 1,
        "selector": {"matchLabels": mooncake_selector(run)},
        "strategy": {"type": "Recreate"},
        "template": pod_template(
            spec, labels, customise(spec, SHAPE, {"containers": [master_container(spec)]})
        ),
    }
    name = names.mooncake_name(run.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": names.metadata(run, name, names.MOONCAKE_STAGE, labels={names.LABEL_HASH: train_hash}),
        "spec": body,
    }


def build_mooncake_service(run: RunRef) -> dict[str, Any]:
    ports = [
        {"name": RPC_PORT_NAME, "port": MOONCAKE_MASTER_PORT, "targetPort": RPC_PORT_NAME, "protocol": "TCP"},
        {
            "name": METRICS_PORT_NAME,
            "port": MOONCAKE_METRICS_PORT,
            "targetPort": METRICS_PORT_NAME,
            "protocol": "TCP",
        },
    ]
    name = names.mooncake_name(run.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.metadata(run, name, names.MOONCAKE_STAGE),
        "spec": {"type": "ClusterIP", "selector": mooncake_selector(run), "ports": ports},
    }

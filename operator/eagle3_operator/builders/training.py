"""The train stage's extras: where its program finds the producers (online), and its nodes (multi-node).

`training.nodes` > 1 makes the train Job an Indexed Job of that many pods, each `training.gpus` GPUs, joined
by torchrun's c10d rendezvous on pod 0. The pods' hostnames (`<job>-<index>`, set by the Job controller) are
resolvable through a headless Service of the Job's name, their `subdomain`; it publishes pods before they are
ready, as the rendezvous happens before any of them could be.
"""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.online import (
    ENV_HIDDEN_STATES_ENDPOINT,
    ENV_MOONCAKE_MASTER,
    ENV_NODE_RANK,
    ENV_NODES,
    ENV_RENDEZVOUS,
    RENDEZVOUS_PORT,
)
from eagle3_contract.stages import Stage, StagePlan
from eagle3_operator.builders import names
from eagle3_operator.builders.mooncake import mooncake_address
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.producers import producers_endpoint

COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
RENDEZVOUS_PORT_NAME = "c10d"


def train_nodes(spec: Eagle3RunSpec, plan: StagePlan) -> int:
    """Pods of the stage's Job: `training.nodes` for train, else 1."""
    return spec.training.nodes if plan.stage == Stage.TRAIN else 1


def rendezvous(job_name: str) -> str:
    """`host:port` of pod 0's c10d rendezvous: its hostname under the headless Service (the Job's name)."""
    return f"{job_name}-0.{job_name}:{RENDEZVOUS_PORT}"


def online_env(run: RunRef, spec: Eagle3RunSpec) -> list[dict[str, Any]]:
    """Where an online train stage finds the producers (and the Mooncake master)."""
    out = [{"name": ENV_HIDDEN_STATES_ENDPOINT, "value": producers_endpoint(run)}]
    if spec.extraction.transfer == "mooncake":
        out.append({"name": ENV_MOONCAKE_MASTER, "value": mooncake_address(run)})
    return out


def train_env(run: RunRef, spec: Eagle3RunSpec, plan: StagePlan, job_name: str) -> list[dict[str, Any]]:
    """The train container's variables beyond every stage's: the producers online, the nodes when > 1."""
    if plan.stage != Stage.TRAIN:
        return []
    out = online_env(run, spec) if spec.extraction.mode == "online" else []
    nodes = train_nodes(spec, plan)
    if nodes > 1:
        out += [
            {"name": ENV_NODE_RANK, "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
            {"name": ENV_NODES, "value": str(nodes)},
            {"name": ENV_RENDEZVOUS, "value": rendezvous(job_name)},
        ]
    return out


def indexed(job_spec: dict[str, Any], nodes: int, job_name: str) -> dict[str, Any]:
    """`job_spec` as an Indexed Job of `nodes` pods started together, each named on the headless Service.

    Under Kueue the Job is one Workload with one pod set of `nodes` pods: it is admitted (unsuspended) only
    when the queue has quota for all of them at once, so the gang never holds some nodes' GPUs while it
    waits for the others."""
    out = dict(job_spec)
    out["completionMode"] = "Indexed"
    out["completions"] = nodes
    out["parallelism"] = nodes
    out["template"]["spec"]["subdomain"] = job_name
    return out


def build_rendezvous_service(run: RunRef, job_name: str, train_hash: str, attempt: int) -> dict[str, Any]:
    """The headless Service of a multi-node train Job (same name), selecting that Job's pods: DNS for their
    hostnames, created with the Job and deleted with it (reconcile/rendezvous.py)."""
    selector = {
        names.LABEL_RUN: names.run_label(run.name),
        names.LABEL_STAGE: Stage.TRAIN.value,
        names.LABEL_HASH: train_hash,
        names.LABEL_ATTEMPT: str(attempt),
    }
    port = {"name": RENDEZVOUS_PORT_NAME, "port": RENDEZVOUS_PORT, "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.metadata(run, job_name, Stage.TRAIN.value),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [port],
        },
    }

"""Runs and specs the builder tests share: a tiny CPU-ish run and a Kimi-K2.5-sized one."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.validation import parse_spec, spec_document
from eagle3_contract.stages import Stage, StagePlan, content_hash, plan_stages
from eagle3_operator.builders import (
    build_artifacts_claim,
    build_deployment,
    build_job,
    build_pod_monitor,
    build_service,
    build_spec_configmap,
)
from eagle3_operator.builders.capture import build_capture_configmap
from eagle3_operator.builders.mooncake import build_mooncake_master, build_mooncake_service
from eagle3_operator.builders.names import RunRef, spec_configmap_name
from eagle3_operator.builders.producers import build_producers, build_producers_service
from eagle3_operator.builders.training import build_rendezvous_service
from tests.tiny_spec import tiny

TINY_RUN = RunRef(name="tiny", namespace="eagle3", uid="00000000-0000-4000-8000-000000000001")
KIMI_RUN = RunRef(name="kimi-k2-5", namespace="llm", uid="00000000-0000-4000-8000-000000000002")

# The tiny example; its claim is deleted with the run, so the builders' owner reference on it is covered.
TINY_SPEC: dict[str, Any] = tiny(storage={"artifacts": {"deleteWithRun": True}})

KIMI_SPEC: dict[str, Any] = {
    "verifier": {
        "model": "moonshotai/Kimi-K2.5",
        "revision": "0123456789abcdef0123456789abcdef01234567",
        "trustRemoteCode": True,
        "tensorParallelSize": 8,
        "maxModelLen": 32768,
        "vllmArgs": ["--enable-expert-parallel"],
    },
    "dataset": {"source": "HuggingFaceH4/ultrachat_200k", "split": "train_sft", "maxSequenceLength": 4096},
    "regeneration": {"enabled": True, "maxTokens": 8192, "reasoning": "drop"},
    "extraction": {"tokenBudget": 16384},
    "training": {"gpus": 8, "epochs": 5},
    "serving": {"replicas": 2, "numSpeculativeTokens": 4, "extraArgs": ["--gpu-memory-utilization", "0.92"]},
    "nodePool": {
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "storage": {
        "artifacts": {"size": "2Ti", "storageClassName": "fsx-lustre"},
        "modelCache": {"claimName": "hf-model-cache"},
    },
    "hfTokenSecret": {"name": "hf-token", "key": "token"},
    "queueName": "gpu-h200",
    "stages": {
        "extract": {
            "resources": {"requests": {"cpu": "32", "memory": "512Gi"}, "limits": {"memory": "1Ti"}},
            "activeDeadlineSeconds": 172800,
        },
        "train": {"backoffLimit": 1},
    },
}


# The Kimi run online: 2 producers (one node each) hand hidden states over Mooncake to 2 training nodes.
KIMI_ONLINE_SPEC: dict[str, Any] = copy.deepcopy(KIMI_SPEC) | {
    "extraction": {"tokenBudget": 16384, "mode": "online", "transfer": "mooncake", "servers": 2},
    "training": {"gpus": 8, "epochs": 5, "nodes": 2},
}


PINNED_SHA256 = "5c1f5ae3d9f2b37a4e0f8c6d2b1a90e7c3d4f5a6b7c8d9e0f1a2b3c4d5e6f708"


def tiny_spec() -> Eagle3RunSpec:
    return parse_spec(TINY_SPEC)


def pinned_spec() -> Eagle3RunSpec:
    """The tiny run serving a draft promoted through git: every stage skipped but verify."""
    pin = {"path": "export/3f0c2a9d41be", "sha256": PINNED_SHA256}
    return parse_spec(TINY_SPEC | {"serving": {"pinnedCheckpoint": pin}})


def kimi_spec() -> Eagle3RunSpec:
    return parse_spec(KIMI_SPEC)


def customised_spec() -> Eagle3RunSpec:
    """The Kimi run from a private registry: its images, pull secret, service account and pod labels."""
    pod = {
        "serviceAccountName": "eagle3-runner",
        "imagePullSecrets": [{"name": "registry-creds"}],
        "labels": {"team": "ml"},
        "annotations": {"owner": "ml-platform"},
        "priorityClassName": "gpu-batch",
    }
    images = {
        "pipeline": "registry.example.com/eagle3/pipeline:0.1.0",
        "vllm": "registry.example.com/vllm:0.32",
    }
    return parse_spec(KIMI_SPEC | {"pod": pod, "images": images})


def kimi_online_spec() -> Eagle3RunSpec:
    return parse_spec(KIMI_ONLINE_SPEC)


def online_objects(run: RunRef, spec: Eagle3RunSpec) -> list[dict[str, Any]]:
    """The online and multi-node objects: producers, Mooncake master, the Indexed train Job, its Service."""
    train = plan_of(spec, Stage.TRAIN)
    job = build_job(run, spec, train, 0, None, configmap_name(run, spec))
    return [
        build_producers(run, spec, train.hash, configmap_name(run, spec)),
        build_producers_service(run),
        build_mooncake_master(run, spec, train.hash),
        build_mooncake_service(run),
        job,
        build_rendezvous_service(run, job["metadata"]["name"], train.hash, 0),
    ]


def plan_of(spec: Eagle3RunSpec, stage: Stage) -> StagePlan:
    return next(p for p in plan_stages(spec) if p.stage == stage)


def spec_hash(spec: Eagle3RunSpec) -> str:
    return content_hash(spec_document(spec))


def configmap_name(run: RunRef, spec: Eagle3RunSpec) -> str:
    return spec_configmap_name(run.name, spec_hash(spec))


def draft_dir(spec: Eagle3RunSpec) -> str:
    return plan_of(spec, Stage.EXPORT).output_dir


def stage_jobs(run: RunRef, spec: Eagle3RunSpec, attempt: int = 0) -> list[tuple[StagePlan, dict[str, Any]]]:
    """Every stage that runs, with its Job."""
    cm = configmap_name(run, spec)
    return [
        (plan, build_job(run, spec, plan, attempt, None, cm))
        for plan in plan_stages(spec)
        if plan.skipped is None
    ]


def all_objects(run: RunRef, spec: Eagle3RunSpec) -> list[dict[str, Any]]:
    """Every object the builders make for a run."""
    return [
        build_spec_configmap(run, spec, spec_hash(spec)),
        build_artifacts_claim(run, spec),
        *(job for _, job in stage_jobs(run, spec)),
        build_deployment(run, spec, draft_dir(spec)),
        *([build_capture_configmap(run)] if spec.serving.capture is not None else []),
        build_service(run),
        build_pod_monitor(run, spec),
    ]


STAGES = ["prepare", "generate", "extract", "vocab", "train", "evaluate", "export"]
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h200"]}]}
            ]
        }
    }
}


@st.composite
def specs(draw: st.DrawFn) -> Eagle3RunSpec:
    """Valid specs varying everything the builders branch on."""
    doc: dict[str, Any] = copy.deepcopy(TINY_SPEC)
    doc["verifier"]["tensorParallelSize"] = draw(st.sampled_from([1, 2, 4, 8]))
    doc["training"]["gpus"] = draw(st.integers(1, 8))
    doc["extraction"]["backend"] = draw(st.sampled_from(["vllm", "transformers"]))
    doc["regeneration"] = {"enabled": draw(st.booleans())}
    doc["nodePool"] = {
        "gpuResourceName": draw(st.sampled_from(["nvidia.com/gpu", "amd.com/gpu"])),
        "nodeSelector": draw(st.sampled_from([{}, {"pool": "gpu"}])),
        "tolerations": draw(st.sampled_from([[], [GPU_TOLERATION]])),
        "affinity": draw(st.sampled_from([{}, AFFINITY])),
    }
    if draw(st.booleans()):
        doc["hfTokenSecret"] = {"name": "hf"}
    if draw(st.booleans()):
        doc["queueName"] = "q"
    if draw(st.booleans()):
        doc["serving"] = {**doc.get("serving", {}), "capture": {"sampleRate": 0.5}}
    stage = draw(st.sampled_from(STAGES))
    doc["stages"] = {stage: {"resources": {"requests": {"cpu": "2"}, "limits": {"memory": "8Gi"}}}}
    return parse_spec(doc)

"""Deterministic names, labels, annotations and owner references of a run's children."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eagle3_contract.api.base import API_VERSION, KIND
from eagle3_contract.stages import content_hash

MANAGED_BY = "eagle3-operator"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_RUN = "eagle3.dev/run"
LABEL_STAGE = "eagle3.dev/stage"
LABEL_HASH = "eagle3.dev/hash"
LABEL_ATTEMPT = "eagle3.dev/attempt"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
# serving.canary: the canary's vLLM pods carry `eagle3.dev/track: canary`; the PodMonitor labels every vLLM
# series with `track` (`stable` where the pod has no such label: the incumbent's pods stay as they are).
LABEL_TRACK = "eagle3.dev/track"
TRACK_CANARY = "canary"
TRACK_STABLE = "stable"
ANNOTATION_TOKEN_BUDGET = "eagle3.dev/token-budget"
ANNOTATION_SPEC_HASH = "eagle3.dev/spec-hash"
# What the operator applied to a serving child (the canonical JSON of what its spec hash hashes): a hand edit
# of a field in it is undone (eagle3_operator.reconcile.drift).
ANNOTATION_APPLIED = "eagle3.dev/applied"
ANNOTATION_DRAFT = "eagle3.dev/draft"
SERVE_STAGE = "serve"
# The online hidden-state producers and the Mooncake master (their Deployments, Services and pods).
PRODUCERS_STAGE = "producers"
MOONCAKE_STAGE = "mooncake"
STAGES_MONITOR = "stages"  # the stage label of the stage pods' PodMonitor
MAX_NAME = 63


@dataclass(frozen=True)
class RunRef:
    """The identity of the owning Eagle3Run."""

    name: str
    namespace: str
    uid: str

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def _salt(run: str) -> str:
    return hashlib.sha256(run.encode()).hexdigest()[:6]


def run_label(run: str) -> str:
    """The value of the `eagle3.dev/run` label: the run's name, cut and salted if over 63 characters."""
    return run if len(run) <= MAX_NAME else f"{run[: MAX_NAME - 7].rstrip('-.')}-{_salt(run)}"


def child_name(run: str, *parts: str, limit: int = MAX_NAME) -> str:
    """`<run>-<parts...>`: a DNS-1035 label of at most `limit` (63) characters, valid for every kind (Services
    too).

    A run name that is not already such a label (dots, a leading digit) or is too long is rewritten and salted
    with a hash of the full name, so distinct runs (`a.b` and `a-b`) never share a child.
    """
    base = run.replace(".", "-")
    if base[:1].isdigit():
        base = "r" + base
    name = "-".join((base, *parts))
    if base == run and len(name) <= limit:
        return name
    keep = limit - sum(len(p) + 1 for p in parts) - 7
    return "-".join((base[:keep].rstrip("-"), _salt(run), *parts))


def job_name(run: str, stage: str, digest: str, attempt: int, pods: int = 1) -> str:
    """An Indexed Job of `pods` > 1 names its pods' hostnames `<job>-<index>`: the name leaves room for the
    index, so the hostname stays a DNS label too."""
    parts = [stage, digest] + ([f"r{attempt}"] if attempt else [])
    return child_name(run, *parts, limit=MAX_NAME - (len(f"-{pods - 1}") if pods > 1 else 0))


def spec_configmap_name(run: str, spec_hash: str) -> str:
    return child_name(run, "spec", spec_hash)


def capture_configmap_name(run: str) -> str:
    """serving.capture's ConfigMap (the capture package vLLM loads)."""
    return child_name(run, "capture")


def artifacts_claim_name(run: str) -> str:
    return child_name(run, "artifacts")


def serving_name(run: str) -> str:
    return child_name(run, "vllm")


def canary_name(run: str) -> str:
    """The canary vLLM Deployment of serving.canary: `<serving name>-canary`."""
    return child_name(run, "vllm", TRACK_CANARY)


def producers_name(run: str) -> str:
    """The hidden-state producers' Deployment and Service."""
    return child_name(run, PRODUCERS_STAGE)


def mooncake_name(run: str) -> str:
    """The Mooncake master's Deployment and Service."""
    return child_name(run, MOONCAKE_STAGE)


def stage_monitor_name(run: str) -> str:
    """The PodMonitor of the run's stage pods (their progress metrics)."""
    return child_name(run, STAGES_MONITOR)


def labels(run: str, stage: str) -> dict[str, str]:
    """The labels every child carries; `eagle3.dev/run` and `eagle3.dev/stage` select them."""
    return {
        LABEL_NAME: "eagle3",
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_RUN: run_label(run),
        LABEL_STAGE: stage,
    }


def metadata(
    run: RunRef, name: str, stage: str, owned: bool = True, **extra: dict[str, str]
) -> dict[str, Any]:
    """Object metadata with labels (plus `extra['labels']`), annotations and, if `owned`, the owner ref."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": run.namespace,
        "labels": labels(run.name, stage) | extra.get("labels", {}),
    }
    if extra.get("annotations"):
        meta["annotations"] = dict(extra["annotations"])
    if owned:
        meta["ownerReferences"] = [run.owner_reference()]
    return meta


def applied(body: Mapping[str, Any]) -> dict[str, str]:
    """The annotations that let the operator find and undo a hand edit of `body`: its hash and its JSON."""
    return {
        ANNOTATION_SPEC_HASH: content_hash(dict(body)),
        ANNOTATION_APPLIED: json.dumps(body, sort_keys=True, separators=(",", ":")),
    }

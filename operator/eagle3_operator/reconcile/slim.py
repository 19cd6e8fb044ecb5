"""Slim copies of the watched objects: only the fields the planner reads (eagle3_operator.reconcile.observe),
so the per-run indexes stay small on a cluster with thousands of Jobs and pods."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eagle3_operator.builders import names
from eagle3_operator.reconcile.drift import observed_hash


def _pick(body: Mapping[str, Any], *paths: str) -> dict[str, Any]:
    """A copy of `body` with only the given dotted paths (what the planner reads), to keep indexes small."""
    out: dict[str, Any] = {}
    for path in paths:
        *parents, leaf = path.split(".")
        src: Any = body
        dst = out
        for part in parents:
            src = src.get(part) if isinstance(src, Mapping) else None
            dst = dst.setdefault(part, {})
        if isinstance(src, Mapping) and leaf in src:
            dst[leaf] = src[leaf]
    return out


def slim_run(body: Mapping[str, Any]) -> dict[str, Any]:
    """A run without `managedFields` and kopf's bookkeeping: half of a real server's body, kept per run."""
    out = _pick(
        body,
        "apiVersion",
        "kind",
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "metadata.generation",
        "metadata.deletionTimestamp",
        "spec",
    )
    out["status"] = {k: v for k, v in (body.get("status") or {}).items() if k != "kopf"}
    return out


def slim_job(body: Mapping[str, Any]) -> dict[str, Any]:
    return _pick(
        body,
        "metadata.name",
        "metadata.uid",
        "metadata.labels",
        "metadata.annotations",
        "spec.template.spec.volumes",
        "status",
    )


def slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    return _pick(
        body,
        "metadata.name",
        "metadata.uid",
        "metadata.labels",
        "status.phase",
        "status.podIP",
        "status.conditions",
        "status.initContainerStatuses",
        "status.containerStatuses",
    )


def slim_deployment(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the planner reads of a Deployment; its spec hash marked drifted where a field the operator
    applied was edited by hand (drift.py), and without the applied JSON itself (the index stays small)."""
    slim = _pick(
        body,
        "metadata.name",
        "metadata.uid",
        "metadata.labels",
        "metadata.annotations",
        "spec.replicas",
        "spec.template.metadata.annotations",
        "spec.template.spec.volumes",
        "status.readyReplicas",
        "status.availableReplicas",
    )
    annotations = dict(slim.get("metadata", {}).get("annotations") or {})
    annotations.pop(names.ANNOTATION_APPLIED, None)
    spec_hash = observed_hash(body, names.ANNOTATION_SPEC_HASH, names.ANNOTATION_APPLIED)
    if spec_hash is not None:
        annotations[names.ANNOTATION_SPEC_HASH] = spec_hash
    if "metadata" in slim:
        slim["metadata"]["annotations"] = annotations
    return slim

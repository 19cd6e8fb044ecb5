"""Pod pieces shared by stage Jobs and the serving Deployment: volumes, mounts, env, resources, placement."""

from __future__ import annotations

import copy
import posixpath
from dataclasses import dataclass
from typing import Any

from eagle3_contract.api.spec import Eagle3RunSpec, StageOverride
from eagle3_contract.mounts import ARTIFACTS_MOUNT, HF_HOME, MODEL_CACHE_MOUNT, SPEC_MOUNT
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef

SHM_MOUNT = "/dev/shm"
# The key of the run document in the spec ConfigMap; mounted as the file SPEC_MOUNT.
SPEC_KEY = "run.json"
VOLUME_ARTIFACTS = "artifacts"
VOLUME_MODEL_CACHE = "model-cache"
VOLUME_SPEC = "spec"
VOLUME_SHM = "dshm"
ENV_RUN = "EAGLE3_RUN"
ENV_STAGE = "EAGLE3_STAGE"

# The pipeline image runs as UID/GID 65532 (images/pipeline/Dockerfile): the artifacts volume's files get that
# group so the stages (and online producers) can write them; only a volume whose root has another group is
# walked (OnRootMismatch), not terabytes of hidden states on every start.
PIPELINE_GID = 65532
STAGE_POD_SECURITY: dict[str, Any] = {"fsGroup": PIPELINE_GID, "fsGroupChangePolicy": "OnRootMismatch"}


@dataclass(frozen=True)
class PodShape:
    """What distinguishes one pod of a run from another.

    `spec_configmap` mounts the run document (stage Jobs only); `serving` mounts the artifacts read-only and
    always places the pod on the GPU pool; `uses_vllm` adds a memory-backed /dev/shm.
    """

    stage: str
    gpus: int
    uses_vllm: bool
    spec_configmap: str | None = None
    serving: bool = False

    @property
    def on_gpu_pool(self) -> bool:
        return self.gpus > 0 or self.serving


def artifacts_claim(run: RunRef, spec: Eagle3RunSpec) -> str:
    """The PVC the stages exchange files on: an existing claim, or the one the operator creates."""
    return spec.storage.artifacts.claim_name or names.artifacts_claim_name(run.name)


def volumes(run: RunRef, spec: Eagle3RunSpec, shape: PodShape) -> list[dict[str, Any]]:
    claim: dict[str, Any] = {"claimName": artifacts_claim(run, spec)}
    if shape.serving:
        claim["readOnly"] = True
    out: list[dict[str, Any]] = [{"name": VOLUME_ARTIFACTS, "persistentVolumeClaim": claim}]
    cache = spec.storage.model_cache.claim_name
    if cache:
        out.append({"name": VOLUME_MODEL_CACHE, "persistentVolumeClaim": {"claimName": cache}})
    else:
        out.append({"name": VOLUME_MODEL_CACHE, "emptyDir": {}})
    if shape.spec_configmap is not None:
        items = [{"key": SPEC_KEY, "path": posixpath.basename(SPEC_MOUNT)}]
        out.append({"name": VOLUME_SPEC, "configMap": {"name": shape.spec_configmap, "items": items}})
    if shape.uses_vllm:
        out.append({"name": VOLUME_SHM, "emptyDir": {"medium": "Memory"}})
    return out


def volume_mounts(shape: PodShape) -> list[dict[str, Any]]:
    artifacts: dict[str, Any] = {"name": VOLUME_ARTIFACTS, "mountPath": ARTIFACTS_MOUNT}
    if shape.serving:
        artifacts["readOnly"] = True
    out = [artifacts, {"name": VOLUME_MODEL_CACHE, "mountPath": MODEL_CACHE_MOUNT}]
    if shape.spec_configmap is not None:
        out.append({"name": VOLUME_SPEC, "mountPath": posixpath.dirname(SPEC_MOUNT), "readOnly": True})
    if shape.uses_vllm:
        out.append({"name": VOLUME_SHM, "mountPath": SHM_MOUNT})
    return out


def env(run: RunRef, spec: Eagle3RunSpec, stage: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": ENV_RUN, "value": run.name},
        {"name": ENV_STAGE, "value": stage},
        {"name": "HF_HOME", "value": HF_HOME},
    ]
    secret = spec.hf_token_secret
    if secret is not None:
        ref = {"name": secret.name, "key": secret.key}
        out.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return out


def resources(spec: Eagle3RunSpec, override: StageOverride | None, gpus: int) -> dict[str, Any]:
    """The override's requests and limits, plus `gpus` of the pool's GPU resource when there are any."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if override is not None and override.resources is not None:
        requests.update(override.resources.requests)
        limits.update(override.resources.limits)
    if gpus > 0:
        gpu = spec.node_pool.gpu_resource_name
        requests[gpu] = gpus
        limits[gpu] = gpus
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def placement(spec: Eagle3RunSpec, shape: PodShape) -> dict[str, Any]:
    """nodeSelector, tolerations and affinity of the pool; GPU pods only, so CPU stages schedule anywhere."""
    if not shape.on_gpu_pool:
        return {}
    pool = spec.node_pool
    out: dict[str, Any] = {}
    if pool.node_selector:
        out["nodeSelector"] = dict(pool.node_selector)
    if pool.tolerations:
        out["tolerations"] = [
            t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in pool.tolerations
        ]
    if pool.affinity:
        out["affinity"] = copy.deepcopy(pool.affinity)
    return out


def pod_spec(run: RunRef, spec: Eagle3RunSpec, shape: PodShape, container: dict[str, Any]) -> dict[str, Any]:
    """A pod spec around one container, with the shape's volumes and placement."""
    return {"containers": [container], "volumes": volumes(run, spec, shape), **placement(spec, shape)}

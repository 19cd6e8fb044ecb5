"""Pod pieces shared by every pod of a run (stage Jobs, vLLM serving, producers, Mooncake master): volumes,
mounts, env, resources, placement, and `spec.pod` with its Pod Security "restricted" defaults
(`customise`)."""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eagle3_contract.api.pods import Resources, StageOverride
from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.mounts import ARTIFACTS_MOUNT, HF_HOME, MODEL_CACHE_MOUNT, SPEC_MOUNT
from eagle3_contract.stages import on_cpu
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef

SHM_MOUNT = "/dev/shm"
# The key of the run document in the spec ConfigMap; mounted as the file SPEC_MOUNT.
SPEC_KEY = "run.json"
VOLUME_ARTIFACTS = "artifacts"
VOLUME_MODEL_CACHE = "model-cache"
VOLUME_SPEC = "spec"
VOLUME_SHM = "dshm"
VOLUME_HOME = "home"
ENV_RUN = "EAGLE3_RUN"
ENV_STAGE = "EAGLE3_STAGE"
# The pipeline image's home (images/pipeline/Dockerfile). The serving pod mounts an emptyDir there: the
# official vLLM image has no home for a non-root user, and vLLM, torch and triton write their caches in one.
HOME = "/home/eagle3"

# The pipeline image runs as UID/GID 65532 (images/pipeline/Dockerfile): the artifacts volume's files get that
# group so the stages (and online producers) can write them; only a volume whose root has another group is
# walked (OnRootMismatch), not terabytes of hidden states on every start.
PIPELINE_UID = 65532
PIPELINE_GID = 65532
# Every pod's default securityContext: the Pod Security Standards' "restricted" level
# (spec.pod.securityContext is merged over it field by field: `merged_context`).
RESTRICTED_POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": PIPELINE_UID,
    "runAsGroup": PIPELINE_GID,
    "fsGroup": PIPELINE_GID,
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
STAGE_POD_SECURITY = RESTRICTED_POD_SECURITY
# Every container's default securityContext (spec.pod.containerSecurityContext is merged over it).
RESTRICTED_CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
# vLLM's CPU and memory when the spec gives none: per GPU (tensor parallelism), or for the CPU backend.
VLLM_CPU_PER_GPU = 4
VLLM_MEMORY_GI_PER_GPU = 16
VLLM_CPU_BACKEND = {"cpu": "4", "memory": "8Gi"}
MEMORY_LIMIT_FACTOR = 2


@dataclass(frozen=True)
class PodShape:
    """What distinguishes one pod of a run from another.

    `spec_configmap` mounts the run document (stage Jobs only); `serving` mounts the artifacts read-only, a
    writable home, and always places the pod on the node pool; `uses_vllm` adds a memory-backed /dev/shm.
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
    """Only volume types the "restricted" level allows: persistentVolumeClaim, emptyDir, configMap."""
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
    if shape.serving:
        out.append({"name": VOLUME_HOME, "emptyDir": {}})
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
    if shape.serving:
        out.append({"name": VOLUME_HOME, "mountPath": HOME})
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


def home_env() -> list[dict[str, Any]]:
    """A non-root vLLM's home and caches on the pod's `home` emptyDir (the official image runs as root and
    has no home for UID 65532; torch's inductor would otherwise look the user up in /etc/passwd)."""
    cache = f"{HOME}/.cache"
    return [
        {"name": "HOME", "value": HOME},
        {"name": "XDG_CACHE_HOME", "value": cache},
        {"name": "XDG_CONFIG_HOME", "value": f"{HOME}/.config"},
        {"name": "VLLM_CACHE_ROOT", "value": f"{cache}/vllm"},
        {"name": "VLLM_CONFIG_ROOT", "value": f"{HOME}/.config/vllm"},
        {"name": "TRITON_CACHE_DIR", "value": f"{cache}/triton"},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{cache}/torchinductor"},
    ]


def container_resources(spec: Eagle3RunSpec, given: Resources | None, gpus: int) -> dict[str, Any]:
    """`given` requests and limits, plus `gpus` of the pool's GPU resource when there are any."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if given is not None:
        requests.update(given.requests)
        limits.update(given.limits)
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


def resources(spec: Eagle3RunSpec, override: StageOverride | None, gpus: int) -> dict[str, Any]:
    """A stage override's requests and limits, plus `gpus` of the pool's GPU resource when there are any."""
    return container_resources(spec, override.resources if override is not None else None, gpus)


def default_vllm_resources(spec: Eagle3RunSpec) -> Resources:
    """A vLLM server's CPU and memory when the spec gives none: 4 CPUs and 16Gi per GPU of the verifier's
    tensor parallelism (4 CPUs and 8Gi on the CPU backend), a memory limit of twice the request."""
    if on_cpu(spec):
        requests = dict(VLLM_CPU_BACKEND)
        memory_gi = int(requests["memory"].removesuffix("Gi"))
    else:
        gpus = spec.verifier.tensor_parallel_size
        memory_gi = VLLM_MEMORY_GI_PER_GPU * gpus
        requests = {"cpu": str(VLLM_CPU_PER_GPU * gpus), "memory": f"{memory_gi}Gi"}
    return Resources(requests=requests, limits={"memory": f"{MEMORY_LIMIT_FACTOR * memory_gi}Gi"})


def placement(spec: Eagle3RunSpec, shape: PodShape) -> dict[str, Any]:
    """nodeSelector, tolerations and affinity. Every pod tolerates spec.pod.tolerations; pods on the node pool
    (GPUs, or serving) add its nodeSelector and tolerations and take its affinity when set, else
    spec.pod.affinity, which is the affinity of every other pod."""
    pool, settings = spec.node_pool, spec.pod
    tolerations = list(settings.tolerations)
    affinity = settings.affinity
    out: dict[str, Any] = {}
    if shape.on_gpu_pool:
        if pool.node_selector:
            out["nodeSelector"] = dict(pool.node_selector)
        tolerations += [t for t in pool.tolerations if t not in tolerations]
        affinity = pool.affinity or affinity
    if tolerations:
        out["tolerations"] = [
            t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tolerations
        ]
    if affinity:
        out["affinity"] = copy.deepcopy(affinity)
    return out


def with_user_env(spec: Eagle3RunSpec, own: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The operator's variables, then spec.pod.env. A user's variable of an operator variable's name replaces
    it: the user's wins (HF_HOME, HOME, VLLM_CPU_KVCACHE_SPACE, ... can be tuned), and no name is listed twice
    (the API server would keep the last and warn). The EAGLE3_* wiring of the stages is not the user's: the
    spec refuses those names (eagle3_contract.api.rules, CEL and its Python twin)."""
    user = [v.document() for v in spec.pod.env]
    taken = {v.get("name") for v in user}
    return [dict(v) for v in own if v["name"] not in taken] + user


def _finish_container(
    spec: Eagle3RunSpec, container: dict[str, Any], user_env: bool = True
) -> dict[str, Any]:
    out = dict(container)
    own = container.get("env") or []
    variables = with_user_env(spec, own) if user_env else [dict(v) for v in own]
    if variables:
        out["env"] = variables
    out["securityContext"] = merged_context(
        RESTRICTED_CONTAINER_SECURITY, spec.pod.container_security_context
    )
    return out


def merged_context(defaults: Mapping[str, Any], given: Mapping[str, Any] | None) -> dict[str, Any]:
    """A security context: `given` over `defaults` field by field (objects such as seccompProfile and
    capabilities merge the same way; a list or a value the user gives replaces the default's), so a field
    the user did not touch keeps its "restricted" default."""
    out = copy.deepcopy(dict(defaults))
    for key, value in (given or {}).items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged_context(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def customise(spec: Eagle3RunSpec, shape: PodShape, pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` (containers, init containers, volumes) with spec.pod applied: the containers' extra env (not
    the init containers': the operator's own guards, which a PATH or LD_PRELOAD could switch off), every
    container's securityContext, the pod's securityContext, service account, pull secrets, priority class and
    placement. spec.pod's security contexts are merged over the "restricted" defaults field by field."""
    settings = spec.pod
    out = dict(pod)
    out["containers"] = [_finish_container(spec, c) for c in pod["containers"]]
    if pod.get("initContainers"):  # the operator's own guards (check-draft): no user variable reaches them
        out["initContainers"] = [_finish_container(spec, c, user_env=False) for c in pod["initContainers"]]
    out["securityContext"] = merged_context(RESTRICTED_POD_SECURITY, settings.security_context)
    if settings.service_account_name:
        out["serviceAccountName"] = settings.service_account_name
    if settings.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": s.name} for s in settings.image_pull_secrets]
    if settings.priority_class_name:
        out["priorityClassName"] = settings.priority_class_name
    return out | placement(spec, shape)


def pod_spec(
    run: RunRef,
    spec: Eagle3RunSpec,
    shape: PodShape,
    container: dict[str, Any],
    init_containers: Iterable[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A pod spec around one container (and its init containers), with the shape's volumes and spec.pod."""
    pod: dict[str, Any] = {"containers": [container], "volumes": volumes(run, spec, shape)}
    init = list(init_containers)
    if init:
        pod["initContainers"] = init
    return customise(spec, shape, pod)


def pod_template(
    spec: Eagle3RunSpec,
    labels: Mapping[str, str],
    pod: dict[str, Any],
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod template: spec.pod's labels and annotations under the operator's own (which win: its selectors
    and the Prometheus annotations are never overridden)."""
    meta: dict[str, Any] = {"labels": dict(spec.pod.labels) | dict(labels)}
    merged = dict(spec.pod.annotations) | dict(annotations or {})
    if merged:
        meta["annotations"] = merged
    return {"metadata": meta, "spec": pod}

"""serving.capture: the ConfigMap holding the capture package, and what a vLLM pod needs to run it.

vLLM loads the package as ASGI middleware (`--middleware eagle3_capture.middleware.CaptureMiddleware`) from
a ConfigMap volume on its PYTHONPATH, so any vLLM image captures without a second image or process, and
`--per-request-spec-decode-metrics summary` puts each request's acceptance in its response, where the
middleware reads it. The records go to `capture/` on the run's artifacts claim: the pod mounts that one
directory writable (a subPath, made by an init container running as the pod's user) and the rest of the
claim, the drafts included, read-only as before.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from eagle3_contract.api.fields import duration_seconds
from eagle3_contract.api.spec import Capture
from eagle3_contract.capture.config import MIDDLEWARE, PACKAGE
from eagle3_contract.mounts import ARTIFACTS_MOUNT, CAPTURE_DIR
from eagle3_contract.quantity import quantity
from eagle3_contract.stages import content_hash
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.pod import VOLUME_ARTIFACTS

VOLUME_CODE = "capture-code"
CODE_MOUNT = "/opt/eagle3/python"  # on PYTHONPATH: the package is <CODE_MOUNT>/eagle3_capture
CAPTURE_MOUNT = "/var/lib/eagle3/capture"  # the claim's capture/ directory, writable
DIR_CONTAINER = "capture-dir"
ANNOTATION_CAPTURE = (
    "eagle3.dev/capture"  # on the pod template: the package's hash (a new one rolls the pods)
)


def capture_sources() -> dict[str, str]:
    """The capture package's modules, by file name (the ConfigMap's keys): a copy of what was read once."""
    return dict(_read_sources())


@functools.cache
def _read_sources() -> dict[str, str]:
    """Read on the first build only: the installed package cannot change while the operator runs, and a
    capturing run's Deployment and ConfigMap are built on every reconcile."""
    package = resources.files("eagle3_contract.capture")
    return {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in sorted(package.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".py")
    }


@functools.cache
def capture_hash() -> str:
    return content_hash(_read_sources())


def build_capture_configmap(run: RunRef) -> dict[str, Any]:
    """The package's source, one key per module; `eagle3.dev/spec-hash` hashes it, so an operator upgrade
    that changes the package patches it (the pods roll by the template's annotation)."""
    annotations = {names.ANNOTATION_SPEC_HASH: capture_hash()}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": names.metadata(
            run, names.capture_configmap_name(run.name), names.SERVE_STAGE, annotations=annotations
        ),
        "data": capture_sources(),
    }


def capture_args() -> list[str]:
    """`vllm serve` arguments: the middleware, and each request's acceptance in its response."""
    return ["--middleware", MIDDLEWARE, "--per-request-spec-decode-metrics", "summary"]


def capture_env(capture: Capture) -> list[dict[str, Any]]:
    max_bytes = quantity(str(capture.max_bytes))
    pod_name = {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}
    return [
        {"name": "PYTHONPATH", "value": CODE_MOUNT},
        {"name": "EAGLE3_CAPTURE_DIR", "value": CAPTURE_MOUNT},
        {"name": "EAGLE3_CAPTURE_SOURCE", "valueFrom": pod_name},
        {"name": "EAGLE3_CAPTURE_SAMPLE_RATE", "value": repr(capture.sample_rate)},
        {"name": "EAGLE3_CAPTURE_MAX_BYTES", "value": str(int(max_bytes or 0))},
        {"name": "EAGLE3_CAPTURE_RETENTION_SECONDS", "value": str(duration_seconds(capture.retention))},
    ]


def capture_volume(run: RunRef) -> dict[str, Any]:
    items = [{"key": name, "path": f"{PACKAGE}/{name}"} for name in capture_sources()]
    return {
        "name": VOLUME_CODE,
        "configMap": {"name": names.capture_configmap_name(run.name), "items": items},
    }


def capture_mounts() -> list[dict[str, Any]]:
    return [
        {"name": VOLUME_CODE, "mountPath": CODE_MOUNT, "readOnly": True},
        {"name": VOLUME_ARTIFACTS, "mountPath": CAPTURE_MOUNT, "subPath": CAPTURE_DIR},
    ]


def capture_dir_container(image: str) -> dict[str, Any]:
    """Makes capture/ on the claim as the pod's user before vLLM mounts it (a subPath the kubelet made
    would be root's, and vLLM runs as the pod's user)."""
    return {
        "name": DIR_CONTAINER,
        "image": image,
        "command": ["/bin/mkdir", "-p", f"{ARTIFACTS_MOUNT}/{CAPTURE_DIR}"],
        "volumeMounts": [{"name": VOLUME_ARTIFACTS, "mountPath": ARTIFACTS_MOUNT}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def capture_container(container: dict[str, Any], capture: Capture) -> dict[str, Any]:
    """The vLLM container running the middleware, writing to the claim's capture/ directory."""
    return container | {
        "args": [*container["args"], *capture_args()],
        "env": [*container.get("env", []), *capture_env(capture)],
        "volumeMounts": [*container.get("volumeMounts", []), *capture_mounts()],
    }


def capture_volumes(volumes: list[dict[str, Any]], run: RunRef) -> list[dict[str, Any]]:
    """The pod's volumes with the package's, and the claim's no longer read-only as a whole: its mounts say
    what each container may write (the drafts stay read-only, capture/ is writable)."""
    out = []
    for volume in volumes:
        if volume["name"] == VOLUME_ARTIFACTS and "persistentVolumeClaim" in volume:
            claim = {k: v for k, v in volume["persistentVolumeClaim"].items() if k != "readOnly"}
            volume = volume | {"persistentVolumeClaim": claim}
        out.append(volume)
    return [*out, capture_volume(run)]

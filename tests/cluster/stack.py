"""What the real-node tier puts on the node, as a user would: the images `make images` built, the chart by
`helm install`, volumes for the tiny example, and the tiny run itself (CPU mode, an evaluation sized for the
tier), plus the reads the tests make of what the kubelet and the Job controller report.

The node is tests/cluster/node.py's (scripts/node.sh). Nothing here fakes a pod's state: every phase, exit
code and restart count comes from the API server, written there by the kubelet and the controllers.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.cluster import node

ROOT = Path(__file__).resolve().parents[2]
IMAGES_SH = ROOT / "scripts" / "build-images.sh"
CHART = ROOT / "charts" / "eagle3-operator"
EXAMPLE = ROOT / "examples" / "tiny" / "eagle3run.yaml"
MODELS_JOB = ROOT / "examples" / "tiny" / "models-job.yaml"
RELEASE = "eagle3-operator"
OPERATOR_NS = "eagle3-system"
GROUP_VERSION = "eagle3.dev/v1alpha1"
LABEL_RUN = "eagle3.dev/run"
LABEL_STAGE = "eagle3.dev/stage"
VOLUMES = node.STATE / "volumes"  # hostPath PersistentVolumes: removed with the node's state by `down`


@dataclass(frozen=True)
class Images:
    operator: str
    pipeline_cpu: str


def built_images() -> Images:
    """The images `make images` builds (scripts/build-images.sh: cached by content, a few seconds when
    nothing changed), loaded into the node's containerd."""
    proc = subprocess.run(
        ["bash", str(IMAGES_SH), "all"],
        capture_output=True,
        text=True,
        timeout=3600,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/build-images.sh failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    manifest = json.loads(Path(proc.stdout.strip().splitlines()[-1]).read_text())
    images = Images(manifest["operator"]["ref"], manifest["pipeline-cpu"]["ref"])
    node.load_image(
        *(f"{manifest[name]['ref']}={manifest[name]['archive']}" for name in ("operator", "pipeline-cpu"))
    )
    return images


def _repository_and_tag(ref: str) -> tuple[str, str]:
    repository, _, tag = ref.rpartition(":")
    return repository, tag


def helm_install(helm: Path, images: Images, *sets: str) -> None:
    """`helm install` of the chart with the built images (pull policy Never), waiting for its pods."""
    operator_repo, operator_tag = _repository_and_tag(images.operator)
    pipeline_repo, pipeline_tag = _repository_and_tag(images.pipeline_cpu)
    values = [
        f"image.repository={operator_repo}",
        f"image.tag={operator_tag}",
        "image.pullPolicy=Never",
        f"pipelineCpuImage.repository={pipeline_repo}",
        f"pipelineCpuImage.tag={pipeline_tag}",
        *sets,
    ]
    args = ["upgrade", "--install", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--create-namespace"]
    args += [a for v in values for a in ("--set", v)] + ["--wait", "--timeout", "5m"]
    env = {**os.environ, "KUBECONFIG": str(node.kubeconfig())}
    proc = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=400, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed:\n{proc.stderr[-4000:]}")


def host_path_volume(name: str, size: str, claim: tuple[str, str] | None = None) -> dict[str, Any]:
    """A hostPath PersistentVolume under the node's state directory (world-writable: the stage pods run as
    65532 and hostPath takes no fsGroup), bound ahead to `claim` (namespace, name) when given."""
    path = VOLUMES / name
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    spec: dict[str, Any] = {
        "capacity": {"storage": size},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "",
        "hostPath": {"path": str(path), "type": "Directory"},
    }
    if claim is not None:
        spec["claimRef"] = {"namespace": claim[0], "name": claim[1]}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


def fill_models(volume: str) -> None:
    """The tiny verifier and its dataset in the models volume, copied from this machine's `eagle3 tiny`
    build (examples/tiny/models-job.yaml builds the same in the cluster, minutes on 2 CPUs)."""
    built = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "eagle3"), "tiny"],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    source = Path(built.stdout.strip().splitlines()[-1])
    models = source if (source / "tiny-llama").is_dir() else source.parent
    target = VOLUMES / volume
    for name in ("tiny-llama", "datasets"):
        shutil.copytree(models / name, target / name, dirs_exist_ok=True)
    subprocess.run(["chmod", "-R", "a+rwX", str(target)], check=True)


def artifacts_dir(namespace: str) -> Path:
    """Where the run's artifacts volume lies on the host: the PersistentVolume its claim (the one that is not
    tiny-models) was bound to by the controller (any free 5Gi volume)."""
    claims = node.kubectl_json("get", "pvc", "-n", namespace)["items"]
    [volume] = [c["spec"]["volumeName"] for c in claims if c["metadata"]["name"] != "tiny-models"]
    return VOLUMES / str(volume)


def models_claim(namespace: str) -> dict[str, Any]:
    """examples/tiny/models-job.yaml's PersistentVolumeClaim, as the example has it."""
    [claim] = [
        d for d in yaml.safe_load_all(MODELS_JOB.read_text()) if d and d["kind"] == "PersistentVolumeClaim"
    ]
    claim["metadata"]["namespace"] = namespace
    claim["spec"]["storageClassName"] = ""
    return dict(claim)


def tier_run(name: str, **changes: Any) -> dict[str, Any]:
    """examples/tiny/eagle3run.yaml, sized for the tier: two epochs, fewer prompts, no sweep, a fixed
    speculation length (the demo keeps the example's six epochs and full evaluation: the tier checks that
    every stage runs as a pod and serves, not how good the draft gets); `changes` are merged into the spec."""
    run = yaml.safe_load(EXAMPLE.read_text())
    run["metadata"]["name"] = name
    spec = run["spec"]
    # two epochs: the tiny draft's acceptance length is about 2.4 after two (docs/benchmarks.md), well above
    # the gate below
    spec["training"] = {**spec["training"], "epochs": 2}
    spec["evaluation"] = {"prompts": 8, "numSpeculativeTokens": 3, "minAcceptanceLength": 1.2}
    # a CPU server's default requests (4 CPUs) would never schedule on the tier's 2-CPU node
    resources = {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
    # serving.capture on, every request: the tier's chat completion must reach the claim as a record
    capture = {"sampleRate": 1.0}
    spec["serving"] = {
        **spec["serving"],
        "speculationLength": "fixed",
        "resources": resources,
        "capture": capture,
    }
    _merge(spec, changes)
    return dict(run)


def _merge(into: dict[str, Any], changes: dict[str, Any]) -> None:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def apply(body: dict[str, Any]) -> None:
    """`kubectl apply -f -` of one object, as a user applies a manifest."""
    node.kubectl("apply", "-f", "-", input=json.dumps(body))


def run_status(namespace: str, name: str) -> dict[str, Any]:
    body = node.kubectl_json("get", "eagle3runs.eagle3.dev", "-n", namespace, name)
    status: dict[str, Any] = body.get("status") or {}
    return status


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


def wait_run(
    namespace: str,
    name: str,
    check: Callable[[dict[str, Any]], bool],
    timeout: float,
    what: str,
    during: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The run's status once `check(status)` holds; `during(status)` is called at each poll (a fault that
    waits for a stage). A Failed condition ends the wait with its reason and message."""
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = run_status(namespace, name)
        if check(status):
            return status
        failed = condition(status, "Failed")
        if failed is not None and failed["status"] == "True":
            raise AssertionError(
                f"run {namespace}/{name} failed while waiting for {what}: {failed}\n"
                f"{pod_report(namespace, name)}"
            )
        if during is not None:
            during(status)
        time.sleep(2)
    raise AssertionError(
        f"run {namespace}/{name}: {what} not within {timeout:.0f}s; status: "
        f"{json.dumps(status)[:3000]}\n{pod_report(namespace, name)}"
    )


def pods(namespace: str, **labels: str) -> list[dict[str, Any]]:
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    found: list[dict[str, Any]] = node.kubectl_json("get", "pods", "-n", namespace, "-l", selector)["items"]
    return found


def jobs(namespace: str, run: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = node.kubectl_json(
        "get", "jobs", "-n", namespace, "-l", f"{LABEL_RUN}={run}"
    )["items"]
    return found


def terminated(pod: dict[str, Any], container: str | None = None) -> dict[str, Any] | None:
    """The `terminated` state of the pod's (first or named) container, as the kubelet reported it."""
    for status in pod["status"].get("containerStatuses") or []:
        if container is None or status["name"] == container:
            term: dict[str, Any] | None = (status.get("state") or {}).get("terminated")
            return term
    return None


def last_terminated(pod: dict[str, Any], init: bool = False) -> list[dict[str, Any]]:
    """Every container's current or last `terminated` state (init containers with `init`)."""
    key = "initContainerStatuses" if init else "containerStatuses"
    out = []
    for status in pod["status"].get(key) or []:
        term = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get(
            "terminated"
        )
        if term:
            out.append({"container": status["name"], "restarts": status.get("restartCount", 0), **term})
    return out


def pod_report(namespace: str, run: str) -> str:
    """One line per pod of the run: stage, phase, and each container's state (for a failure's message)."""
    lines = []
    try:
        for pod in pods(namespace, **{LABEL_RUN: run}):
            states = [
                f"{s['name']}:{next(iter(s.get('state') or {'?': 0}))}(restarts {s.get('restartCount', 0)})"
                for s in (pod["status"].get("initContainerStatuses") or [])
                + (pod["status"].get("containerStatuses") or [])
            ]
            labels = pod["metadata"].get("labels") or {}
            lines.append(
                f"  {pod['metadata']['name']} [{labels.get(LABEL_STAGE)}] {pod['status'].get('phase')} "
                f"{' '.join(states)}"
            )
    except RuntimeError as err:
        lines.append(f"  (pods not listed: {err})")
    return "pods:\n" + "\n".join(lines)


def operator_pods() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = node.kubectl_json(
        "get", "pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=eagle3-operator"
    )["items"]
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


def operator_probe(pod: dict[str, Any], port: int = 8080) -> dict[str, Any] | None:
    """The peering probe of the operator pod's /healthz (its identity, role, and who holds the Lease), read
    from the host through the pod's IP; None while it does not answer."""
    ip = pod["status"].get("podIP")
    if not ip:
        return None
    try:
        found = httpx.get(f"http://{ip}:{port}/healthz", timeout=3.0).json()
    except (httpx.HTTPError, ValueError):
        return None
    probe: dict[str, Any] | None = found.get("peering")
    return probe


def operator_role(pod: dict[str, Any], port: int = 8080) -> str | None:
    """What the operator pod's /healthz says it is (active, standby, starting); None while it does not
    answer."""
    role: str | None = (operator_probe(pod, port) or {}).get("role")
    return role


def roles() -> dict[str, str | None]:
    return {p["metadata"]["name"]: operator_role(p) for p in operator_pods()}


def any_of(items: Iterable[Any]) -> Any:
    return next(iter(items), None)

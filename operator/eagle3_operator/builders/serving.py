"""The vLLM speculative-decoding Deployment, its Service and its PodMonitor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eagle3_contract.api.spec import DEFAULT_PIPELINE_IMAGE, DEFAULT_VLLM_IMAGE, Eagle3RunSpec
from eagle3_contract.api.speculation import SpeculationRange, tuned_speculative_config
from eagle3_contract.estimates import vllm_pod_gpus
from eagle3_contract.mounts import DRAFT_WEIGHTS, draft_path
from eagle3_contract.stages import on_cpu
from eagle3_contract.vllm_command import Endpoint, VllmEngine, draft_speculative_config, vllm_serve_args
from eagle3_operator.builders import names
from eagle3_operator.builders.capture import (
    ANNOTATION_CAPTURE,
    capture_container,
    capture_dir_container,
    capture_hash,
    capture_volumes,
)
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.pod import (
    PodShape,
    container_resources,
    default_vllm_resources,
    env,
    home_env,
    pod_spec,
    pod_template,
    volume_mounts,
)

PORT = 8000
PORT_NAME = "http"
CONTAINER = "vllm"
DRAFT_CHECK_CONTAINER = "check-draft"
# `/bin/sh -c SCRIPT check-draft SHA256 PATH`: $1 the digest, $2 the weights (no variable of the environment;
# the tools by absolute path: coreutils' sha256sum is /usr/bin/sha256sum in the Debian and Ubuntu images)
DRAFT_CHECK_SHELL = "/bin/sh"
DRAFT_CHECK_SCRIPT = 'echo "$1  $2" | /usr/bin/sha256sum -c -'
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
STARTUP_PERIOD_SECONDS = 10
# Big verifiers take long to download and load: up to an hour before the first /health.
STARTUP_FAILURE_THRESHOLD = 360
# A rollout waits out the startup probe before the Deployment reports ProgressDeadlineExceeded.
PROGRESS_DEADLINE_SECONDS = STARTUP_PERIOD_SECONDS * STARTUP_FAILURE_THRESHOLD + 600
# vLLM's CPU backend reserves this many GiB of KV cache (else far more than a small node has): the value the
# pipeline's evaluate server runs with (eagle3_pipeline.serving.vllm_server.SERVER_ENV_DEFAULTS), so serving
# measures as evaluated.
CPU_KVCACHE_SPACE_GIB = "1"


def serving_selector(run: RunRef) -> dict[str, str]:
    """The labels selecting a run's vLLM pods (Deployment, Service and PodMonitor agree on them)."""
    return {
        names.LABEL_RUN: names.labels(run.name, names.SERVE_STAGE)[names.LABEL_RUN],
        names.LABEL_STAGE: names.SERVE_STAGE,
    }


def serving_gpus(spec: Eagle3RunSpec) -> int:
    """GPUs of one vLLM pod (the contract's figure, which the run's estimates count too)."""
    return vllm_pod_gpus(spec)


def vllm_image(spec: Eagle3RunSpec) -> str:
    """serving.image, else images.vllm (the operator's --vllm-image fills it for GPU runs); unset, on the CPU
    backend the pipeline image (its CPU build holds vLLM's CPU build), else the official GPU image."""
    if spec.serving.image:
        return spec.serving.image
    if spec.images.vllm:
        return spec.images.vllm
    if on_cpu(spec):
        return spec.images.pipeline or DEFAULT_PIPELINE_IMAGE
    return DEFAULT_VLLM_IMAGE


def speculative_config(
    spec: Eagle3RunSpec, draft_dir: str, schedule: Sequence[SpeculationRange] = ()
) -> dict[str, Any]:
    """The speculative config of the spec's draft.method at serving.numSpeculativeTokens; with
    serving.speculationLength tuned and a measured `schedule` (the draft's sweep), k per batch-size range as
    vLLM's num_speculative_tokens_per_batch_size (eagle3_contract.api.speculation)."""
    base = draft_speculative_config(
        draft_path(draft_dir), spec.serving.num_speculative_tokens, spec.draft.method
    )
    if spec.serving.speculation_length == "tuned" and schedule:
        return tuned_speculative_config(base, schedule)
    return base


def vllm_args(spec: Eagle3RunSpec, draft_dir: str, schedule: Sequence[SpeculationRange] = ()) -> list[str]:
    """`vllm serve` arguments: the verifier, its engine options and the EAGLE-3 draft (the contract's one
    command builder, as evaluate measured it), then `serving.extraArgs`. On the CPU backend eagerly, as the
    pipeline's servers run without an accelerator."""
    return vllm_serve_args(
        VllmEngine.of(spec.verifier),
        Endpoint(host="0.0.0.0", port=PORT),
        speculative_config=speculative_config(spec, draft_dir, schedule),
        enforce_eager=on_cpu(spec),
        extra_args=spec.serving.extra_args,
    )


def vllm_env(run: RunRef, spec: Eagle3RunSpec) -> list[dict[str, Any]]:
    """The run's variables, a non-root home for vLLM's caches and, on the CPU backend, its KV cache size."""
    cpu = [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": CPU_KVCACHE_SPACE_GIB}] if on_cpu(spec) else []
    return env(run, spec, names.SERVE_STAGE) + home_env() + cpu


def _probe(period: int, failures: int | None = None) -> dict[str, Any]:
    probe: dict[str, Any] = {"httpGet": {"path": HEALTH_PATH, "port": PORT_NAME}, "periodSeconds": period}
    if failures is not None:
        probe["failureThreshold"] = failures
    return probe


def vllm_container(
    run: RunRef,
    spec: Eagle3RunSpec,
    draft_dir: str,
    shape: PodShape,
    schedule: Sequence[SpeculationRange] = (),
) -> dict[str, Any]:
    return {
        "name": CONTAINER,
        "image": vllm_image(spec),
        "command": ["vllm", "serve"],
        "args": vllm_args(spec, draft_dir, schedule),
        "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
        "startupProbe": _probe(STARTUP_PERIOD_SECONDS, STARTUP_FAILURE_THRESHOLD),
        "readinessProbe": _probe(10),
        "livenessProbe": _probe(30, 5),
        "env": vllm_env(run, spec),
        "resources": container_resources(
            spec, spec.serving.resources or default_vllm_resources(spec), shape.gpus
        ),
        "volumeMounts": volume_mounts(shape),
        # a crash-looping vLLM's last log lines reach the pod status, and the run's (serving.blockedBy)
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def draft_check_container(
    spec: Eagle3RunSpec, draft_dir: str, sha256: str, shape: PodShape
) -> dict[str, Any]:
    """An init container that refuses to start vLLM unless the draft's weights still have `sha256`.

    The second guard after the verify stage: a draft whose files change on the volume after it was verified
    (or exported) never serves from a new pod; the pods of the previous ReplicaSet keep serving. It runs in
    the vLLM image (pulled for the pod anyway). The digest and the path are the shell's positional
    arguments, set by the operator: data, not code. spec.pod.env does not reach it (a user's
    EAGLE3_DRAFT_SHA256 and EAGLE3_DRAFT_WEIGHTS once made it check /dev/null; a PATH or LD_PRELOAD into the
    artifacts volume could replace sha256sum), and it calls its tools by absolute path.
    """
    weights = f"{draft_path(draft_dir)}/{DRAFT_WEIGHTS}"
    return {
        "name": DRAFT_CHECK_CONTAINER,
        "image": vllm_image(spec),
        "command": [DRAFT_CHECK_SHELL, "-c", DRAFT_CHECK_SCRIPT, DRAFT_CHECK_CONTAINER, sha256, weights],
        "volumeMounts": volume_mounts(shape),  # vLLM's: the draft is where vLLM will read it
        "terminationMessagePolicy": "FallbackToLogsOnError",  # sha256sum's "FAILED" line
    }


def deployment_spec(
    run: RunRef,
    spec: Eagle3RunSpec,
    draft_dir: str,
    sha256: str | None = None,
    schedule: Sequence[SpeculationRange] = (),
) -> dict[str, Any]:
    shape = PodShape(names.SERVE_STAGE, serving_gpus(spec), uses_vllm=True, serving=True)
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(PORT),
        "prometheus.io/path": METRICS_PATH,
        names.ANNOTATION_DRAFT: draft_dir,
    }
    init = [draft_check_container(spec, draft_dir, sha256, shape)] if sha256 is not None else []
    container = vllm_container(run, spec, draft_dir, shape, schedule)
    capture = spec.serving.capture
    if capture is not None:  # serving.capture: the middleware, its package and the claim's capture/
        container = capture_container(container, capture)
        init.append(capture_dir_container(vllm_image(spec)))
        annotations[ANNOTATION_CAPTURE] = capture_hash()
    pod = pod_spec(run, spec, shape, container, init)
    if capture is not None:
        pod["volumes"] = capture_volumes(pod["volumes"], run)
    template = pod_template(spec, names.labels(run.name, names.SERVE_STAGE), pod, annotations)
    return {
        "replicas": spec.serving.replicas,
        "selector": {"matchLabels": serving_selector(run)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS,
        "template": template,
    }


def build_deployment(
    run: RunRef,
    spec: Eagle3RunSpec,
    draft_dir: str,
    sha256: str | None = None,
    schedule: Sequence[SpeculationRange] = (),
) -> dict[str, Any]:
    """vLLM serving the verifier with the draft; `eagle3.dev/spec-hash` hashes the Deployment's spec.

    With the draft's `sha256` (pinned in git or computed by export), an init container checks the weights
    before vLLM starts; with serving.speculationLength tuned, `schedule` is the draft's measured k per
    batch-size range."""
    body = deployment_spec(run, spec, draft_dir, sha256, schedule)
    annotations = names.applied(body)
    name = names.serving_name(run.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": names.metadata(run, name, names.SERVE_STAGE, annotations=annotations),
        "spec": body,
    }


def build_canary_deployment(
    run: RunRef,
    spec: Eagle3RunSpec,
    draft_dir: str,
    sha256: str | None = None,
    schedule: Sequence[SpeculationRange] = (),
) -> dict[str, Any]:
    """serving.canary: the new draft's vLLM next to the serving Deployment, built as it (image, args,
    resources, pod settings) with serving.canary.replicas replicas and `eagle3.dev/track: canary` on its pods
    and in its selector. Its pods keep the labels the run's Service selects, so the Service splits the
    traffic by replica count."""
    canary = spec.serving.canary
    body = deployment_spec(run, spec, draft_dir, sha256, schedule)
    track = {names.LABEL_TRACK: names.TRACK_CANARY}
    body["replicas"] = canary.replicas if canary is not None else 1
    body["selector"] = {"matchLabels": serving_selector(run) | track}
    template_meta = body["template"]["metadata"]
    template_meta["labels"] = dict(template_meta["labels"]) | track
    annotations = names.applied(body)
    meta = names.metadata(
        run, names.canary_name(run.name), names.SERVE_STAGE, labels=track, annotations=annotations
    )
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": body}


def build_service(run: RunRef) -> dict[str, Any]:
    """A ClusterIP Service in front of the run's vLLM pods (`eagle3.dev/spec-hash` hashes its spec)."""
    port = {"name": PORT_NAME, "port": PORT, "targetPort": PORT_NAME, "protocol": "TCP"}
    spec = {"type": "ClusterIP", "selector": serving_selector(run), "ports": [port]}
    return hashed_child(run, "v1", "Service", spec)


def pod_label(label: str) -> str:
    """A pod label as service discovery names it: `eagle3.dev/run` is `..._pod_label_eagle3_dev_run`."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in label)


def pod_monitor_relabelings() -> list[dict[str, Any]]:
    """vLLM's series get `namespace` and `run`: the labels the dashboard, alerts and operator series use."""
    return [
        {"action": "replace", "sourceLabels": [pod_label(names.LABEL_RUN)], "targetLabel": "run"},
        {"action": "replace", "sourceLabels": ["__meta_kubernetes_namespace"], "targetLabel": "namespace"},
    ]


def track_relabelings() -> list[dict[str, Any]]:
    """`track`: `stable`, or the pod's `eagle3.dev/track` label where it has one (the canary's pods): the
    incumbent's series read track="stable" with no change to its pods."""
    return [
        {"action": "replace", "targetLabel": "track", "replacement": names.TRACK_STABLE},
        {
            "action": "replace",
            "sourceLabels": [pod_label(names.LABEL_TRACK)],
            "regex": "(.+)",
            "targetLabel": "track",
            "replacement": "$1",
        },
    ]


def build_pod_monitor(run: RunRef, spec: Eagle3RunSpec) -> dict[str, Any]:
    """A Prometheus Operator PodMonitor scraping vLLM's /metrics, labelling its series with the run and the
    track (stable or canary); it carries spec.monitoring.podMonitorLabels (the label a Prometheus selects
    PodMonitors by)."""
    endpoint = {
        "port": PORT_NAME,
        "path": METRICS_PATH,
        "interval": "15s",
        "relabelings": [*pod_monitor_relabelings(), *track_relabelings()],
    }
    body = {"selector": {"matchLabels": serving_selector(run)}, "podMetricsEndpoints": [endpoint]}
    return hashed_child(
        run, "monitoring.coreos.com/v1", "PodMonitor", body, spec.monitoring.pod_monitor_labels
    )


def hashed_child(
    run: RunRef, api_version: str, kind: str, spec: dict[str, Any], labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A serving child whose `eagle3.dev/spec-hash` lets the planner patch it when this builder changes
    (an operator upgrade), as it does the Deployment. Extra `labels` go under the operator's own (which
    win) and into the hash, so a change of them is patched too."""
    meta = names.metadata(run, names.serving_name(run.name), names.SERVE_STAGE)
    return with_labels(api_version, kind, meta, spec, labels or {})


def with_labels(
    api_version: str, kind: str, meta: dict[str, Any], spec: dict[str, Any], labels: Mapping[str, str]
) -> dict[str, Any]:
    """An object of `meta` and `spec` with extra `labels` under meta's own (which win); its
    `eagle3.dev/spec-hash` hashes the spec and the extra labels (the spec alone when there are none)."""
    hashed: dict[str, Any] = {"labels": dict(labels), "spec": spec} if labels else spec
    annotations = dict(meta.get("annotations") or {}) | names.applied(hashed)
    own = {"labels": dict(labels) | meta["labels"], "annotations": annotations}
    rest = {k: v for k, v in meta.items() if k not in ("name", "namespace", *own)}
    out = {"name": meta["name"], "namespace": meta["namespace"], **own, **rest}
    return {"apiVersion": api_version, "kind": kind, "metadata": out, "spec": spec}


def serving_url(run: RunRef) -> str:
    """The in-cluster URL of the run's OpenAI-compatible endpoint."""
    return f"http://{names.serving_name(run.name)}.{run.namespace}.svc:{PORT}"

"""The operator's defaults for runs: what its command line (the chart's values) fills into a spec that leaves
it unset, so the planner, the builders and the stage programs read one complete document."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OperatorDefaults:
    """`eagle3 operator --pipeline-image/--pipeline-cpu-image/--image-pull-secret/--pod-monitor-label`.

    `pipeline_image` fills spec.images.pipeline of GPU runs, `pipeline_cpu_image` that of runs with
    nodePool.device cpu (else `pipeline_image`); `vllm_image` fills spec.images.vllm of GPU runs (a CPU run
    serves with its pipeline image); `image_pull_secrets` fill spec.pod.imagePullSecrets when the
    run names none; `pod_monitor_labels` go under spec.monitoring.podMonitorLabels (the run's own win);
    `prometheus_url` fills spec.serving.canary.prometheusUrl of a run with a canary that names none;
    `pod_security_minimum_level` is the Pod Security level below which a run's pods are refused.
    """

    pipeline_image: str | None = None
    pipeline_cpu_image: str | None = None
    vllm_image: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    pod_monitor_labels: Mapping[str, str] = field(default_factory=dict)
    prometheus_url: str | None = None
    # `--pod-security-minimum-level` (the chart's podSecurity.minimumLevel): a policy, not a default. A run
    # whose spec.pod takes its pods below it is refused: the operator's service account creates the pods,
    # so whoever may create an Eagle3Run must not get pods its own rights would not allow. Never per run.
    pod_security_minimum_level: str = "restricted"


def _section(spec: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = spec.get(key)
    return dict(value) if isinstance(value, Mapping) else {}


def with_operator_defaults(spec: Any, defaults: OperatorDefaults) -> Any:
    """The spec with the operator's defaults where it leaves them unset (a copy; a non-mapping as given)."""
    if not isinstance(spec, Mapping):
        return spec
    out = dict(spec)
    cpu = _section(spec, "nodePool").get("device") == "cpu"
    image = (defaults.pipeline_cpu_image or defaults.pipeline_image) if cpu else defaults.pipeline_image
    images = _section(spec, "images")
    if image and not images.get("pipeline"):
        images["pipeline"] = image
    if defaults.vllm_image and not cpu and not images.get("vllm"):
        images["vllm"] = defaults.vllm_image
    if images != _section(spec, "images"):
        out["images"] = images
    pod = _section(spec, "pod")
    if defaults.image_pull_secrets and not pod.get("imagePullSecrets"):
        out["pod"] = pod | {"imagePullSecrets": [{"name": n} for n in defaults.image_pull_secrets]}
    if defaults.pod_monitor_labels:
        monitoring = _section(spec, "monitoring")
        own = monitoring.get("podMonitorLabels")
        labels = dict(defaults.pod_monitor_labels) | (dict(own) if isinstance(own, Mapping) else {})
        out["monitoring"] = monitoring | {"podMonitorLabels": labels}
    serving = _section(spec, "serving")
    canary = _section(serving, "canary")
    if (
        defaults.prometheus_url
        and isinstance(serving.get("canary"), Mapping)
        and not canary.get("prometheusUrl")
    ):
        out["serving"] = serving | {"canary": canary | {"prometheusUrl": defaults.prometheus_url}}
    return spec if out == spec else out

"""The PodMonitor of a run's stage pods: their progress metrics (eagle3_contract.stage_metrics) in
Prometheus."""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.stage_metrics import METRICS_PATH, METRICS_PORT_NAME
from eagle3_contract.stages import Stage
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.serving import pod_label, pod_monitor_relabelings, with_labels

POD_MONITOR_API = "monitoring.coreos.com/v1"
# A stage's figures move per step or per row: a slower scrape than vLLM's is plenty for a panel of hours.
STAGE_SCRAPE_INTERVAL = "30s"


def stage_relabelings() -> list[dict[str, Any]]:
    """The serving relabelings (`namespace`, `run`) plus `stage`, from the pod's `eagle3.dev/stage` label."""
    stage = {"action": "replace", "sourceLabels": [pod_label(names.LABEL_STAGE)], "targetLabel": "stage"}
    return [*pod_monitor_relabelings(), stage]


def build_stage_pod_monitor(run: RunRef, spec: Eagle3RunSpec) -> dict[str, Any]:
    """A Prometheus Operator PodMonitor scraping every stage pod of the run on its `metrics` port (the
    producers and vLLM have their own ports and monitors: the selector names the stages). It carries
    spec.monitoring.podMonitorLabels under the operator's own labels."""
    endpoint = {
        "port": METRICS_PORT_NAME,
        "path": METRICS_PATH,
        "interval": STAGE_SCRAPE_INTERVAL,
        "relabelings": stage_relabelings(),
    }
    selector = {
        "matchLabels": {names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_RUN: names.run_label(run.name)},
        "matchExpressions": [
            {"key": names.LABEL_STAGE, "operator": "In", "values": [stage.value for stage in Stage]}
        ],
    }
    body = {"selector": selector, "podMetricsEndpoints": [endpoint]}
    meta = names.metadata(run, names.stage_monitor_name(run.name), names.STAGES_MONITOR)
    return with_labels(POD_MONITOR_API, "PodMonitor", meta, body, spec.monitoring.pod_monitor_labels)

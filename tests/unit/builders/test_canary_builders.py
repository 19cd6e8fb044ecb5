"""serving.canary's Deployment, the PodMonitor's `track` label, and serving.speculationLength tuned's args."""

from __future__ import annotations

import json
import re
from typing import Any

from eagle3_contract.api.speculation import SCHEDULE_KEY, SpeculationRange
from eagle3_contract.api.validation import parse_spec
from eagle3_operator.builders import names
from eagle3_operator.builders.serving import (
    build_canary_deployment,
    build_deployment,
    build_pod_monitor,
    build_service,
    pod_label,
)
from tests.unit.builders.builder_cases import TINY_RUN, TINY_SPEC

DRAFT = "export/new"
CANARY = {"replicas": 2, "duration": "10m", "minRequests": 50}
SCHEDULE = [
    SpeculationRange(
        min_batch_size=1, max_batch_size=2, num_speculative_tokens=3, concurrency=1, speedup=1.8
    ),
    SpeculationRange(min_batch_size=3, max_batch_size=8, num_speculative_tokens=0, concurrency=4),
]


def spec(**serving: Any) -> Any:
    return parse_spec(TINY_SPEC | {"serving": {"speculationLength": "fixed", "canary": CANARY} | serving})


def speculative_config(deployment: dict[str, Any]) -> dict[str, Any]:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    config: dict[str, Any] = json.loads(args[args.index("--speculative-config") + 1])
    return config


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_canary_is_the_serving_deployment_with_its_replicas_and_the_canary_track() -> None:
    serving = build_deployment(TINY_RUN, spec(), DRAFT, "ab" * 32)
    canary = build_canary_deployment(TINY_RUN, spec(), DRAFT, "ab" * 32)
    assert canary["metadata"]["name"] == names.canary_name(TINY_RUN.name) == "tiny-vllm-canary"
    assert canary["metadata"]["labels"][names.LABEL_TRACK] == names.TRACK_CANARY
    assert canary["spec"]["replicas"] == 2
    pod_labels = canary["spec"]["template"]["metadata"]["labels"]
    assert matches(canary["spec"]["selector"]["matchLabels"], pod_labels)
    assert canary["spec"]["selector"]["matchLabels"][names.LABEL_TRACK] == names.TRACK_CANARY
    # the Service (and the PodMonitor) select its pods too: the traffic splits by replica count
    assert matches(build_service(TINY_RUN)["spec"]["selector"], pod_labels)
    assert matches(build_pod_monitor(TINY_RUN, spec())["spec"]["selector"]["matchLabels"], pod_labels)
    # the incumbent's selector does not change (immutable) and does not pick the canary's pods' track up
    assert names.LABEL_TRACK not in serving["spec"]["selector"]["matchLabels"]
    # same pods otherwise: image, args, resources, init container, pod settings
    assert canary["spec"]["template"]["spec"] == serving["spec"]["template"]["spec"]
    assert canary["metadata"]["annotations"] != serving["metadata"]["annotations"]  # its own spec hash


def relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str]:
    """Prometheus's `replace` relabeling (the defaults: regex (.*), separator ';', replacement $1)."""
    out = dict(labels)
    for rule in rules:
        value = ";".join(out.get(s, "") for s in rule.get("sourceLabels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if rule.get("action", "replace") == "replace" and match:
            out[rule["targetLabel"]] = match.expand(rule.get("replacement", "$1").replace("$1", r"\1"))
    return out


def test_the_pod_monitor_labels_the_canary_canary_and_the_incumbent_stable() -> None:
    rules = build_pod_monitor(TINY_RUN, spec())["spec"]["podMetricsEndpoints"][0]["relabelings"]
    meta = {pod_label(names.LABEL_RUN): "tiny", "__meta_kubernetes_namespace": "eagle3"}
    incumbent = relabel(rules, meta)
    canary = relabel(rules, meta | {pod_label(names.LABEL_TRACK): names.TRACK_CANARY})
    assert (incumbent["track"], canary["track"]) == ("stable", "canary")
    assert incumbent["run"] == canary["run"] == "tiny" and canary["namespace"] == "eagle3"


def test_tuned_serves_the_schedule_as_vllms_per_batch_size_argument() -> None:
    tuned = speculative_config(
        build_deployment(TINY_RUN, spec(speculationLength="tuned"), DRAFT, None, SCHEDULE)
    )
    assert tuned[SCHEDULE_KEY] == [[1, 2, 3], [3, 8, 0]]
    assert tuned["num_speculative_tokens"] == 3 and tuned["method"] == "eagle3"
    canary = build_canary_deployment(TINY_RUN, spec(speculationLength="tuned"), DRAFT, None, SCHEDULE)
    assert speculative_config(canary) == tuned


def test_fixed_or_no_schedule_serves_num_speculative_tokens() -> None:
    fixed = speculative_config(
        build_deployment(TINY_RUN, spec(numSpeculativeTokens=2), DRAFT, None, SCHEDULE)
    )
    assert SCHEDULE_KEY not in fixed and fixed["num_speculative_tokens"] == 2
    bare = speculative_config(build_deployment(TINY_RUN, spec(speculationLength="tuned"), DRAFT))
    assert SCHEDULE_KEY not in bare

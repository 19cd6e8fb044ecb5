"""The operator's defaults for runs (`eagle3 operator --pipeline-image`, `--pipeline-cpu-image`,
`--image-pull-secret`, `--pod-monitor-label`): filled only where a run leaves them unset, still valid."""

from __future__ import annotations

import copy

import pytest

from eagle3_contract.api.defaults import OperatorDefaults, with_operator_defaults
from eagle3_contract.api.validation import parse_spec

BASE = {"verifier": {"model": "m"}, "dataset": {"source": "d"}}
DEFAULTS = OperatorDefaults(
    pipeline_image="reg.internal/ml/pipeline:2",
    pipeline_cpu_image="reg.internal/ml/pipeline:2-cpu",
    vllm_image="reg.internal/ml/vllm/vllm-openai:v0.32.0",
    image_pull_secrets=("regcred",),
    pod_monitor_labels={"release": "kube-prometheus-stack", "team": "ml"},
)


def test_an_empty_run_gets_every_default_and_stays_valid() -> None:
    filled = with_operator_defaults(BASE, DEFAULTS)
    spec = parse_spec(filled)
    assert spec.images.pipeline == "reg.internal/ml/pipeline:2"
    assert spec.images.vllm == "reg.internal/ml/vllm/vllm-openai:v0.32.0"
    assert [s.name for s in spec.pod.image_pull_secrets] == ["regcred"]
    assert spec.monitoring.pod_monitor_labels == {"release": "kube-prometheus-stack", "team": "ml"}
    assert "images" not in BASE and "pod" not in BASE  # a copy: the run's body is not changed


def test_a_cpu_run_gets_the_cpu_image_else_the_gpu_one() -> None:
    cpu = {**BASE, "nodePool": {"device": "cpu"}}
    assert with_operator_defaults(cpu, DEFAULTS)["images"] == {"pipeline": "reg.internal/ml/pipeline:2-cpu"}
    only_gpu = OperatorDefaults(pipeline_image="reg.internal/ml/pipeline:2")
    assert with_operator_defaults(cpu, only_gpu)["images"]["pipeline"] == "reg.internal/ml/pipeline:2"


def test_what_the_run_names_wins() -> None:
    own = {
        **BASE,
        "images": {"pipeline": "mine:1", "vllm": "mine/vllm:1"},
        "pod": {"imagePullSecrets": [{"name": "own-secret"}], "labels": {"a": "b"}},
        "monitoring": {"podMonitorLabels": {"release": "other"}},
    }
    before = copy.deepcopy(own)
    filled = with_operator_defaults(own, DEFAULTS)
    assert filled["images"] == {"pipeline": "mine:1", "vllm": "mine/vllm:1"}
    assert filled["pod"] == {"imagePullSecrets": [{"name": "own-secret"}], "labels": {"a": "b"}}
    # labels merge: the run's own value of a key wins, the operator's other keys are added
    assert filled["monitoring"]["podMonitorLabels"] == {"release": "other", "team": "ml"}
    assert own == before


@pytest.mark.parametrize("body", [None, "text", 3])
def test_a_body_that_is_no_mapping_is_returned_as_given(body: object) -> None:
    assert with_operator_defaults(body, DEFAULTS) is body


def test_no_defaults_change_nothing() -> None:
    assert with_operator_defaults(BASE, OperatorDefaults()) is BASE


def test_the_operators_flags_make_the_defaults() -> None:
    from eagle3_cli.main import parser

    args = parser().parse_args(
        [
            "operator",
            "--pipeline-cpu-image=reg/p:1-cpu",
            "--vllm-image=reg/vllm:1",
            "--image-pull-secret=regcred",
            "--image-pull-secret=other",
            "--pod-monitor-label=release=kps",
            "--priority=5",
        ]
    )
    assert args.pipeline_cpu_image == "reg/p:1-cpu" and args.vllm_image == "reg/vllm:1"
    assert args.image_pull_secret == ["regcred", "other"]
    assert dict(args.pod_monitor_label) == {"release": "kps"}
    assert args.priority == 5


def test_a_pod_monitor_label_without_a_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from eagle3_cli.main import parser

    with pytest.raises(SystemExit):
        parser().parse_args(["operator", "--pod-monitor-label=release"])
    assert "is not KEY=VALUE" in capsys.readouterr().err

"""One image scheme for the operator and the stage Jobs: [registry/]repository:tag or @digest,
global.imageRegistry, pull secrets; and, end to end, that an air-gapped install's stage pods pull from the
private registry with the secret: the rendered operator's own flags, read by `eagle3`'s parser, fed through
the operator's defaults and builders for the tiny example."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_cli.main import parser as cli_parser
from eagle3_contract.api.defaults import OperatorDefaults, with_operator_defaults
from eagle3_contract.api.validation import parse_spec
from eagle3_contract.stages import plan_stages
from eagle3_operator.builders import build_job
from eagle3_operator.builders.names import RunRef, spec_configmap_name
from eagle3_operator.builders.serving import build_deployment
from tests.chart.helm import ROOT, SCENARIOS, VALUES, only, operator_container, template

Rendered = dict[str, list[dict[str, Any]]]

MIRROR = "registry.example.internal:5000/ml"
PRIVATE = yaml.safe_load((VALUES / "private-registry.yaml").read_text())
DIGEST = "sha256:" + "ab" * 32


def operator_args(docs: list[dict[str, Any]]) -> argparse.Namespace:
    """The rendered operator container's args, parsed by `eagle3`'s own command line."""
    return cli_parser().parse_args(operator_container(docs)["args"])


def defaults_of(args: argparse.Namespace) -> OperatorDefaults:
    """What `eagle3 operator` makes of its flags (eagle3_operator.commands)."""
    return OperatorDefaults(
        pipeline_image=args.pipeline_image,
        pipeline_cpu_image=args.pipeline_cpu_image,
        vllm_image=args.vllm_image,
        image_pull_secrets=tuple(args.image_pull_secret),
        pod_monitor_labels=dict(args.pod_monitor_label),
    )


def images(helm: Path, *sets: str) -> tuple[str, str, str]:
    """(operator image, --pipeline-image, --pipeline-cpu-image) rendered with `sets`."""
    docs = template(helm, sets=sets)
    args = operator_args(docs)
    return operator_container(docs)["image"], args.pipeline_image, args.pipeline_cpu_image


def test_default_images_are_the_apps_version(helm: Path) -> None:
    assert images(helm) == (
        "eagle3-operator:0.1.0",
        "eagle3-operator/pipeline:0.1.0",
        "eagle3-operator/pipeline:0.1.0-cpu",
    )


def test_global_registry_prefixes_every_image_and_an_images_own_registry_wins(helm: Path) -> None:
    assert images(helm, f"global.imageRegistry={MIRROR}") == (
        f"{MIRROR}/eagle3-operator:0.1.0",
        f"{MIRROR}/eagle3-operator/pipeline:0.1.0",
        f"{MIRROR}/eagle3-operator/pipeline:0.1.0-cpu",
    )
    own = images(helm, f"global.imageRegistry={MIRROR}", "pipelineImage.registry=ghcr.io/acme")
    assert own[0] == f"{MIRROR}/eagle3-operator:0.1.0"
    assert own[1:] == (
        "ghcr.io/acme/eagle3-operator/pipeline:0.1.0",
        "ghcr.io/acme/eagle3-operator/pipeline:0.1.0-cpu",
    )


def test_a_digest_wins_over_the_tag(helm: Path) -> None:
    operator, pipeline, cpu = images(
        helm,
        "image.tag=1.0.0",
        f"image.digest={DIGEST}",
        "pipelineImage.tag=2.0.0",
        f"pipelineCpuImage.digest={DIGEST}",
    )
    assert operator == f"eagle3-operator@{DIGEST}"
    assert pipeline == "eagle3-operator/pipeline:2.0.0"
    assert cpu == f"eagle3-operator/pipeline@{DIGEST}"


def test_the_cpu_image_follows_the_pipeline_image_unless_set(helm: Path) -> None:
    _, _, cpu = images(helm, "pipelineImage.repository=acme/eagle3-pipeline", "pipelineImage.tag=1.2.3")
    assert cpu == "acme/eagle3-pipeline:1.2.3-cpu"
    _, _, cpu = images(
        helm, "pipelineCpuImage.repository=acme/eagle3-pipeline-cpu", "pipelineCpuImage.tag=v7"
    )
    assert cpu == "acme/eagle3-pipeline-cpu:v7"


def test_no_pull_secret_flags_by_default(rendered: Rendered) -> None:
    args = operator_args(rendered["default"])
    assert args.image_pull_secret == [] and args.pod_monitor_label == []
    assert "imagePullSecrets" not in only(rendered["default"], "Deployment")["spec"]["template"]["spec"]


def test_the_private_registry_values_pull_everything_from_the_mirror_with_the_secret(
    rendered: Rendered,
) -> None:
    docs = rendered["private-registry"]
    pod = only(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert operator_container(docs)["image"] == f"{MIRROR}/eagle3-operator@{PRIVATE['image']['digest']}"
    args = operator_args(docs)
    assert args.pipeline_image == f"{MIRROR}/eagle3-pipeline@{PRIVATE['pipelineImage']['digest']}"
    assert args.pipeline_cpu_image == f"{MIRROR}/eagle3-pipeline-cpu@{PRIVATE['pipelineCpuImage']['digest']}"
    assert args.vllm_image == f"{MIRROR}/vllm/vllm-openai@{PRIVATE['vllmImage']['digest']}"
    assert args.image_pull_secret == ["regcred"], "the runs' pods get the operator pod's secret"


def tiny_example(device: str) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "tiny" / "eagle3run.yaml").read_text())["spec"]
    return spec | {"nodePool": dict(spec.get("nodePool") or {}, device=device)}


@pytest.mark.parametrize(("device", "image_flag"), [("cpu", "pipeline_cpu_image"), ("gpu", "pipeline_image")])
def test_the_tiny_examples_stage_pods_pull_from_the_private_registry(
    rendered: Rendered, device: str, image_flag: str
) -> None:
    """Done-criterion of the private registry: the operator's rendered flags, read as the operator does,
    give every stage Job of the tiny example the mirror's image (the CPU variant in CPU mode) and secret."""
    args = operator_args(rendered["private-registry"])
    spec = parse_spec(with_operator_defaults(tiny_example(device), defaults_of(args)))
    run = RunRef(name="tiny", namespace="team-a", uid="00000000-0000-4000-8000-00000000000a")
    plans = plan_stages(spec)
    assert plans, "the tiny example plans no stage"
    for plan in plans:
        job = build_job(run, spec, plan, 0, None, spec_configmap_name(run.name, "0" * 64))
        pod = job["spec"]["template"]["spec"]
        assert pod["imagePullSecrets"] == [{"name": "regcred"}], plan.stage
        images_used = {c["image"] for c in pod["containers"] + pod.get("initContainers", [])}
        assert images_used == {getattr(args, image_flag)}, plan.stage
        assert all(image.startswith(f"{MIRROR}/") for image in images_used)


@pytest.mark.parametrize(("device", "image_flag"), [("cpu", "pipeline_cpu_image"), ("gpu", "vllm_image")])
def test_the_tiny_examples_vllm_pods_pull_from_the_private_registry(
    rendered: Rendered, device: str, image_flag: str
) -> None:
    """The serving Deployment too: vLLM's mirror on GPUs (--vllm-image), the pipeline's CPU image on CPUs,
    the draft check init container from the same image, with the secret."""
    args = operator_args(rendered["private-registry"])
    spec = parse_spec(with_operator_defaults(tiny_example(device), defaults_of(args)))
    run = RunRef(name="tiny", namespace="team-a", uid="00000000-0000-4000-8000-00000000000a")
    pod = build_deployment(run, spec, "export/" + "0" * 12, "ab" * 32)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    images_used = {c["image"] for c in pod["containers"] + pod.get("initContainers", [])}
    assert images_used == {getattr(args, image_flag)} and len(pod["initContainers"]) == 1


def test_a_run_that_names_its_own_image_and_secret_keeps_them(rendered: Rendered) -> None:
    args = operator_args(rendered["private-registry"])
    own = tiny_example("cpu") | {
        "images": {"pipeline": "own/pipeline:9"},
        "pod": {"imagePullSecrets": [{"name": "mine"}]},
    }
    spec = parse_spec(with_operator_defaults(own, defaults_of(args)))
    assert spec.images.pipeline == "own/pipeline:9"
    assert [s.name for s in spec.pod.image_pull_secrets] == ["mine"]


def test_every_scenario_names_images_the_operator_parses(rendered: Rendered) -> None:
    for name in SCENARIOS:
        args = operator_args(rendered[name])
        assert args.pipeline_image and args.pipeline_cpu_image, name

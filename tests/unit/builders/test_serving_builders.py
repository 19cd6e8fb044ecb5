"""The vLLM Deployment, Service and PodMonitor."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from eagle3_contract.api.pods import EnvVar
from eagle3_contract.api.spec import DEFAULT_VLLM_IMAGE
from eagle3_contract.api.validation import parse_spec
from eagle3_contract.mounts import draft_path
from eagle3_contract.stages import content_hash
from eagle3_operator.builders import build_deployment, build_pod_monitor, build_service, names
from eagle3_operator.builders.serving import serving_url
from tests.tiny_spec import derive
from tests.unit.builders.builder_cases import (
    KIMI_RUN,
    KIMI_SPEC,
    TINY_RUN,
    TINY_SPEC,
    draft_dir,
    kimi_spec,
)


def spec_hash_of(deployment: dict[str, Any]) -> str:
    value: str = deployment["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH]
    return value


def vllm(deployment: dict[str, Any]) -> dict[str, Any]:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    out: dict[str, Any] = container
    return out


@pytest.mark.parametrize(
    ("given", "expected"),
    [("export/abc", "/artifacts/export/abc"), ("/drafts/kimi", "/drafts/kimi"), ("d", "/artifacts/d")],
)
def test_draft_path(given: str, expected: str) -> None:
    assert draft_path(given) == expected


def test_spec_hash_annotation_is_the_hash_of_the_spec() -> None:
    deployment = build_deployment(KIMI_RUN, kimi_spec(), "export/a")
    assert spec_hash_of(deployment) == content_hash(deployment["spec"])


def test_new_draft_changes_the_spec_hash_and_a_rebuild_does_not() -> None:
    spec = kimi_spec()
    first = build_deployment(KIMI_RUN, spec, "export/a")
    assert spec_hash_of(build_deployment(KIMI_RUN, kimi_spec(), "export/a")) == spec_hash_of(first)
    second = build_deployment(KIMI_RUN, spec, "export/b")
    assert spec_hash_of(second) != spec_hash_of(first)
    assert second["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_DRAFT] == "export/b"


@pytest.mark.parametrize(
    "edit",
    [
        {"serving": {"replicas": 3}},
        {"serving": {"image": "vllm/vllm-openai:v0.12.0"}},
        {"serving": {"numSpeculativeTokens": 5}},
        {"verifier": {"maxModelLen": 65536}},
    ],
)
def test_serving_edits_change_the_spec_hash(edit: dict[str, Any]) -> None:
    doc = copy.deepcopy(KIMI_SPEC)
    for section, values in edit.items():
        doc[section] = doc.get(section, {}) | values
    before = build_deployment(KIMI_RUN, kimi_spec(), "export/a")
    after = build_deployment(KIMI_RUN, parse_spec(doc), "export/a")
    assert spec_hash_of(after) != spec_hash_of(before)


def test_vllm_command_and_args() -> None:
    container = vllm(build_deployment(KIMI_RUN, kimi_spec(), "export/abc"))
    assert container["command"] == ["vllm", "serve"]
    args = container["args"]
    assert args[:7] == [
        "moonshotai/Kimi-K2.5",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "8",
    ]
    assert args[args.index("--revision") + 1] == KIMI_SPEC["verifier"]["revision"]
    assert "--trust-remote-code" in args
    assert args[args.index("--max-model-len") + 1] == "32768"
    speculative = json.loads(args[args.index("--speculative-config") + 1])
    assert speculative == {"method": "eagle3", "model": "/artifacts/export/abc", "num_speculative_tokens": 4}
    assert args[-3:] == ["--enable-expert-parallel", "--gpu-memory-utilization", "0.92"]
    # the tiny run without its maxModelLen: a flag the spec leaves unset is not passed
    unset = parse_spec(derive(TINY_SPEC, verifier={"maxModelLen": None}))
    tiny = vllm(build_deployment(TINY_RUN, unset, "/drafts/x"))["args"]
    assert not {"--revision", "--trust-remote-code", "--max-model-len"} & set(tiny)
    assert tiny[-2:] == [
        "--speculative-config",
        json.dumps({"method": "eagle3", "model": "/drafts/x", "num_speculative_tokens": 3}, sort_keys=True),
    ]


def test_image_defaults_to_images_vllm() -> None:
    gpu = parse_spec(derive(TINY_SPEC, nodePool={"device": "gpu"}))
    assert vllm(build_deployment(TINY_RUN, gpu, "d"))["image"] == DEFAULT_VLLM_IMAGE
    mirrored = parse_spec(derive(TINY_SPEC, nodePool={"device": "gpu"}, images={"vllm": "mirror/vllm:1"}))
    assert vllm(build_deployment(TINY_RUN, mirrored, "d"))["image"] == "mirror/vllm:1"
    cpu = parse_spec(derive(TINY_SPEC, nodePool={"device": "cpu"}, images={"pipeline": "reg/p:1-cpu"}))
    assert vllm(build_deployment(TINY_RUN, cpu, "d"))["image"] == "reg/p:1-cpu"
    doc = copy.deepcopy(KIMI_SPEC)
    doc["serving"]["image"] = "registry.local/vllm:nightly"
    assert vllm(build_deployment(KIMI_RUN, parse_spec(doc), "d"))["image"] == "registry.local/vllm:nightly"


def test_probes_and_port() -> None:
    container = vllm(build_deployment(KIMI_RUN, kimi_spec(), "d"))
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] == 3600


def test_artifacts_are_read_only_in_serving() -> None:
    deployment = build_deployment(KIMI_RUN, kimi_spec(), "d")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["artifacts"]["persistentVolumeClaim"]["readOnly"] is True
    assert "spec" not in volumes
    mounts = {m["name"]: m for m in vllm(deployment)["volumeMounts"]}
    assert mounts["artifacts"]["readOnly"] is True


SHA = "ab" * 32


def test_a_known_digest_is_checked_by_an_init_container_before_vllm_starts() -> None:
    assert "initContainers" not in build_deployment(KIMI_RUN, kimi_spec(), "d")["spec"]["template"]["spec"]
    deployment = build_deployment(KIMI_RUN, kimi_spec(), "export/abc", SHA)
    pod = deployment["spec"]["template"]["spec"]
    [check] = pod["initContainers"]
    assert check["image"] == vllm(deployment)["image"], "the image the pod pulls anyway"
    weights = "/artifacts/export/abc/model.safetensors"
    script = 'echo "$1  $2" | /usr/bin/sha256sum -c -'
    assert check["command"] == ["/bin/sh", "-c", script, "check-draft", SHA, weights], (
        "the values are arguments, not code; the tools by absolute path"
    )
    assert "env" not in check
    mounts = {m["name"]: m for m in check["volumeMounts"]}
    assert mounts["artifacts"] == {"name": "artifacts", "mountPath": "/artifacts", "readOnly": True}
    assert "resources" not in check, "no GPU: it only reads a file"
    other = build_deployment(KIMI_RUN, kimi_spec(), "export/abc", "cd" * 32)
    assert spec_hash_of(other) != spec_hash_of(deployment), "another digest rolls the pods"


def test_no_variable_of_spec_pod_env_reaches_the_draft_check(tmp_path: Path) -> None:
    """spec.pod.env once reached every container, the check's too: a user's EAGLE3_DRAFT_SHA256 and
    EAGLE3_DRAFT_WEIGHTS pointed it at /dev/null, and (issue 42) a PATH or LD_PRELOAD into the artifacts
    volume could replace sha256sum. The check gets no user variable, and is run here as the pod runs it, with
    a hostile PATH whose sha256sum always passes, on a stand-in for the weights."""
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"the draft as verified")
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sha256sum").write_text("#!/bin/sh\nexit 0\n")
    (fake / "sha256sum").chmod(0o755)
    user = [
        {"name": "EAGLE3_DRAFT_SHA256", "value": hashlib.sha256(b"").hexdigest()},
        {"name": "EAGLE3_DRAFT_WEIGHTS", "value": "/dev/null"},
        {"name": "PATH", "value": str(fake)},
        {"name": "LD_PRELOAD", "value": "/artifacts/evil.so"},
    ]
    # the spec refuses some of these names (issue 28, item 7); set past the check, the check still holds
    variables = [EnvVar.model_validate(v) for v in user]
    spec = kimi_spec().model_copy(update={"pod": kimi_spec().pod.model_copy(update={"env": variables})})
    pod = build_deployment(KIMI_RUN, spec, "export/abc", digest)["spec"]["template"]["spec"]
    [check] = pod["initContainers"]
    assert "env" not in check, "no user variable reaches the check"
    assert {v["name"] for v in vllm({"spec": {"template": {"spec": pod}}})["env"]} >= {"PATH", "LD_PRELOAD"}
    *argv, path = check["command"]
    assert path == "/artifacts/export/abc/model.safetensors"
    env = {"PATH": str(fake)}  # what an image's PATH could be made: the absolute paths do not look there

    def run() -> int:
        return subprocess.run([*argv, str(weights)], env=env, capture_output=True, check=False).returncode

    assert run() == 0, "the weights as verified pass"
    weights.write_bytes(b"the draft replaced on the volume")
    assert run() != 0, "replaced weights fail, whatever PATH finds"


def test_selectors_agree() -> None:
    deployment = build_deployment(KIMI_RUN, kimi_spec(), draft_dir(kimi_spec()))
    service = build_service(KIMI_RUN)
    monitor = build_pod_monitor(KIMI_RUN, kimi_spec())
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {names.LABEL_RUN: "kimi-k2-5", names.LABEL_STAGE: names.SERVE_STAGE}
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["selector"] == selector
    assert monitor["spec"]["selector"]["matchLabels"] == selector
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert {k: endpoint[k] for k in ("port", "path", "interval")} == {
        "port": "http",
        "path": "/metrics",
        "interval": "15s",
    }
    assert {o["metadata"]["name"] for o in (deployment, service, monitor)} == {"kimi-k2-5-vllm"}


def test_serving_url() -> None:
    assert serving_url(KIMI_RUN) == "http://kimi-k2-5-vllm.llm.svc:8000"


def test_the_pod_monitor_labels_vllm_series_with_the_run_and_namespace() -> None:
    """Prometheus sees pod label `eagle3.dev/run` as `__meta_kubernetes_pod_label_eagle3_dev_run`."""
    [endpoint] = build_pod_monitor(KIMI_RUN, kimi_spec())["spec"]["podMetricsEndpoints"]
    targets = {r["targetLabel"]: r.get("sourceLabels") for r in endpoint["relabelings"]}
    assert targets == {
        "run": ["__meta_kubernetes_pod_label_eagle3_dev_run"],
        "namespace": ["__meta_kubernetes_namespace"],
        "track": ["__meta_kubernetes_pod_label_eagle3_dev_track"],  # after a constant `stable` (canary)
    }
    assert all(r["action"] == "replace" for r in endpoint["relabelings"])

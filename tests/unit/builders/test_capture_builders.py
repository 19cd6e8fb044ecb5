"""serving.capture in the vLLM pod: the package from its ConfigMap on PYTHONPATH, the middleware and the
per-request acceptance in vLLM's arguments, capture/ writable and everything else on the claim read-only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import eagle3_contract.capture as package
from eagle3_contract.api.validation import parse_spec
from eagle3_contract.capture.config import CaptureConfig
from eagle3_operator.builders import build_deployment, capture, names
from eagle3_operator.builders.serving import build_canary_deployment
from tests.tiny_spec import derive
from tests.unit.builders.builder_cases import PINNED_SHA256, TINY_RUN, TINY_SPEC

CAPTURE = {"sampleRate": 0.25, "maxBytes": "2Gi", "retention": "48h"}
DRAFT = "export/3f0c2a9d41be"


def pod(serving: dict[str, Any] | None = None, sha256: str | None = PINNED_SHA256) -> dict[str, Any]:
    spec = parse_spec(derive(TINY_SPEC, serving=serving or {"capture": CAPTURE}))
    out: dict[str, Any] = build_deployment(TINY_RUN, spec, DRAFT, sha256)["spec"]["template"]["spec"]
    return out


def test_the_middleware_runs_from_the_configmap_with_the_requests_acceptance() -> None:
    [vllm] = pod()["containers"]
    args = vllm["args"]
    assert args[args.index("--middleware") + 1] == "eagle3_capture.middleware.CaptureMiddleware"
    assert args[args.index("--per-request-spec-decode-metrics") + 1] == "summary"
    env = {e["name"]: e for e in vllm["env"]}
    assert env["PYTHONPATH"]["value"] == capture.CODE_MOUNT
    assert env["EAGLE3_CAPTURE_SOURCE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # what the middleware reads back is what the spec says
    config = CaptureConfig.from_env({k: v["value"] for k, v in env.items() if "value" in v})
    assert (config.sample_rate, config.max_bytes, config.retention_seconds) == (0.25, 2 << 30, 48 * 3600)
    assert str(config.directory) == capture.CAPTURE_MOUNT


def test_only_capture_is_writable_on_the_claim() -> None:
    spec = pod()
    [claim] = [v for v in spec["volumes"] if v["name"] == "artifacts"]
    assert "readOnly" not in claim["persistentVolumeClaim"]  # the mounts decide
    [vllm] = spec["containers"]
    on_claim = [m for m in vllm["volumeMounts"] if m["name"] == "artifacts"]
    assert {(m["mountPath"], m.get("subPath"), m.get("readOnly", False)) for m in on_claim} == {
        ("/artifacts", None, True),
        (capture.CAPTURE_MOUNT, "capture", False),
    }
    without = pod(serving={"replicas": 1})
    [claim] = [v for v in without["volumes"] if v["name"] == "artifacts"]
    assert claim["persistentVolumeClaim"]["readOnly"] is True, "no capture: the claim stays read-only"


def test_capture_dir_is_made_after_the_draft_check_as_the_pods_user() -> None:
    spec = pod()
    assert [c["name"] for c in spec["initContainers"]] == ["check-draft", capture.DIR_CONTAINER]
    made = spec["initContainers"][1]
    assert made["command"] == ["/bin/mkdir", "-p", "/artifacts/capture"]
    assert made["securityContext"]["allowPrivilegeEscalation"] is False and "runAsUser" not in made
    assert spec["securityContext"]["runAsNonRoot"] is True  # the pod's user, the one vLLM runs as


def test_the_package_is_mounted_whole_under_the_name_vllm_loads() -> None:
    [code] = [v for v in pod()["volumes"] if v["name"] == capture.VOLUME_CODE]
    modules = sorted(p.name for p in Path(package.__file__).parent.glob("*.py"))
    assert [i["key"] for i in code["configMap"]["items"]] == modules
    assert {i["path"] for i in code["configMap"]["items"]} == {f"eagle3_capture/{m}" for m in modules}
    configmap = capture.build_capture_configmap(TINY_RUN)
    assert configmap["metadata"]["name"] == code["configMap"]["name"] == names.capture_configmap_name("tiny")
    assert sorted(configmap["data"]) == modules
    assert sum(len(v.encode()) for v in configmap["data"].values()) < 256 * 1024  # far below 1 MiB


def test_the_canary_captures_too() -> None:
    spec = parse_spec(derive(TINY_SPEC, serving={"capture": CAPTURE, "canary": {"replicas": 1}}))
    canary = build_canary_deployment(TINY_RUN, spec, DRAFT, PINNED_SHA256)
    [vllm] = canary["spec"]["template"]["spec"]["containers"]
    assert "eagle3_capture.middleware.CaptureMiddleware" in vllm["args"]

"""Every pod the operator builds passes the Pod Security "restricted" level by default; the checker itself
catches each control it implements (so it cannot pass by checking nothing)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.validation import parse_spec
from eagle3_contract.stages import Stage, plan_stages
from eagle3_operator.builders import build_deployment, build_job
from eagle3_operator.builders.mooncake import build_mooncake_master
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.pod_security import pod_template, restricted_findings, violations
from eagle3_operator.builders.producers import build_producers
from tests.tiny_spec import derive
from tests.unit.builders.builder_cases import (
    KIMI_ONLINE_SPEC,
    KIMI_RUN,
    KIMI_SPEC,
    PINNED_SHA256,
    TINY_RUN,
    TINY_SPEC,
    configmap_name,
    draft_dir,
    plan_of,
)

SPECS: dict[str, tuple[RunRef, dict[str, Any]]] = {
    "tiny": (TINY_RUN, TINY_SPEC),
    "tiny-gpu": (TINY_RUN, derive(TINY_SPEC, nodePool={"device": "gpu"})),
    "tiny-cpu": (TINY_RUN, derive(TINY_SPEC, nodePool={"device": "cpu"})),
    "kimi": (KIMI_RUN, KIMI_SPEC),
    "kimi-online": (KIMI_RUN, KIMI_ONLINE_SPEC),
    "kimi-online-volume": (KIMI_RUN, derive(KIMI_ONLINE_SPEC, extraction={"transfer": "volume"})),
    "pinned": (
        TINY_RUN,
        derive(
            TINY_SPEC, serving={"pinnedCheckpoint": {"path": "export/3f0c2a9d41be", "sha256": PINNED_SHA256}}
        ),
    ),
}


def built_pods(run: RunRef, spec: Eagle3RunSpec) -> dict[str, dict[str, Any]]:
    """Every workload of a run by name: each stage's Job (skipped ones too), vLLM serving with and without
    the draft check, and, online, the producers and the Mooncake master."""
    cm = configmap_name(run, spec)
    out = {f"job/{p.stage.value}": build_job(run, spec, p, 0, None, cm) for p in plan_stages(spec)}
    out["deployment"] = build_deployment(run, spec, draft_dir(spec))
    out["deployment+check"] = build_deployment(run, spec, draft_dir(spec), PINNED_SHA256)
    if spec.extraction.mode == "online":
        train = plan_of(spec, Stage.TRAIN).hash
        out["producers"] = build_producers(run, spec, train, cm)
        out["mooncake"] = build_mooncake_master(run, spec, train)
    return out


@pytest.mark.parametrize("case", sorted(SPECS))
def test_every_built_pod_passes_the_restricted_level(case: str) -> None:
    run, doc = SPECS[case]
    pods = built_pods(run, parse_spec(doc))
    assert "deployment+check" in pods and any(k.startswith("job/") for k in pods)
    found = {name: violations(pod_template(obj)) for name, obj in pods.items()}
    assert {name: v for name, v in found.items() if v} == {}


def test_online_runs_check_the_producers_and_mooncake_too() -> None:
    pods = built_pods(KIMI_RUN, parse_spec(KIMI_ONLINE_SPEC))
    assert {"producers", "mooncake"} <= set(pods)


def test_a_users_security_context_is_merged_over_the_defaults_field_by_field() -> None:
    """Issue 28 item 8: the user's fields win, and every field the user did not touch keeps its restricted
    default (the old builder replaced the whole context and dropped runAsNonRoot, seccomp, drop ALL)."""
    root = {"runAsUser": 1000, "seccompProfile": {"localhostProfile": "p.json", "type": "Localhost"}}
    container = {"readOnlyRootFilesystem": True, "capabilities": {"add": ["NET_BIND_SERVICE"]}}
    spec = parse_spec(derive(TINY_SPEC, pod={"securityContext": root, "containerSecurityContext": container}))
    for name, obj in built_pods(TINY_RUN, spec).items():
        template = pod_template(obj)
        assert template["spec"]["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 65532,
            "fsGroup": 65532,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
        }, name
        for c in template["spec"]["containers"] + template["spec"].get("initContainers", []):
            assert c["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                "readOnlyRootFilesystem": True,
            }, name
        assert violations(template) == [], name
    assert restricted_findings(TINY_RUN, spec, plan_stages(spec)[0]) == ()


def test_a_context_below_the_restricted_level_is_found_and_named_by_its_spec_field() -> None:
    root = {"runAsUser": 0, "runAsNonRoot": False}
    privileged = {"privileged": True, "allowPrivilegeEscalation": True}
    spec = parse_spec(
        derive(TINY_SPEC, pod={"securityContext": root, "containerSecurityContext": privileged})
    )
    for name, obj in built_pods(TINY_RUN, spec).items():
        template = pod_template(obj)
        assert template["spec"]["securityContext"]["runAsNonRoot"] is False, name
        for c in template["spec"]["containers"] + template["spec"].get("initContainers", []):
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, name
        found = violations(template)
        assert "spec.securityContext.runAsNonRoot: must not be false" in found, name
        assert "spec.containers[0].securityContext.privileged: privileged containers are forbidden" in found
    findings = restricted_findings(TINY_RUN, spec, plan_stages(spec)[0])
    assert findings == (
        "spec.pod.containerSecurityContext.privileged: privileged containers are forbidden",
        "spec.pod.securityContext.runAsNonRoot: must not be false",
        "spec.pod.securityContext.runAsUser: must not be 0",
        "spec.pod.containerSecurityContext.allowPrivilegeEscalation: must be false",
        "spec.pod.containerSecurityContext.runAsNonRoot: must be true (here or in spec.pod.securityContext)",
    )


def test_user_0_under_the_default_run_as_non_root_is_named_as_never_starting() -> None:
    """runAsUser 0 alone: merged over runAsNonRoot true, the kubelet refuses every container."""
    spec = parse_spec(derive(TINY_SPEC, pod={"securityContext": {"runAsUser": 0}}))
    findings = restricted_findings(TINY_RUN, spec, plan_stages(spec)[0])
    assert findings[0].startswith(
        "spec.pod.containerSecurityContext: runAsUser 0 with runAsNonRoot true never starts"
    )
    assert "spec.pod.securityContext.runAsUser: must not be 0" in findings


def test_an_apparmor_annotation_of_the_pods_is_found() -> None:
    key = "container.apparmor.security.beta.kubernetes.io/vllm"
    spec = parse_spec(derive(TINY_SPEC, pod={"annotations": {key: "unconfined"}}))
    assert restricted_findings(TINY_RUN, spec, plan_stages(spec)[0]) == (
        f"spec.pod.annotations[{key}]: AppArmor profile 'unconfined' is forbidden",
    )


# --- the checker itself ---------------------------------------------------------------------------------


def restricted_pod() -> dict[str, Any]:
    container = {
        "name": "c",
        "image": "i",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    return {
        "metadata": {},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
            "initContainers": [copy.deepcopy(container)],
            "volumes": [{"name": "v", "emptyDir": {}}],
        },
    }


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change of the pod at a dotted path (list indexes as numbers)."""

    def change(pod: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = pod
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        node[last] = value

    return change


BROKEN: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "privileged": (
        _set("spec.containers.0.securityContext.privileged", True),
        "spec.containers[0].securityContext.privileged",
    ),
    "hostPath": (
        _set("spec.volumes", [{"name": "h", "hostPath": {"path": "/"}}]),
        "spec.volumes[0].hostPath",
    ),
    "missing drop ALL": (
        _set("spec.containers.0.securityContext.capabilities", {"drop": ["NET_RAW"]}),
        "spec.containers[0].securityContext.capabilities.drop",
    ),
    "added capability": (
        _set("spec.initContainers.0.securityContext.capabilities", {"drop": ["ALL"], "add": ["CHOWN"]}),
        "spec.initContainers[0].securityContext.capabilities.add",
    ),
    "hostNetwork": (_set("spec.hostNetwork", True), "spec.hostNetwork"),
    "hostPID": (_set("spec.hostPID", True), "spec.hostPID"),
    "hostIPC": (_set("spec.hostIPC", True), "spec.hostIPC"),
    "hostProcess": (
        _set("spec.securityContext.windowsOptions", {"hostProcess": True}),
        "spec.securityContext.windowsOptions.hostProcess",
    ),
    "hostPort": (
        _set("spec.containers.0.ports", [{"containerPort": 80, "hostPort": 80}]),
        "spec.containers[0].ports[0].hostPort",
    ),
    "AppArmor annotation": (
        _set("metadata.annotations", {"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}),
        "metadata.annotations[container.apparmor.security.beta.kubernetes.io/c]",
    ),
    "AppArmor field": (
        _set("spec.containers.0.securityContext.appArmorProfile", {"type": "Unconfined"}),
        "spec.containers[0].securityContext.appArmorProfile.type",
    ),
    "SELinux type": (
        _set("spec.securityContext.seLinuxOptions", {"type": "spc_t"}),
        "spec.securityContext.seLinuxOptions.type",
    ),
    "SELinux user": (
        _set("spec.containers.0.securityContext.seLinuxOptions", {"user": "system_u"}),
        "spec.containers[0].securityContext.seLinuxOptions.user",
    ),
    "procMount": (
        _set("spec.containers.0.securityContext.procMount", "Unmasked"),
        "spec.containers[0].securityContext.procMount",
    ),
    "sysctl": (
        _set("spec.securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}]),
        "spec.securityContext.sysctls[0].name",
    ),
    "unconfined seccomp": (
        _set("spec.securityContext.seccompProfile", {"type": "Unconfined"}),
        "spec.securityContext.seccompProfile.type",
    ),
    "no seccomp": (
        _set("spec.securityContext.seccompProfile", None),
        "spec.containers[0].securityContext.seccompProfile.type",
    ),
    "nfs volume": (
        _set("spec.volumes", [{"name": "n", "nfs": {"server": "s", "path": "/"}}]),
        "spec.volumes[0]",
    ),
    "privilege escalation unset": (
        _set("spec.initContainers.0.securityContext.allowPrivilegeEscalation", None),
        "spec.initContainers[0].securityContext.allowPrivilegeEscalation",
    ),
    "runAsNonRoot unset": (
        _set("spec.securityContext.runAsNonRoot", None),
        "spec.containers[0].securityContext.runAsNonRoot",
    ),
    "container runs as root": (
        _set("spec.containers.0.securityContext.runAsUser", 0),
        "spec.containers[0].securityContext.runAsUser",
    ),
    "pod runs as root": (_set("spec.securityContext.runAsUser", 0), "spec.securityContext.runAsUser"),
    "ephemeral container": (
        _set("spec.ephemeralContainers", [{"name": "debug", "image": "busybox"}]),
        "spec.ephemeralContainers[0].securityContext.allowPrivilegeEscalation",
    ),
}


def _drop_nones(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _drop_nones(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_drop_nones(v) for v in node]
    return node


def test_the_checker_passes_a_restricted_pod() -> None:
    assert violations(restricted_pod()) == []


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_the_checker_names_the_field_that_breaks_the_level(case: str) -> None:
    change, field = BROKEN[case]
    pod = restricted_pod()
    change(pod)
    found = violations(_drop_nones(pod))
    assert any(v.startswith(field + ":") for v in found), found


def test_the_checker_allows_what_the_level_allows() -> None:
    pod = restricted_pod()
    spec = pod["spec"]
    spec["containers"][0]["securityContext"]["capabilities"]["add"] = ["NET_BIND_SERVICE"]
    spec["containers"][0]["securityContext"]["seccompProfile"] = {
        "type": "Localhost",
        "localhostProfile": "p",
    }
    spec["securityContext"]["sysctls"] = [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]
    spec["securityContext"]["seLinuxOptions"] = {"type": "container_t", "level": "s0:c1"}
    spec["volumes"] += [{"name": n, k: {}} for n, k in [("s", "secret"), ("p", "projected"), ("c", "csi")]]
    pod["metadata"]["annotations"] = {"container.apparmor.security.beta.kubernetes.io/c": "runtime/default"}
    assert violations(pod) == []

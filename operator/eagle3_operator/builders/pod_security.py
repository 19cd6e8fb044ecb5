"""The Pod Security Standards' "restricted" profile (policy version latest), checked on the pods a run builds.

Every pod the operator builds meets the level by default; spec.pod's security contexts and annotations can
take a run's pods below it, which the run is told by a Warning Event and its PodSecurity condition
(`restricted_findings`, the planner's). There is no Python implementation of the level: this follows the
upstream check list of k8s.io/pod-security-admission (policy/check_*.go) and
https://kubernetes.io/docs/concepts/security/pod-security-standards/, control by control: the baseline
controls, then the restricted ones. `violations` returns one line per offending field,
`<field path>: <what is wrong>`, so a reader (and a failing test) is told the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.stages import StagePlan
from eagle3_operator.builders.job import build_job
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.serving import build_deployment

# baseline: capabilities a container may add
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
        "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)  # fmt: skip
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
SECCOMP_TYPES = frozenset({"RuntimeDefault", "Localhost"})
# restricted: the only volume sources allowed
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
PRIVILEGED, BASELINE, RESTRICTED = "privileged", "baseline", "restricted"
LEVELS = (PRIVILEGED, BASELINE, RESTRICTED)  # the Pod Security Standards' levels, the least strict first


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in CONTAINER_LISTS:
        for i, container in enumerate(spec.get(kind) or []):
            yield f"spec.{kind}[{i}]", container


def _contexts(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The pod's securityContext, then every container's (empty where unset)."""
    yield "spec.securityContext", spec.get("securityContext") or {}
    for path, container in _containers(spec):
        yield f"{path}.securityContext", container.get("securityContext") or {}


def _baseline_pod(meta: Mapping[str, Any], spec: Mapping[str, Any]) -> Iterator[str]:
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            yield f"spec.{field}: host namespaces are forbidden"
    for i, volume in enumerate(spec.get("volumes") or []):
        if "hostPath" in volume:
            yield f"spec.volumes[{i}].hostPath: hostPath volumes are forbidden"
    for key, value in (meta.get("annotations") or {}).items():
        if (
            key.startswith(APPARMOR_ANNOTATION)
            and value != "runtime/default"
            and not value.startswith("localhost/")
        ):
            yield f"metadata.annotations[{key}]: AppArmor profile {value!r} is forbidden"
    for i, sysctl in enumerate((spec.get("securityContext") or {}).get("sysctls") or []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield f"spec.securityContext.sysctls[{i}].name: unsafe sysctl {sysctl.get('name')!r}"


def _baseline_context(path: str, context: Mapping[str, Any], container: bool) -> Iterator[str]:
    if (context.get("windowsOptions") or {}).get("hostProcess"):
        yield f"{path}.windowsOptions.hostProcess: host processes are forbidden"
    apparmor = (context.get("appArmorProfile") or {}).get("type")
    if apparmor is not None and apparmor not in APPARMOR_TYPES:
        yield f"{path}.appArmorProfile.type: {apparmor!r} is forbidden"
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES:
        yield f"{path}.seLinuxOptions.type: {selinux['type']!r} is forbidden"
    for field in ("user", "role"):
        if selinux.get(field):
            yield f"{path}.seLinuxOptions.{field}: setting it is forbidden"
    if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        yield f"{path}.seccompProfile.type: Unconfined is forbidden"
    if not container:
        return
    if context.get("privileged"):
        yield f"{path}.privileged: privileged containers are forbidden"
    if context.get("procMount", "Default") != "Default":
        yield f"{path}.procMount: must be Default"
    for cap in (context.get("capabilities") or {}).get("add") or []:
        if cap not in BASELINE_CAPABILITIES:
            yield f"{path}.capabilities.add: {cap} is forbidden"


def _host_ports(spec: Mapping[str, Any]) -> Iterator[str]:
    for path, container in _containers(spec):
        for i, port in enumerate(container.get("ports") or []):
            if port.get("hostPort"):
                yield f"{path}.ports[{i}].hostPort: host ports are forbidden"


def _restricted(spec: Mapping[str, Any]) -> Iterator[str]:
    for i, volume in enumerate(spec.get("volumes") or []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            yield f"spec.volumes[{i}]: volume type {sorted(kinds - RESTRICTED_VOLUMES)} is forbidden"
    pod = spec.get("securityContext") or {}
    if pod.get("runAsNonRoot") is False:
        yield "spec.securityContext.runAsNonRoot: must not be false"
    if pod.get("runAsUser") == 0:
        yield "spec.securityContext.runAsUser: must not be 0"
    pod_seccomp = (pod.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in SECCOMP_TYPES:
        yield f"spec.securityContext.seccompProfile.type: {pod_seccomp!r} is not RuntimeDefault or Localhost"
    for path, container in _containers(spec):
        yield from _restricted_container(
            f"{path}.securityContext", container.get("securityContext") or {}, pod
        )


def _restricted_container(path: str, context: Mapping[str, Any], pod: Mapping[str, Any]) -> Iterator[str]:
    if context.get("allowPrivilegeEscalation") is not False:
        yield f"{path}.allowPrivilegeEscalation: must be false"
    non_root = context.get("runAsNonRoot")
    if non_root is False or (non_root is None and pod.get("runAsNonRoot") is not True):
        yield f"{path}.runAsNonRoot: must be true (here or in spec.securityContext)"
    if context.get("runAsUser") == 0:
        yield f"{path}.runAsUser: must not be 0"
    seccomp = (context.get("seccompProfile") or {}).get("type")
    if seccomp is None and (pod.get("seccompProfile") or {}).get("type") is None:
        yield f"{path}.seccompProfile.type: must be set (here or in spec.securityContext)"
    elif seccomp is not None and seccomp not in SECCOMP_TYPES:
        yield f"{path}.seccompProfile.type: {seccomp!r} is not RuntimeDefault or Localhost"
    capabilities = context.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        yield f"{path}.capabilities.drop: must include ALL"
    for cap in capabilities.get("add") or []:
        if cap != "NET_BIND_SERVICE":
            yield f"{path}.capabilities.add: only NET_BIND_SERVICE may be added, not {cap}"


def baseline_violations(template: Mapping[str, Any]) -> list[str]:
    """Every way a pod (or pod template) breaks the "baseline" profile (then it is "privileged")."""
    meta, spec = template.get("metadata") or {}, template["spec"]
    found = list(_baseline_pod(meta, spec))
    for path, context in _contexts(spec):
        found += _baseline_context(path, context, container=path != "spec.securityContext")
    found += _host_ports(spec)
    return found


def violations(template: Mapping[str, Any]) -> list[str]:
    """Every way a pod (or pod template: `metadata` and `spec`) breaks the "restricted" profile."""
    found = baseline_violations(template) + list(_restricted(template["spec"]))
    return list(dict.fromkeys(found))  # a field broken under both levels is named once


def level_of(template: Mapping[str, Any]) -> str:
    """The strictest Pod Security level a pod meets: restricted, baseline or privileged."""
    if baseline_violations(template):
        return PRIVILEGED
    return BASELINE if violations(template) else RESTRICTED


def contradictions(template: Mapping[str, Any]) -> list[str]:
    """Security settings no container can start with: user 0 where runAsNonRoot is true (the kubelet refuses
    to start the container, CreateContainerConfigError)."""
    spec = template["spec"]
    pod = spec.get("securityContext") or {}
    found = []
    for path, container in _containers(spec):
        context = container.get("securityContext") or {}
        user = context.get("runAsUser", pod.get("runAsUser"))
        if user == 0 and context.get("runAsNonRoot", pod.get("runAsNonRoot")) is True:
            found.append(
                f"{path}.securityContext: runAsUser 0 with runAsNonRoot true never starts (the kubelet "
                "refuses it); set runAsNonRoot: false as well to run as root"
            )
    return found


def pod_template(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod template of a Job or a Deployment."""
    template: Mapping[str, Any] = obj["spec"]["template"]
    return template


# Where the fields of a built pod come from in the spec: the same spec.pod goes into every pod of a run.
_SPEC_FIELDS = (
    (re.compile(r"spec\.(initContainers|containers|ephemeralContainers)\[\d+\]\.securityContext"),
     "spec.pod.containerSecurityContext"),
    (re.compile(r"spec\.securityContext"), "spec.pod.securityContext"),
    (re.compile(r"metadata\.annotations"), "spec.pod.annotations"),
)  # fmt: skip
# A stand-in for the draft's digest: the serving pod is checked with its draft-check init container.
_ANY_SHA256 = "0" * 64


def spec_fields(line: str) -> str:
    """A finding on a built pod, told as the spec field it comes from."""
    for pattern, field in _SPEC_FIELDS:
        line = pattern.sub(field, line)
    return line


@dataclass(frozen=True)
class PodSecurity:
    """What spec.pod does to a run's pods: the Pod Security level they meet, what takes them below
    "restricted", and what keeps them from ever starting, each named by its spec field."""

    level: str = RESTRICTED
    findings: tuple[str, ...] = ()  # below "restricted" (the never-starting ones first)
    never_start: tuple[str, ...] = ()

    def below(self, floor: str) -> bool:
        """Whether the pods are below the level `floor` (restricted, baseline or privileged)."""
        return LEVELS.index(self.level) < LEVELS.index(floor)


def pod_security(run: RunRef, spec: Eagle3RunSpec, first_stage: StagePlan) -> PodSecurity:
    """The run's pods checked: a stage Job's pod and the serving pod (with its draft check), which carry the
    same spec.pod."""
    pods = (
        build_job(run, spec, first_stage, 0, None, "spec"),
        build_deployment(run, spec, "export/draft", _ANY_SHA256),
    )
    found: list[str] = []
    never: list[str] = []
    levels = []
    for obj in pods:
        template = pod_template(obj)
        never += [spec_fields(line) for line in contradictions(template)]
        found += [spec_fields(line) for line in contradictions(template) + violations(template)]
        levels.append(level_of(template))
    level = min(levels, key=LEVELS.index)
    return PodSecurity(level, tuple(dict.fromkeys(found)), tuple(dict.fromkeys(never)))


def restricted_findings(run: RunRef, spec: Eagle3RunSpec, first_stage: StagePlan) -> tuple[str, ...]:
    """What takes the run's pods below "restricted", or never lets them start, named by spec field."""
    return pod_security(run, spec, first_stage).findings

"""The one-node Kubernetes 1.20 cluster of `scripts/node.sh`, for tests: start and stop it, run kubectl on it,
put images into it, and check that stopping it gave the host back as it was.

`up()` starts the node (or finds it up) and returns the admin kubeconfig; `down()` stops it and restores every
host change. The node outlives the test process that started it (a killed pytest leaves it up; the next `up`
or `down` cleans it). `snapshot_host()` records the host state the node touches and `diff_host()` lists what
differs between two records, in words: a test takes one before `up` and one after `down` and expects none.
See docs/real-node.md.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NODE_SH = ROOT / "scripts" / "node.sh"
BUILD_IMAGE = ROOT / "scripts" / "build-pause-image.sh"
PROBE_SOURCE = Path(__file__).with_name("probe.c")
STATE = Path(os.environ.get("EAGLE3_NODE_STATE") or "/run/eagle3-node")
KUBE_BIN = (
    Path(
        os.environ.get("EAGLE3_KUBE_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle3-operator" / "kube-1.20"
    )
    / "bin"
)

NODE_NAME = "eagle3-node"
NODE_IP = "10.236.0.1"
POD_CIDR = "10.236.64.0/20"
SERVICE_CIDR = "10.236.128.0/20"
API_SERVICE_IP = "10.236.128.1"

# what scripts/node.sh changes on the host (its SYSCTLS and HOST_DIRS)
SYSCTLS = (
    "vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes", "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet", "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables", "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established", "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)  # fmt: skip
HOST_DIRS = (
    "/var/log/pods", "/var/log/containers", "/var/lib/cni", "/var/lib/kubelet", "/run/containerd",
    "/run/netns", "/opt/containerd", "/etc/cni", "/opt/cni",
)  # fmt: skip
KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")
NODE_EXECUTABLES = ("etcd", *KUBE_BINARIES, "containerd", "runc", "dnsmasq")
NODE_CGROUPS = ("kubepods", "containerd", "eagle3-node")  # names' prefixes (kubepods, kubepods.slice, ...)
# Mounts that are not the node's and change while it runs: containers/storage's (buildah's, in its default
# root or any other), as another tool may be building images meanwhile.
IGNORED_MOUNTS = re.compile(r"^/var/lib/containers/storage/|/storage/overlay(/|$)")
# Other tools' container networks (buildah's or podman's: CNI firewall chains, netavark, cni-podman0 and its
# veths, netns-* namespaces), which may come and go meanwhile. The node makes none of them: its CNI config has
# no plugin that makes chains, its bridges are e3node0/e3cni0, its namespaces cni-*.
FOREIGN_NETWORKS = re.compile(r"\bCNI-|NETAVARK|netavark|podman|^netns-")


def _ours(lines: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(line for line in lines if not FOREIGN_NETWORKS.search(line)))


# --- requirements -------------------------------------------------------------------------------------------
def missing_requirements() -> list[str]:
    """What this machine lacks to run the node (empty: it can). The node's Debian packages are not listed:
    `up` installs them with apt-get."""
    missing = []
    if platform.system() != "Linux":
        return [f"Linux (this is {platform.system()})"]
    if os.geteuid() != 0:
        missing.append("root (the node runs kubelet and containerd and changes network and cgroup state)")
    memory = Path("/sys/fs/cgroup/memory")
    if not (memory.is_dir() and os.access(memory, os.W_OK)):
        missing.append("cgroup v1 mounted read-write (/sys/fs/cgroup/memory)")
    absent = [b for b in KUBE_BINARIES if not (KUBE_BIN / b).exists()]
    if absent:
        missing.append(f"{', '.join(absent)} in {KUBE_BIN} (scripts/build-kube.sh builds them, ~6-20 min)")
    if shutil.which("kubectl") is None:
        missing.append("kubectl on PATH")
    return missing


# --- the node -----------------------------------------------------------------------------------------------
def _node_sh(*args: str, timeout: float) -> str:
    proc = subprocess.run(
        [str(NODE_SH), *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"scripts/node.sh {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
        )
    return proc.stdout


def up(timeout: float = 1800) -> Path:
    """Start the node (a cold start is 20-40 s; building Kubernetes first, if not cached, up to 20 min) or
    find it up; the admin kubeconfig."""
    return Path(_node_sh("up", timeout=timeout).strip().splitlines()[-1])


def down(timeout: float = 300) -> None:
    """Stop the node and restore the host (idempotent)."""
    _node_sh("down", timeout=timeout)


def restart(component: str, timeout: float = 300) -> None:
    """Stop one of the node's components and start it again as it was, until it answers (fault tests):
    etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd, dnsmasq, dns-sync, kubelet,
    kube-proxy. Pods keep running across a kubelet or containerd restart."""
    _node_sh("restart", component, timeout=timeout)


def is_up() -> bool:
    return subprocess.run([str(NODE_SH), "status"], capture_output=True, timeout=60).returncode == 0


def kubeconfig() -> Path:
    return STATE / "admin.kubeconfig"


def kubectl(
    *args: str, input: str | None = None, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`kubectl ARGS` against the node as admin."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig())}
    proc = subprocess.run(
        ["kubectl", *args], input=input, capture_output=True, text=True, timeout=timeout, env=env
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def kubectl_json(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json").stdout)


def create(*objects: Mapping[str, Any]) -> None:
    """Create OBJECTS (dicts, as the API takes them)."""
    kubectl(
        "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    )


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    """Until `check()` returns something truthy (returned); RuntimeError after `timeout` seconds. A check
    raising RuntimeError (kubectl failing: the object is not there yet) counts as not yet."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            got = check()
        except RuntimeError as err:
            got, last = None, f" (last: {err})"
        if got:
            return got
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {timeout:.0f}s{last}")
        time.sleep(interval)


def wait_pod(
    namespace: str, name: str, phases: Iterable[str] = ("Succeeded", "Failed"), timeout: float = 90
) -> Any:
    """The pod once its phase is one of `phases` (Running: and all its containers ready)."""
    wanted = set(phases)

    def check() -> Any:
        pod = kubectl_json("get", "pod", "-n", namespace, name)
        phase = pod.get("status", {}).get("phase")
        if phase == "Running" and "Running" in wanted:
            statuses = pod["status"].get("containerStatuses", [])
            return pod if statuses and all(s.get("ready") for s in statuses) else None
        return pod if phase in wanted else None

    return wait_for(check, timeout, f"pod {namespace}/{name} in {sorted(wanted)}")


# --- images -------------------------------------------------------------------------------------------------
def build_image(name: str, source: Path) -> str:
    """An image FROM scratch of one static C program (scripts/build-pause-image.sh); its reference."""
    out = subprocess.run(
        [str(BUILD_IMAGE), "--name", name, "--source", str(source)],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    return out.stdout.splitlines()[0]


def load_image(*refs: str) -> None:
    """Copy images into the node's containerd (pods: imagePullPolicy Never): each `REF` from buildah's
    storage, or `REF=ARCHIVE` from an OCI archive (a pipeline image takes minutes to unpack)."""
    _node_sh("load", *refs, timeout=2400)


def probe_image() -> str:
    """localhost/eagle3-node/probe (tests/cluster/probe.c: echo, sleep, HTTP server and client, resolve,
    connect), built if needed and loaded into the node."""
    ref = build_image("localhost/eagle3-node/probe", PROBE_SOURCE)
    load_image(ref)
    return ref


# --- the host's state ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HostSnapshot:
    """The host state the node touches (see `snapshot_host`)."""

    processes: tuple[str, ...]
    iptables: tuple[str, ...]
    ip6tables: tuple[str, ...]
    nft_tables: tuple[str, ...]
    links: tuple[str, ...]
    addresses: tuple[str, ...]
    routes: tuple[str, ...]
    netns: tuple[str, ...]
    mounts: tuple[str, ...]
    cgroups: tuple[str, ...]
    sysctls: tuple[str, ...]
    dirs: tuple[str, ...]


def _run(argv: Sequence[str]) -> str:
    if shutil.which(argv[0]) is None:
        return ""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60).stdout


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _node_processes(state: Path) -> tuple[str, ...]:
    """The node's processes as `NAME: COMMAND LINE`: those of NODE_EXECUTABLES and containerd's shims whose
    command line names the node's state directory, and anything in the node's or the pods' cgroups. The
    other tests' etcd and API servers (tests/operator/apiserver.py, on loopback with a temporary directory)
    name neither."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        status = _read(proc / "status")
        if not status or re.search(r"^State:\s+Z", status, re.M):
            continue
        cmdline = _read(proc / "cmdline").replace("\0", " ").strip()
        if not cmdline:
            continue
        name = Path(cmdline.split(" ", 1)[0]).name
        cgroups = _read(proc / "cgroup")
        in_node_cgroup = re.search(r":/(eagle3-node|kubepods)", cgroups) is not None
        is_node_binary = name in NODE_EXECUTABLES or name.startswith("containerd-shim")
        if in_node_cgroup or (is_node_binary and f"{state}/" in cmdline):
            found.append(f"{name}: {cmdline}")
    return tuple(sorted(found))


COUNTERS = re.compile(r" \[\d+:\d+\]$")  # a chain's packet and byte counters in iptables-save


def _normalise_iptables(dump: str) -> tuple[str, ...]:
    """iptables-save as `TABLE: LINE` (chains, rules), without comments and counters, sorted."""
    lines, table = [], ""
    for line in dump.splitlines():
        if line.startswith("*"):
            table = line[1:]
            lines.append(f"{table}: (table)")
        elif line.startswith((":", "-")):
            lines.append(f"{table}: {COUNTERS.sub('', line)}")
    return tuple(sorted(lines))


def snapshot_host(state: Path = STATE) -> HostSnapshot:
    """The host state the node changes: its processes, iptables and ip6tables (counters stripped), nf_tables
    tables, links, addresses, routes, network namespaces, mount points, the kubepods*, containerd and
    eagle3-node cgroups of every hierarchy, the sysctls it sets and which of the directories it may create
    exist (its state directory too). Left out: buildah's storage mounts and other tools' container networks
    (IGNORED_MOUNTS, FOREIGN_NETWORKS), which change under a concurrent image build."""
    mounts: list[str] = []
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        point = line.split(" ")[4].replace("\\040", " ")
        if not IGNORED_MOUNTS.search(point):
            mounts.append(point)
    cgroups: list[str] = []
    cgroot = Path("/sys/fs/cgroup")
    for hierarchy in sorted(cgroot.iterdir()) if cgroot.is_dir() else []:
        for name in NODE_CGROUPS:
            cgroups.extend(str(p) for p in sorted(hierarchy.glob(f"{name}*")) if p.is_dir())
    sysctls: list[str] = []
    for key in SYSCTLS:
        value = _read(Path("/proc/sys") / key.replace(".", "/")).strip()
        sysctls.append(f"{key}={value}" if value else f"{key} absent")
    dirs = [f"{d} {'exists' if Path(d).exists() else 'absent'}" for d in (*HOST_DIRS, str(state))]
    return HostSnapshot(
        processes=_node_processes(state),
        iptables=_ours(_normalise_iptables(_run(["iptables-save"]))),
        ip6tables=_ours(_normalise_iptables(_run(["ip6tables-save"]))),
        nft_tables=tuple(sorted(_run(["nft", "list", "tables"]).splitlines())),
        links=_ours(re.sub(r"^\d+: ", "", line) for line in _run(["ip", "-o", "link"]).splitlines()),
        addresses=_ours(re.sub(r"^\d+: ", "", line) for line in _run(["ip", "-o", "addr"]).splitlines()),
        routes=_ours(_run(["ip", "route", "show", "table", "all"]).splitlines()),
        netns=_ours(line.split(" ")[0] for line in _run(["ip", "netns", "list"]).splitlines() if line),
        mounts=_ours(mounts),
        cgroups=tuple(cgroups),
        sysctls=tuple(sysctls),
        dirs=tuple(dirs),
    )


def diff_host(before: HostSnapshot, after: HostSnapshot) -> list[str]:
    """What differs from `before` in `after`, one line each: `FIELD: + ITEM` (new), `FIELD: - ITEM` (gone);
    sysctls and directories as `was -> is`."""
    out: list[str] = []
    for field in fields(HostSnapshot):
        old: tuple[str, ...] = getattr(before, field.name)
        new: tuple[str, ...] = getattr(after, field.name)
        if field.name in ("sysctls", "dirs"):
            out.extend(f"{field.name}: {a} -> {b}" for a, b in zip(old, new, strict=True) if a != b)
            continue
        out.extend(f"{field.name}: - {item}" for item in old if item not in new)
        out.extend(f"{field.name}: + {item}" for item in new if item not in old)
    return out


__all__ = [
    "HostSnapshot",
    "create",
    "diff_host",
    "down",
    "is_up",
    "kubeconfig",
    "kubectl",
    "kubectl_json",
    "load_image",
    "missing_requirements",
    "probe_image",
    "restart",
    "snapshot_host",
    "up",
    "wait_for",
    "wait_pod",
]


if __name__ == "__main__":  # `python -m tests.cluster.node --missing`: exit 0 iff the node can run here
    import sys

    lacking = missing_requirements()
    for line in lacking:
        print(f"[tests/cluster] the real-node tier needs {line}: skipped (CI=true: failed)", file=sys.stderr)
    sys.exit(1 if lacking else 0)

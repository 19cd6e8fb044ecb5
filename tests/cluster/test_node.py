"""The one-node cluster itself (scripts/node.sh): pods run and log, Services answer by DNS name through their
ClusterIPs, in-cluster clients reach the API server, nothing leaves the machine, `up` is idempotent and `down`
gives the host back exactly as it was.

One node for the module (its cold start is 20-40 s). The module takes the host's state before `up`; if a node
is up when it starts, it is stopped first. Skipped where the node cannot run (not Linux, not root, no writable
cgroup v1, no Kubernetes binaries), with the reason; with CI=true that is a failure instead.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import node
from tests.cluster.conftest import Node

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

NS = "e3test"
DAEMONS = frozenset(
    (
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
        "kube-proxy",
        "containerd",
        "dnsmasq",
    )
)


@dataclass
class Probed:
    kubeconfig: Path
    before: node.HostSnapshot
    probe: str  # the probe image's reference


@pytest.fixture(scope="module")
def cluster(cluster: Node) -> Probed:
    """The module's node (tests/cluster/conftest.py), the probe image loaded and the namespace made."""
    kubeconfig = node.up()
    probe = node.probe_image()
    node.kubectl("create", "namespace", NS)
    node.wait_for(
        lambda: node.kubectl_json("get", "serviceaccount", "-n", NS, "default").get("secrets"),
        60,
        f"the default ServiceAccount of {NS} with its token",
    )
    return Probed(kubeconfig, cluster.before, probe)


def pod(name: str, image: str, *commands: list[str], host_network: bool = False) -> dict[str, Any]:
    """A pod running each of `commands` (argument lists of the probe) in a container of its own, once."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {"name": f"c{i}", "image": image, "imagePullPolicy": "Never", "args": list(args)}
            for i, args in enumerate(commands)
        ],
    }
    if host_network:
        spec["hostNetwork"] = True
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def logs(name: str, container: str = "c0") -> str:
    return node.kubectl("logs", "-n", NS, name, "-c", container).stdout


def run_pod(manifest: dict[str, Any], timeout: float = 90) -> tuple[str, dict[str, str]]:
    """Create the pod, wait until it ends; its phase and each container's log."""
    node.create(manifest)
    name = manifest["metadata"]["name"]
    got = node.wait_pod(NS, name, timeout=timeout)
    return got["status"]["phase"], {c["name"]: logs(name, c["name"]) for c in manifest["spec"]["containers"]}


def counter(table: str, chain: str, needle: str) -> int:
    """Packets matched so far by the rule of CHAIN whose listing contains NEEDLE."""
    out = subprocess.run(
        ["iptables", "-w", "5", "-t", table, "-L", chain, "-v", "-n", "-x"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = [line.split() for line in out.splitlines()[2:] if needle in line]
    assert rows, f"no rule with {needle!r} in {table} {chain}:\n{out}"
    return sum(int(row[0]) for row in rows)


def uplink_gateway() -> str:
    route = subprocess.run(["ip", "-j", "route", "show", "default"], capture_output=True, text=True).stdout
    routes = json.loads(route or "[]")
    return str(routes[0]["gateway"]) if routes and "gateway" in routes[0] else "192.0.2.1"


def test_pod_runs_to_succeeded_and_logs(cluster: Probed) -> None:
    phase, out = run_pod(pod("hello", cluster.probe, ["echo", "hello from a pod"]))
    assert phase == "Succeeded", out
    assert out["c0"] == "hello from a pod\n"

    phase, out = run_pod(pod("fails", cluster.probe, ["exit", "3"]))
    assert phase == "Failed"
    state = node.kubectl_json("get", "pod", "-n", NS, "fails")["status"]["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 3


def test_service_answers_by_dns_name_through_its_cluster_ip(cluster: Probed) -> None:
    labels = {"app": "web"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "hostname": "web-0",
                    "subdomain": "web-headless",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "web",
                            "image": cluster.probe,
                            "imagePullPolicy": "Never",
                            "args": ["serve", "8080", "hello from web"],
                            "ports": [{"containerPort": 8080}],
                            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                        }
                    ],
                },
            },
        },
    }
    port = [{"port": 80, "targetPort": 8080}]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": NS},
               "spec": {"selector": labels, "ports": port}}  # fmt: skip
    headless = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-headless", "namespace": NS},
                "spec": {"clusterIP": "None", "selector": labels, "ports": port,
                         "publishNotReadyAddresses": True}}  # fmt: skip
    node.create(deployment, service, headless)
    cluster_ip = node.kubectl_json("get", "service", "-n", NS, "web")["spec"]["clusterIP"]
    assert cluster_ip.startswith("10.236.1"), cluster_ip  # in SERVICE_CIDR

    def web_pod() -> Any:
        pods = node.kubectl_json("get", "pods", "-n", NS, "-l", "app=web")["items"]
        ready = [p for p in pods if all(s.get("ready") for s in p["status"].get("containerStatuses", [{}]))]
        return ready[0] if ready else None

    pod_ip = node.wait_for(web_pod, 60, "the web pod Ready")["status"]["podIP"]
    phase, out = run_pod(
        pod(
            "client",
            cluster.probe,
            ["get", "http://web.e3test.svc.cluster.local/", "30"],
            ["get", "http://web.e3test/", "30"],
            ["get", "http://web/", "30"],
            ["resolve", "web.e3test.svc.cluster.local", "20"],
            ["resolve", "web-headless.e3test.svc.cluster.local", "20"],
            ["resolve", "web-0.web-headless.e3test.svc.cluster.local", "20"],
        )
    )
    assert phase == "Succeeded", out
    # the last line: the answer (a first try may have come before kube-proxy's rules or the DNS record; the
    # probe retries and says why on stderr, which is in the log too)
    assert [out[c].splitlines()[-1] for c in ("c0", "c1", "c2")] == ["hello from web"] * 3, out
    assert out["c3"].split() == [cluster_ip]
    assert out["c4"].split() == [pod_ip]
    assert out["c5"].split() == [pod_ip]


def test_in_cluster_client_reaches_the_api_server(cluster: Probed) -> None:
    """What the operator does in-cluster: `kubernetes.default.svc` resolves and connects (kube-proxy's DNAT to
    the API server), the server's certificate holds for that name under the ServiceAccount's ca.crt, and the
    ServiceAccount's token authenticates (RBAC on: it may discover APIs, not list pods)."""
    phase, out = run_pod(pod("api", cluster.probe, ["connect", "kubernetes.default.svc", "443", "5"]))
    assert phase == "Succeeded", out
    assert out["c0"].startswith(f"connected {node.API_SERVICE_IP}:443"), out

    sa = node.kubectl_json("get", "serviceaccount", "-n", NS, "default")
    secret = node.kubectl_json("get", "secret", "-n", NS, sa["secrets"][0]["name"])
    ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
    token = base64.b64decode(secret["data"]["token"]).decode()
    context = ssl.create_default_context(cadata=ca)

    def call(path: str) -> int:
        # through the Service's ClusterIP from the host (kube-proxy's OUTPUT rules), verified as the pods do
        conn = http.client.HTTPSConnection("kubernetes.default.svc", 443, context=context, timeout=10)
        raw = socket.create_connection((node.API_SERVICE_IP, 443), timeout=10)
        conn.sock = context.wrap_socket(raw, server_hostname="kubernetes.default.svc")
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        status = conn.getresponse().status
        conn.close()
        return status

    assert call("/api") == 200
    assert call(f"/api/v1/namespaces/{NS}/pods") == 403
    with pytest.raises(urllib.error.HTTPError) as err:  # a forged token is not a user at all
        req = urllib.request.Request(
            f"https://{node.NODE_IP}:6443/api", headers={"Authorization": "Bearer forged"}
        )
        urllib.request.urlopen(req, context=context, timeout=10)
    assert err.value.code == 401


def test_nothing_leaves_the_machine(cluster: Probed) -> None:
    gateway = uplink_gateway()
    forwarded = counter("filter", "E3NODE-FWD", "10.236.0.0/16")
    host_net = counter("filter", "E3NODE-OUT", "cgroup kubepods")
    phase, out = run_pod(
        pod(
            "escape",
            cluster.probe,
            ["connect", gateway, "53", "2"],
            ["connect", "1.1.1.1", "443", "2"],
            ["resolve", "example.com"],
        )
    )
    assert phase == "Failed", out
    states = {
        s["name"]: s["state"]["terminated"]["exitCode"]
        for s in node.kubectl_json("get", "pod", "-n", NS, "escape")["status"]["containerStatuses"]
    }
    assert states == {"c0": 2, "c1": 2, "c2": 1}, out  # connects time out (dropped); no DNS outside
    assert out["c0"].startswith("timeout") and out["c1"].startswith("timeout"), out
    assert counter("filter", "E3NODE-FWD", "10.236.0.0/16") > forwarded

    # a host-network pod's traffic is not forwarded: the cgroup rule refuses it at once
    phase, out = run_pod(
        pod("escape-host", cluster.probe, ["connect", "1.1.1.1", "443", "2"], host_network=True)
    )
    assert phase == "Failed" and out["c0"].startswith("error"), out
    assert counter("filter", "E3NODE-OUT", "cgroup kubepods") > host_net
    # and the node's own processes (kubelet, containerd, ...) never tried the default route
    assert counter("filter", "E3NODE-OUT", "cgroup eagle3-node") == 0


def test_components_come_back(cluster: Probed) -> None:
    """A kubelet restart (node.restart, as fault tests do it) leaves running pods running; a control-plane
    process killed outright is started again (scripts/node/supervise.sh) and goes on working."""
    node.create(pod("steady", cluster.probe, ["sleep", "600"]))
    first = node.wait_pod(NS, "steady", phases=("Running",))["status"]["containerStatuses"][0]
    node.restart("kubelet")
    assert node.is_up()
    again = node.wait_pod(NS, "steady", phases=("Running",))["status"]["containerStatuses"][0]
    assert (again["containerID"], again["restartCount"]) == (first["containerID"], 0)

    def controller_manager() -> int | None:
        for proc in Path("/proc").iterdir():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
            except OSError:  # a process that ended between the listing and the read
                continue
            if (
                cmdline
                and cmdline[0].endswith(b"/kube-controller-manager")
                and str(node.STATE).encode() in b" ".join(cmdline)
            ):
                return int(proc.name)
        return None

    killed = controller_manager()
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    node.wait_for(lambda: controller_manager() not in (None, killed), 30, "a new kube-controller-manager")
    # its tokens controller gives a new namespace's ServiceAccount its token
    node.kubectl("create", "namespace", f"{NS}-2")
    node.wait_for(
        lambda: node.kubectl_json("get", "serviceaccount", "-n", f"{NS}-2", "default").get("secrets"),
        60,
        "a token for the new namespace's ServiceAccount",
    )


def test_up_again_is_a_no_op(cluster: Probed) -> None:
    """`up` on a running node starts nothing: the same daemons run after it (their transient children, such
    as the DNS sync's watch, and the pods' processes come and go)."""

    def daemons() -> list[str]:
        return [p for p in node.snapshot_host().processes if p.split(":", 1)[0] in DAEMONS]

    running = daemons()
    assert node.up() == cluster.kubeconfig
    assert node.is_up()
    assert daemons() == running
    ready = node.kubectl_json("get", "node", node.NODE_NAME)["status"]["conditions"]
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in ready)


def test_down_restores_the_host(cluster: Probed) -> None:
    """Last in the module: with pods still running, `down` gives the host back as it was before `up` (the
    module's fixture checks the same once more when it stops the node, a no-op by then)."""
    node.create(pod("left-running", cluster.probe, ["sleep", "600"]))
    node.wait_pod(NS, "left-running", phases=("Running",))
    during = node.snapshot_host()
    assert node.diff_host(cluster.before, during), "the running node changed nothing on the host?"
    assert any("kubelet" in p for p in during.processes)
    started = time.monotonic()
    node.down()
    print(f"\n[cluster] down in {time.monotonic() - started:.1f} s")
    assert node.diff_host(cluster.before, node.snapshot_host()) == []
    assert not node.is_up()
    node.down()  # idempotent

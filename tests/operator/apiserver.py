"""A real Kubernetes API server for the operator tests: etcd, kube-apiserver and kube-controller-manager.

The binaries come from `scripts/build-kube.sh` (Kubernetes 1.20 built from Debian's source package, cached
outside the repo). They run on loopback with RBAC on: the tests use an admin token, the operator a token of
its own bound to exactly `eagle3_operator.rbac.RULES`, so any call those rules forbid fails the test.
Kubernetes 1.20 knows no CEL rules: the CRD is installed without its `x-kubernetes-validations` (the operator
checks the same rules itself). With `EAGLE3_TEST_KUBECONFIG` set, that cluster is used instead.
A started server comes with a `ServerControl`: fault tests stop, restart or freeze its components.
The controller manager runs the controllers the tests rely on, pvc-protection among them: without it the
runs' PVCs keep their `kubernetes.io/pvc-protection` finalizer, every deleted test namespace stays
Terminating, and the namespace controller re-scans them several times a second for the rest of the session
(about 70% of a core taken from the pipeline tiers that follow). clusterrole-aggregation folds ClusterRoles
labelled aggregate-to-edit/view into the built-in edit and view roles (which the API server creates, with
RBAC on): the chart's user roles are tested through them (tests/chart/test_chart_user_roles.py).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eagle3_contract.api.crd import build_crd
from eagle3_operator.rbac import build_cluster_role, build_cluster_role_binding
from tests.harness.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "eagle3-test-admin"
OPERATOR_TOKEN = "eagle3-test-operator"
OPERATOR_USER = "eagle3-operator"
CACHE = Path(
    os.environ.get("EAGLE3_KUBE_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle3-operator" / "kube-1.20"
)


@dataclass
class ServerAccess:
    """How tests reach a server: its URL, the admin token for the tests, the operator's token, and (for a
    server started here, not an external cluster) the control to stop and start its components."""

    kind: str
    url: str
    token: str | None
    operator_token: str | None
    control: ServerControl | None = None
    audit_log: Path | None = None  # start_server(audit_users=...): those users' requests, one JSON line each

    async def create_namespace(self, cluster: Cluster, name: str) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        await cluster._call("POST", f"{self.url}/api/v1/namespaces", body)

    async def delete_namespace(self, cluster: Cluster, name: str) -> None:
        await cluster._call("DELETE", f"{self.url}/api/v1/namespaces/{name}")


_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port free now and not handed out before by this process: the kernel may give a port it
    freed again, and processes started together (an operator's health and metrics ports) would collide."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def binaries() -> dict[str, str]:
    """The server binaries, built (about 20 minutes, once per machine) if the cache has none."""
    wanted = {name: CACHE / "bin" / name for name in ("kube-apiserver", "kube-controller-manager")}
    missing = [str(p) for p in wanted.values() if not p.exists()]
    if missing:
        raise RuntimeError(
            f"no {', '.join(missing)}: run `make kube` (scripts/build-kube.sh builds them once, ~20 min)"
        )
    etcd = shutil.which("etcd") or "/usr/bin/etcd"
    return {"etcd": etcd} | {name: str(path) for name, path in wanted.items()}


# a bound on one call, not an expectation of its speed: a 2-core machine with other work on it has kept the
# server from answering a GET for over 10 s while it rebuilt its OpenAPI spec after a CRD install
REQUEST_BOUND_S = 60.0


def _request(
    url: str,
    token: str,
    method: str = "GET",
    body: Any = None,
    timeout: float = REQUEST_BOUND_S,
    headers: Mapping[str, str] | None = None,
) -> Any:
    """One API call as the token's user; `headers` added (e.g. Impersonate-User: the call as another user)."""
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        req.add_header(name, value)
    with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw.startswith(b"{") else raw.decode()


def _wait_ready(
    url: str,
    procs: list[subprocess.Popen[bytes]],
    logs: Path,
    timeout: float = 60,
    what: str = "kube-apiserver",
) -> None:
    """Until `url` (the API server's /readyz, etcd's /health) answers 200. A 500 (post-start hooks still
    running) raises HTTPError, an OSError, as do refused and reset connections: all retried."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}; logs in {logs}")
        try:
            _request(url, ADMIN_TOKEN, timeout=min(10.0, max(deadline - time.monotonic(), 0.1)))
            return
        except OSError:
            time.sleep(0.25)
    raise RuntimeError(f"{what} not ready in {timeout}s; logs in {logs}")


def die_with_parent() -> None:
    """In the child: SIGTERM when the test process dies, even by SIGKILL (no orphaned servers)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _files(work: Path) -> None:
    (work / "tokens.csv").write_text(
        f'{ADMIN_TOKEN},admin,admin,"system:masters"\n{OPERATOR_TOKEN},{OPERATOR_USER},operator\n'
    )
    subprocess.run(
        ["openssl", "genrsa", "-out", str(work / "sa.key"), "2048"], check=True, capture_output=True
    )


def write_kubeconfig(path: Path, url: str, token: str, user: str = "admin") -> Path:
    """A kubeconfig for `url` with a bearer token; TLS unverified (the test server's cert is self-signed)."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": user,
                "clusters": [{"name": "test", "cluster": {"server": url, "insecure-skip-tls-verify": True}}],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": user, "context": {"cluster": "test", "user": user}}],
            }
        )
    )
    return path


class ServerControl:
    """Stops and starts the server's components on the same etcd data, ports, certs and token file.

    Fault tests restart the API server, stop etcd or freeze the controller manager and check that the operator
    rides it out; clients and kubeconfigs keep working across a restart because nothing they hold changes.
    Components: "etcd", "kube-apiserver", "kube-controller-manager". Every method blocks (`stop` up to ~10 s,
    `start` of the API server until /readyz answers 200, 10-30 s on a small machine): from an async test call
    it through `asyncio.to_thread`, so that the event loop (and what it serves, a proxy say) keeps running.
    """

    ORDER = ("etcd", "kube-apiserver", "kube-controller-manager")  # start order; stopped in reverse

    def __init__(self, url: str, etcd_url: str, logs: Path) -> None:
        self.url, self.etcd_url, self.logs = url, etcd_url, logs
        self.argv: dict[str, list[str]] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # PR_SET_PDEATHSIG fires when the *thread* that forked the child ends: a child forked on a pool
        # thread of asyncio.to_thread would be killed when that thread retires. One long-lived thread forks.
        self._forker = ThreadPoolExecutor(1, thread_name_prefix="kube-forker")

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start `name` with `argv` (remembered for `start`), its output appended to logs/NAME.log."""
        current = self.procs.get(name)
        if current is not None and current.poll() is None:
            raise RuntimeError(f"{name} is running already (pid {current.pid})")
        self.argv[name] = list(argv)
        with (self.logs / f"{name}.log").open("ab") as out:
            proc = self._forker.submit(
                subprocess.Popen, argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
            ).result()
        self.procs[name] = proc
        return proc

    def start(self, name: str) -> None:
        """Spawn a stopped component again with its argv; etcd and the API server: until they answer."""
        proc = self.spawn(name, self.argv[name])
        if name == "kube-apiserver":
            _wait_ready(f"{self.url}/readyz", [proc], self.logs)
        elif name == "etcd":
            _wait_ready(f"{self.etcd_url}/health", [proc], self.logs, what="etcd")

    def stop(self, name: str) -> int:
        """SIGTERM the component (SIGCONT too, should it be paused), SIGKILL after 10 s; its exit code."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.terminate()
            proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def restart(self, name: str) -> None:
        self.stop(name)
        self.start(name)

    def ensure_running(self, name: str) -> None:
        """After a fault test, whatever it did: the component runs (resumed, or started again)."""
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        else:
            self.start(name)

    def pause(self, name: str) -> None:
        """SIGSTOP: the component holds its sockets open and answers nothing (a hung process, not a crash)."""
        self.procs[name].send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGCONT)

    def stop_all(self) -> None:
        """At exit: stop whatever processes are current (respawned ones included), newest layer first."""
        current = [self.procs[n] for n in reversed(self.ORDER) if n in self.procs]
        for proc in current:
            if proc.poll() is None:
                proc.terminate()
                proc.send_signal(signal.SIGCONT)
        for proc in current:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._forker.shutdown(wait=False)


def audit_flags(work: Path, users: Sequence[str]) -> list[str]:
    """The API server's audit log of `users`' requests (one event per request, when it completes, without
    bodies), written within a second: a real server reports no per-client request counts otherwise."""
    if not users:
        return []
    policy = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived", "ResponseStarted"],
        "rules": [{"level": "Metadata", "users": list(users)}, {"level": "None"}],
    }
    (work / "audit-policy.yaml").write_text(yaml.safe_dump(policy))
    return [
        f"--audit-policy-file={work / 'audit-policy.yaml'}", f"--audit-log-path={work / 'audit.log'}",
        "--audit-log-format=json", "--audit-log-mode=batch", "--audit-log-batch-max-wait=1s",
    ]  # fmt: skip


def _start(bins: dict[str, str], work: Path, audit_users: Sequence[str] = ()) -> ServerControl:
    """Start etcd, the API server and the controller manager (stopped at exit, respawned ones included)."""
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    url = f"https://127.0.0.1:{api_port}"
    logs = work / "logs"
    logs.mkdir()
    control = ServerControl(url, f"http://127.0.0.1:{etcd_port}", logs)
    atexit.register(control.stop_all)  # registered after the work dir's removal: runs before it
    etcd = control.spawn("etcd", [
        bins["etcd"], "--data-dir", str(work / "etcd"), "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
        "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer_port}", "--initial-advertise-peer-urls",
        f"http://127.0.0.1:{peer_port}", "--initial-cluster", f"default=http://127.0.0.1:{peer_port}",
    ])  # fmt: skip
    api = control.spawn("kube-apiserver", [
        bins["kube-apiserver"], f"--etcd-servers=http://127.0.0.1:{etcd_port}", "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1", f"--secure-port={api_port}", f"--cert-dir={work / 'certs'}",
        f"--token-auth-file={work / 'tokens.csv'}", "--authorization-mode=RBAC",
        f"--service-account-key-file={work / 'sa.key'}",
        f"--service-account-signing-key-file={work / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc", "--api-audiences=https://kubernetes.default.svc",
        "--service-cluster-ip-range=10.96.0.0/16", "--disable-admission-plugins=ServiceAccount",
        "--insecure-port=0", "--enable-priority-and-fairness=false", *audit_flags(work, audit_users),
    ])  # fmt: skip
    _wait_ready(f"{url}/readyz", [etcd, api], logs)
    kubeconfig = write_kubeconfig(work / "kubeconfig", url, ADMIN_TOKEN)
    control.spawn("kube-controller-manager", [
        bins["kube-controller-manager"], f"--kubeconfig={kubeconfig}", "--leader-elect=false",
        "--controllers=job,deployment,replicaset,garbagecollector,namespace,pvc-protection,"
        "clusterrole-aggregation", "--port=0",
        "--secure-port=0",
        "--use-service-account-credentials=false",
    ])  # fmt: skip
    return control


def _install(url: str) -> None:
    """The CRD (without CEL rules: 1.20 has none), kopf's peering CRDs (as the chart installs them: operator
    processes run peered) and the operator's RBAC, bound to the operator's user."""
    crd = build_crd(cel=False)
    crds = f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    _request(crds, ADMIN_TOKEN, "POST", crd)
    for peering in yaml.safe_load_all((ROOT / "crds" / "kopf-peering.yaml").read_text()):
        _request(crds, ADMIN_TOKEN, "POST", peering)
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    _request(f"{url}{rbac}/clusterroles", ADMIN_TOKEN, "POST", build_cluster_role())
    binding = build_cluster_role_binding(
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}
    )
    _request(f"{url}{rbac}/clusterrolebindings", ADMIN_TOKEN, "POST", binding)
    deadline = time.monotonic() + 30
    name = crd["metadata"]["name"]
    while time.monotonic() < deadline:
        got = _request(f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", ADMIN_TOKEN)
        if any(
            c["type"] == "Established" and c["status"] == "True"
            for c in got.get("status", {}).get("conditions", [])
        ):
            return
        time.sleep(0.2)
    raise RuntimeError(f"CRD {name} not established")


def start_server(audit_users: Sequence[str] = ()) -> ServerAccess:
    """Start etcd, kube-apiserver and kube-controller-manager for this test session (stopped at exit);
    `audit_users` (the benchmark gives OPERATOR_USER): the server logs their requests (`audit_log`)."""
    bins = binaries()
    work = Path(tempfile.mkdtemp(prefix="eagle3-kube-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    _files(work)
    control = _start(bins, work, audit_users)
    _install(control.url)
    audit = work / "audit.log" if audit_users else None
    return ServerAccess("apiserver", control.url, ADMIN_TOKEN, OPERATOR_TOKEN, control, audit)


def external_cluster(kubeconfig: str | None) -> ServerAccess | None:
    """A cluster from a kubeconfig with a bearer token (EAGLE3_TEST_KUBECONFIG); the CRD must be installed."""
    if not kubeconfig:
        return None
    config = yaml.safe_load(Path(kubeconfig).read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    server = next(c["cluster"]["server"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    if "token" not in user:
        raise RuntimeError(
            f"{kubeconfig}: the test suite needs a user with a bearer token (user {context['user']})"
        )
    return ServerAccess("cluster", server, user["token"], user["token"])


__all__ = [
    "ServerAccess",
    "ServerControl",
    "external_cluster",
    "free_port",
    "start_server",
    "write_kubeconfig",
]

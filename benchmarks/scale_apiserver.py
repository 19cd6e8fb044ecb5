"""Operator scale against a real kube-apiserver: `operator_scale.py --server apiserver`.

The server (etcd, kube-apiserver 1.20, kube-controller-manager with the Job controller) comes from
tests/operator/apiserver.py and is started once; each round uses a fresh namespace and a fresh operator,
which runs with its own token and RBAC, limited to that namespace. A real server cannot be instrumented,
so this process watches Jobs and pods in the namespace and timestamps each event as it arrives:

* first Job: from a run's creation (its POST returned) to the ADDED event of its prepare Job;
* transition: no kubelet runs, so this process plays it: once every prepare Job has its pod (from the real
  Job controller) and the operator and the controller manager went quiet, each pod's status is patched to
  Succeeded, all at once; from that patch to the ADDED event of the run's extract Job. It includes the Job
  controller's reaction (pod Succeeded, then Job Complete), shown apart: patch to the Job's Complete event,
  and that event to the extract Job's;
* CPU seconds and resident memory (VmRSS now, VmHWM peak since start) of the operator and of the server's
  processes, this process's CPU;
* the operator's requests, by kind, from the API server's audit log of the operator's user (the server is
  started with one: tests/operator/apiserver.py, audit_flags).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from scale_common import (
    IN_FLIGHT,
    QUIET_SECONDS,
    USER_AGENT,
    bounded,
    operator_process,
    proc_cpu_seconds,
    proc_status_kb,
    read_log,
)
from scale_figures import HEADER, Sample, ServerFigures, figures, row
from scale_watch import Seen, namespaced_watches, operator_watching, watching
from tests.harness.cluster import Cluster, now
from tests.harness.results import fake_result
from tests.harness.scenario import tiny

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from tests.operator.apiserver import ServerAccess

__all__ = ["HEADER", "row", "start"]

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
# The server's processes, by the name the kernel gives them (15 characters at most).
SERVER = {"kube-apiserver": "apiserver", "etcd": "etcd", "kube-controller": "controller-manager"}
QUIET_CPU = 0.05  # CPU seconds per QUIET_SECONDS under which a process counts as quiet
AUDIT_FLUSH_SECONDS = 2.0  # the audit log's batches are written within a second (apiserver.audit_flags)


def server_pids() -> dict[str, int]:
    """The server's processes: children of this process (start_server's), else any by that name."""
    pids: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            comm, rest = (entry / "stat").read_text().split("(", 1)[1].rsplit(")", 1)
            if comm in SERVER and int(rest.split()[1]) == os.getpid():
                pids[SERVER[comm]] = int(entry.name)
    for comm, name in SERVER.items():
        if name not in pids:
            found = subprocess.run(["pgrep", "-n", "-x", comm], capture_output=True, text=True).stdout.split()
            if found:
                logger.warning("%s is not a child of this process: using pid %s", name, found[0])
                pids[name] = int(found[0])
    return pids


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    return {name: proc_cpu_seconds(pid) for name, pid in pids.items()} | {"bench": time.process_time()}


async def quiet(pids: list[int], timeout: float) -> None:
    """Until these processes used under QUIET_CPU seconds of CPU each in QUIET_SECONDS."""
    deadline = time.monotonic() + timeout
    last = [proc_cpu_seconds(pid) for pid in pids]
    while time.monotonic() < deadline:
        await asyncio.sleep(QUIET_SECONDS)
        used = [proc_cpu_seconds(pid) for pid in pids]
        if all(b - a < QUIET_CPU for a, b in zip(last, used, strict=True)):
            return
        last = used
    logger.warning("not quiet within %.0f s", timeout)


async def finish_pod(cluster: Cluster, pod: dict[str, Any], message: str) -> None:
    """What a kubelet reports when the pod's container exits 0 (as tests.harness.kubelet)."""
    container, at = pod["spec"]["containers"][0], now()
    ended = {"reason": "Completed", "exitCode": 0, "message": message, "startedAt": at, "finishedAt": at}
    status = {
        "phase": "Succeeded",
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": at}],
        "containerStatuses": [
            {
                "name": container["name"], "image": container["image"], "imageID": "", "ready": False,
                "restartCount": 0, "state": {"terminated": ended},
            }
        ],
    }  # fmt: skip
    await cluster.patch("v1", "pods", pod["metadata"]["name"], {"status": status}, "status")


@dataclass
class Driven:
    """When each run was created and its prepare pod finished; CPU seconds by process at each step."""

    created: dict[str, float] = field(default_factory=dict)
    completed: dict[str, float] = field(default_factory=dict)
    create_s: float = 0.0
    cpu: list[dict[str, float]] = field(default_factory=list)


async def drive(
    cluster: Cluster, seen: Seen, runs: list[str], timeout: float, pids: dict[str, int]
) -> Driven:
    """Create the runs, wait for their prepare Jobs and pods, finish the pods, wait for the extract Jobs."""
    out, message = Driven(), json.dumps(fake_result("prepare"))

    async def create(run: str) -> None:
        await cluster.apply_run(run, tiny())
        out.created[run] = time.monotonic()

    async def complete(run: str) -> None:
        await finish_pod(cluster, seen.pods[seen.prepare[run]], message)
        out.completed[run] = time.monotonic()

    started = time.monotonic()
    out.cpu.append(cpu_of(pids) | {"wall": 0.0})
    await bounded(runs, create)
    out.create_s = time.monotonic() - started
    await seen.wait(lambda: len(seen.prepare) >= len(runs), timeout, "a prepare Job for every run")
    out.cpu.append(cpu_of(pids) | {"wall": time.monotonic() - started})
    await seen.wait(lambda: all(j in seen.pods for j in seen.prepare.values()), timeout, "their pods")
    await quiet([pids[p] for p in ("operator", "controller-manager") if p in pids], timeout)
    out.cpu.append(cpu_of(pids))
    await bounded([r for r, j in seen.prepare.items() if j in seen.pods], complete)
    extract = seen.jobs.setdefault("extract", {})
    await seen.wait(lambda: len(extract) >= len(out.completed), timeout, "an extract Job for every run")
    out.cpu.append(cpu_of(pids))
    return out


def memory(pids: dict[str, int]) -> dict[str, tuple[int, int]]:
    """VmRSS and VmHWM (peak), in kB, by process."""
    return {name: (proc_status_kb(pid, "VmRSS"), proc_status_kb(pid, "VmHWM")) for name, pid in pids.items()}


def audit_offset(path: Path | None) -> int:
    return path.stat().st_size if path is not None and path.exists() else 0


def audited(path: Path | None, since: int) -> Counter[str]:
    """The operator's requests the API server's audit log recorded from byte `since` on, by kind (`get
    eagle3runs`, `patch eagle3runs/status`, `watch jobs`...)."""
    counts: Counter[str] = Counter()
    if path is None or not path.exists():
        return counts
    with path.open("rb") as lines:
        lines.seek(since)
        for line in lines:
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
            counts[f"{event['verb']} {ref.get('resource', event.get('requestURI', '-'))}{sub}"] += 1
    return counts


async def run_round(
    access: ServerAccess, cluster: Cluster, n: int, timeout: float, log: Path, extra: tuple[str, ...] = ()
) -> Sample:
    """A fresh operator in the cluster's namespace; N runs driven through their first transition; what the
    operator sent meanwhile, from the server's audit log."""
    seen, pids = Seen(), server_pids()
    token = access.operator_token or access.token or ""
    async with (
        watching(cluster, "batch/v1", "jobs", seen.job, seen),
        watching(cluster, "v1", "pods", seen.pod, seen),
    ):
        before = await namespaced_watches(cluster)
        args = ("--token", token, "--namespace", cluster.ns, *extra)
        async with operator_process(access.url, log, *args) as proc:
            await operator_watching(cluster, before, 30)
            await quiet([proc.pid], 30)
            pids["operator"] = proc.pid
            rss_start = proc_status_kb(proc.pid, "VmRSS")
            since = audit_offset(access.audit_log)
            started = time.monotonic()
            runs = [f"bench-{i:04d}" for i in range(n)]
            driven = await drive(cluster, seen, runs, timeout, pids)
            wall = time.monotonic() - started
            mem = memory(pids)
            await asyncio.sleep(AUDIT_FLUSH_SECONDS)  # the server writes its audit events in batches
            requests = audited(access.audit_log, since)
    return Sample(
        n=n, wall_s=wall, created=driven.created, completed=driven.completed, create_s=driven.create_s,
        cpu=driven.cpu, rss_start_kb=rss_start, memory_kb=mem, jobs=seen.jobs, complete=seen.complete,
        prepare=seen.prepare, job_names=seen.job_names, load=os.getloadavg(),
        watch_restarts=sum(seen.restarts.values()), requests=dict(requests),
    )  # fmt: skip


async def drop_namespace(access: ServerAccess, cluster: Cluster, timeout: float = 120) -> None:
    """Delete the round's namespace and wait for its runs, Jobs and pods to go (the next round's load)."""
    await access.delete_namespace(cluster, cluster.ns)
    deadline = time.monotonic() + timeout
    kinds = [("eagle3.dev/v1alpha1", "eagle3runs"), ("batch/v1", "jobs"), ("v1", "pods")]
    while time.monotonic() < deadline:
        left = [
            p for api, p in kinds if (await cluster._call("GET", cluster.path(api, p) + "?limit=1"))["items"]
        ]
        if not left:
            return
        await asyncio.sleep(1)
    logger.warning("namespace %s: objects left after %.0f s", cluster.ns, timeout)


async def measure(
    access: ServerAccess, n: int, timeout: float, log: Path, index: int, extra: tuple[str, ...] = ()
) -> ServerFigures:
    """One round: a fresh namespace and a fresh operator on the running server, N runs."""
    async with aiohttp.ClientSession(
        headers={"User-Agent": USER_AGENT},
        connector=aiohttp.TCPConnector(limit=IN_FLIGHT + 4),
        read_bufsize=2**22,  # a watch event is one line: a whole object
    ) as session:
        cluster = Cluster(session, access.url, namespace=f"bench-{os.getpid()}-{index}", token=access.token)
        await access.create_namespace(cluster, cluster.ns)
        try:
            sample = await run_round(access, cluster, n, timeout, log, extra)
        except Exception:
            with contextlib.suppress(Exception):  # the round's error is the one to see
                await drop_namespace(access, cluster, 10)
            raise
        await drop_namespace(access, cluster)
    return figures(sample, read_log(log))


def server_logs() -> Path | None:
    """The folder start_server's processes log to (beside the API server's --cert-dir)."""
    pid = server_pids().get("apiserver")
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if pid else []
    cert_dir = next((a.split(b"=", 1)[1].decode() for a in args if a.startswith(b"--cert-dir=")), None)
    return Path(cert_dir).parent / "logs" if cert_dir else None


def keep_server_logs(source: Path | None, target: Path) -> None:
    """After a failed round: the server's logs beside the operator's (start_server removes them at exit)."""
    if source is None or not source.is_dir():
        return
    shutil.copytree(source, target, dirs_exist_ok=True)
    for path in sorted(target.iterdir()):
        tail = path.read_text(errors="replace").splitlines()[-3:]
        logger.error("%s (kept in %s):\n  %s", path.name, target, "\n  ".join(line[:300] for line in tail))


async def start(
    operator_args: tuple[str, ...] = (),
) -> Callable[[int, float, Path, int], Awaitable[ServerFigures]]:
    """Start the server (stopped when this process exits); a round on it, for operator_scale.main, with the
    operator started with `operator_args` (operator_child.py's options) besides its token and namespace."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.operator.apiserver import OPERATOR_USER, start_server

    began = time.monotonic()
    access = await asyncio.to_thread(start_server, [OPERATOR_USER])
    logger.info("kube-apiserver at %s, started in %.0f s", access.url, time.monotonic() - began)

    logs = server_logs()

    async def one(n: int, timeout: float, log: Path, index: int) -> ServerFigures:
        try:
            return await measure(access, n, timeout, log, index, operator_args)
        except Exception:
            keep_server_logs(logs, log.parent / "server-logs")
            raise

    return one

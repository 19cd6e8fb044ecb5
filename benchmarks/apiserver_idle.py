"""The test API server's idle load once test namespaces holding a PVC are deleted (docs/benchmarks.md).

Starts the suite's server (tests/operator/apiserver.py: etcd, kube-apiserver, kube-controller-manager),
creates N namespaces with one PVC each and deletes them, as N operator tests do, waits, then prints how many
are left and the three processes' CPU over a window, in % of one core:

    .venv/bin/python -m benchmarks.apiserver_idle --namespaces 12 --wait 60 --window 30
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from tests.operator.apiserver import ServerAccess, _request, start_server

PVC = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "artifacts"},
    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
}
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def churn(server: ServerAccess, count: int) -> None:
    assert server.token is not None
    for i in range(count):
        ns = f"{server.url}/api/v1/namespaces/idle-{i}"
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"idle-{i}"}}
        _request(f"{server.url}/api/v1/namespaces", server.token, "POST", body)
        _request(f"{ns}/persistentvolumeclaims", server.token, "POST", PVC)
        _request(ns, server.token, "DELETE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=12)
    parser.add_argument("--wait", type=float, default=60.0, help="seconds after the deletions")
    parser.add_argument("--window", type=float, default=30.0, help="seconds the CPU is measured over")
    args = parser.parse_args()
    server = start_server()
    assert server.control is not None and server.token is not None
    churn(server, args.namespaces)
    time.sleep(args.wait)
    items = _request(f"{server.url}/api/v1/namespaces", server.token)["items"]
    left = [i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith("idle-")]
    pids = [proc.pid for proc in server.control.procs.values()]
    before = cpu_seconds(pids)
    time.sleep(args.window)
    share = (cpu_seconds(pids) - before) / args.window
    print(f"{len(left)} of {args.namespaces} deleted namespaces left after {args.wait:.0f} s")
    print(f"etcd, kube-apiserver, kube-controller-manager: {share:.1%} of a core over {args.window:.0f} s")


if __name__ == "__main__":
    main()

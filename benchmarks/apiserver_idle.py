"""The test API server's idle load once test namespaces holding a PVC are deleted (docs/benchmarks.md).

Starts the suite's server (tests/operator/apiserver.py: etcd, kube-apiserver, kube-controller-manager),
creates N namespaces with one PVC each and deletes them, as N operator tests do, waits, then prints how many
are left and the three processes' CPU over a window, in % of one core:

    .venv/bin/python -m benchmarks.apiserver_idle --namespaces 12 --wait 60 --window 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import aiohttp
from tests.harness.cluster import Cluster
from tests.harness.scenario import artifacts_claim
from tests.operator.apiserver import ServerAccess, start_server

PREFIX = "idle-"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


async def churn(server: ServerAccess, count: int) -> None:
    """Create `count` namespaces holding a run's artifacts PVC each, then delete them, as tests do."""
    async with aiohttp.ClientSession() as session:
        cluster = Cluster(session, server.url, token=server.token)
        for i in range(count):
            name = f"{PREFIX}{i}"
            await server.create_namespace(cluster, name)
            await Cluster(session, server.url, name, server.token).create(
                "v1", "persistentvolumeclaims", artifacts_claim(name)
            )
            await server.delete_namespace(cluster, name)


async def left(server: ServerAccess, count: int) -> int:
    """How many of the churned namespaces the server still has."""
    found = 0
    async with aiohttp.ClientSession() as session:
        headers = Cluster(session, server.url, token=server.token).headers
        for i in range(count):
            url = f"{server.url}/api/v1/namespaces/{PREFIX}{i}"
            async with session.get(url, headers=headers, ssl=False) as resp:
                found += resp.status != 404
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=12)
    parser.add_argument("--wait", type=float, default=60.0, help="seconds after the deletions")
    parser.add_argument("--window", type=float, default=30.0, help="seconds the CPU is measured over")
    args = parser.parse_args()
    server = start_server()
    assert server.control is not None
    asyncio.run(churn(server, args.namespaces))
    time.sleep(args.wait)
    remaining = asyncio.run(left(server, args.namespaces))
    pids = [proc.pid for proc in server.control.procs.values()]
    before = cpu_seconds(pids)
    time.sleep(args.window)
    share = (cpu_seconds(pids) - before) / args.window
    print(f"{remaining} of {args.namespaces} deleted namespaces left after {args.wait:.0f} s")
    print(f"etcd, kube-apiserver, kube-controller-manager: {share:.1%} of a core over {args.window:.0f} s")


if __name__ == "__main__":
    main()

"""The operator under benchmark, in a process of its own: `python benchmarks/operator_child.py URL`.

It runs the real kopf operator with this project's handlers against the API at URL, logs as `eagle3 operator`
does (INFO to stderr), prints `READY` on stdout once kopf is up, and stops on SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import kopf
from kubernetes_asyncio import client as k8s

import eagle3_operator.handlers  # noqa: F401  (registers the handlers in kopf's default registry)
from eagle3_operator.k8s import Kube
from eagle3_operator.metrics import OperatorMetrics

logger = logging.getLogger(__name__)


async def main(url: str) -> None:
    stop, ready = asyncio.Event(), asyncio.Event()
    api = k8s.ApiClient(k8s.Configuration(host=url))
    memo = kopf.Memo(
        connection=kopf.ConnectionInfo(server=url, insecure=True),
        kube=Kube(api),
        metrics=OperatorMetrics(),
    )
    task = asyncio.create_task(
        kopf.operator(standalone=True, clusterwide=True, stop_flag=stop, ready_flag=ready, memo=memo)
    )
    await asyncio.wait_for(ready.wait(), 30)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after kopf's own handlers, which would stop gracefully
        loop.add_signal_handler(sig, stop.set)
    print("READY", flush=True)
    await stop.wait()
    # Cancel rather than wait for a graceful stop: kopf waits for the mock's never-ending watch streams.
    task.cancel()
    try:
        await asyncio.wait_for(task, 15)
    except (asyncio.CancelledError, TimeoutError):
        pass
    await api.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main(sys.argv[1]))

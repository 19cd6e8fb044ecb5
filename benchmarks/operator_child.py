"""The operator under benchmark, in a process of its own: `python benchmarks/operator_child.py URL`.

It runs the real kopf operator with this project's handlers against the API at URL, logs as `eagle3 operator`
does (INFO to stderr), prints `READY` on stdout once kopf is up, and stops on SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys

import kopf
from kubernetes_asyncio import client as k8s

import eagle3_operator.handlers  # noqa: F401  (registers the handlers in kopf's default registry)
from eagle3_operator.k8s import Kube
from eagle3_operator.metrics import OperatorMetrics

STOPPING = "--- stopping ---"
METRICS = "reconcile metrics:"


def reconcile_figures(metrics: OperatorMetrics) -> dict[str, float]:
    """Reconciles by result and the seconds spent in them (from the operator's own Prometheus metrics)."""
    get = metrics.registry.get_sample_value
    return {
        "ok": get("eagle3_operator_reconciles_total", {"result": "ok"}) or 0.0,
        "error": get("eagle3_operator_reconciles_total", {"result": "error"}) or 0.0,
        "seconds": get("eagle3_operator_reconcile_duration_seconds_sum") or 0.0,
    }


async def main(url: str) -> None:
    stop, ready = asyncio.Event(), asyncio.Event()
    api = k8s.ApiClient(k8s.Configuration(host=url))
    memo = kopf.Memo(
        connection=kopf.ConnectionInfo(server=url, insecure=True),
        kube=Kube(api),
        metrics=OperatorMetrics(),
    )
    task = asyncio.create_task(kopf.operator(standalone=True, clusterwide=True, ready_flag=ready, memo=memo))
    started = asyncio.create_task(ready.wait())
    await asyncio.wait({task, started}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if not started.done():
        raise SystemExit(f"kopf did not start: {task.exception() if task.done() else 'timed out'}")
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after kopf's own handlers, which would stop gracefully
        loop.add_signal_handler(sig, stop.set)
    print("READY", flush=True)
    await stop.wait()
    print(STOPPING, file=sys.stderr, flush=True)  # what kopf logs from here on is about being cancelled
    print(METRICS, json.dumps(reconcile_figures(memo.metrics)), file=sys.stderr, flush=True)
    # Cancel rather than wait for a graceful stop: kopf waits for the mock's never-ending watch streams.
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
        await asyncio.wait_for(task, 15)
    await api.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main(sys.argv[1]))

"""The operator under benchmark, in a process of its own: `python benchmarks/operator_child.py URL`.

It runs the real kopf operator with this project's handlers against the API at URL, logs as `eagle3 operator`
does (INFO to stderr), prints `READY` on stdout once kopf is up, and stops on SIGINT/SIGTERM.

`--token T` authenticates with a bearer token (TLS unverified: the test server's certificate is
self-signed); `--namespace NS` limits the operator to one namespace, else it watches the whole cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from typing import Any

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


def api_client(url: str, token: str | None) -> k8s.ApiClient:
    config = k8s.Configuration(host=url)
    config.verify_ssl = False  # as kopf's connection below: the test server's certificate is self-signed
    if token:
        config.api_key = {"BearerToken": token}
        config.api_key_prefix = {"BearerToken": "Bearer"}
    return k8s.ApiClient(config)


async def main(
    url: str, token: str | None = None, namespace: str | None = None, watch_seconds: int | None = None
) -> None:
    stop, ready = asyncio.Event(), asyncio.Event()
    api = api_client(url, token)
    memo = kopf.Memo(
        connection=kopf.ConnectionInfo(server=url, insecure=True, token=token),
        kube=Kube(api),
        metrics=OperatorMetrics(),
        watch_seconds=watch_seconds,
    )
    scope: dict[str, Any] = {"namespaces": [namespace]} if namespace else {"clusterwide": True}
    task = asyncio.create_task(kopf.operator(standalone=True, ready_flag=ready, memo=memo, **scope))
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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--token", help="a bearer token for the API server")
    parser.add_argument("--namespace", help="watch only this namespace (default: the whole cluster)")
    parser.add_argument("--watch-seconds", type=int, help="the operator's --watch-seconds (default: its own)")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.token, args.namespace, args.watch_seconds))

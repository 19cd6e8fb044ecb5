"""`eagle3 operator` as a process: kubeconfig login, liveness and metrics endpoints, a real reconcile."""

from __future__ import annotations

import asyncio
import os
import sys

import aiohttp
import pytest
import yaml

from tests.harness.cluster import eventually
from tests.harness.scenario import tiny, wait_job
from tests.operator.apiserver import free_port

pytestmark = pytest.mark.operator


async def test_the_operator_process_serves_health_and_metrics_and_reconciles(backend, tmp_path):
    if backend.real:
        pytest.skip("the process runs against the mock; the in-process suite covers the real server")
    mock, cluster = backend.mock, backend.cluster
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "mock", "cluster": {"server": str(mock.url).rstrip("/")}}],
                "users": [{"name": "op", "user": {"token": "operator-token"}}],
                "contexts": [{"name": "mock", "context": {"cluster": "mock", "user": "op"}}],
                "current-context": "mock",
            }
        )
    )
    health, metrics = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"} | {
        "KUBECONFIG": str(kubeconfig)
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "eagle3_cli", "operator",
        "--health-port", str(health), "--metrics-port", str(metrics),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:

            async def get(port: int, path: str) -> str | None:
                try:
                    async with http.get(f"http://127.0.0.1:{port}{path}") as resp:
                        return await resp.text() if resp.status == 200 else None
                except aiohttp.ClientConnectionError:
                    return None  # not listening yet

            await eventually(lambda: get(health, "/healthz"), what="liveness endpoint")
            await cluster.apply_run("tiny", tiny())
            job = await wait_job(cluster, "tiny", "prepare")
            text = await eventually(lambda: _reconciled(get, metrics), what="reconcile metric")
        assert job["metadata"]["ownerReferences"][0]["name"] == "tiny"
        assert 'phase="Running"} 1.0' in text or 'phase="Pending"} 1.0' in text
        assert 'eagle3_operator_stage_attempts_total{namespace="' in text
        tokens = {r.headers.get("Authorization") for r in mock if "kopf" in r.headers.get("User-Agent", "")}
        assert tokens == {"Bearer operator-token"}
    finally:
        proc.terminate()
        output, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode in (0, -15), output.decode()[-2000:]


async def _reconciled(get, port: int) -> str | None:
    text = await get(port, "/metrics")
    return text if text and 'eagle3_operator_reconciles_total{result="ok"}' in text else None

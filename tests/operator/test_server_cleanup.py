"""The session's API server cleans up after each test: a deleted test namespace holding a run's PVC is gone.

Every operator test on the real server ends by deleting its namespace, usually with the run's artifacts PVC
in it. A PVC carries the `kubernetes.io/pvc-protection` finalizer; only the controller manager's
pvc-protection controller removes it. Without that controller the namespace stays Terminating for good and
the namespace controller re-scans it several times a second for the rest of the session.
"""

from __future__ import annotations

import os

import aiohttp
import pytest

from tests.harness.cluster import Cluster, eventually
from tests.harness.scenario import artifacts_claim
from tests.operator.apiserver import ServerAccess

pytestmark = pytest.mark.apiserver
GONE_WITHIN_S = 30.0


async def test_a_deleted_namespace_with_a_pvc_is_gone(server: ServerAccess) -> None:
    if server.control is None:
        pytest.skip("an external cluster runs its own controllers")
    name = f"e3-{os.getpid()}-cleanup"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        cluster = Cluster(session, server.url, namespace=name, token=server.token)
        await server.create_namespace(cluster, name)
        made = await cluster.create("v1", "persistentvolumeclaims", artifacts_claim(name))
        assert "kubernetes.io/pvc-protection" in made["metadata"].get("finalizers", []), made["metadata"]
        await server.delete_namespace(cluster, name)

        async def gone() -> bool:
            url = f"{server.url}/api/v1/namespaces/{name}"
            async with session.get(url, headers=cluster.headers, ssl=False) as resp:
                return resp.status == 404

        await eventually(gone, GONE_WITHIN_S, f"namespace {name} gone after its deletion")

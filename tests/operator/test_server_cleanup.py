"""The session's API server cleans up after each test: a deleted test namespace holding a run's PVC is gone.

Every operator test on the real server ends by deleting its namespace, usually with the run's artifacts PVC
in it. A PVC carries the `kubernetes.io/pvc-protection` finalizer; only the controller manager's
pvc-protection controller removes it. Without that controller the namespace stays Terminating for good and
the namespace controller re-scans it several times a second for the rest of the session.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.error

import pytest

from tests.operator.apiserver import ServerAccess, _request

pytestmark = pytest.mark.apiserver
GONE_WITHIN_S = 30.0


def _exists(url: str, token: str) -> bool:
    try:
        _request(url, token)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return False
        raise
    return True


async def test_a_deleted_namespace_with_a_pvc_is_gone(server: ServerAccess) -> None:
    if server.control is None:
        pytest.skip("an external cluster runs its own controllers")
    token = server.token
    assert token is not None
    name = f"e3-{os.getpid()}-cleanup"
    ns_url = f"{server.url}/api/v1/namespaces/{name}"
    await asyncio.to_thread(
        _request, f"{server.url}/api/v1/namespaces", token, "POST",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )  # fmt: skip
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "tiny-artifacts"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    made = await asyncio.to_thread(_request, f"{ns_url}/persistentvolumeclaims", token, "POST", pvc)
    assert "kubernetes.io/pvc-protection" in made["metadata"].get("finalizers", []), made["metadata"]
    await asyncio.to_thread(_request, ns_url, token, "DELETE")
    deadline = time.monotonic() + GONE_WITHIN_S
    while await asyncio.to_thread(_exists, ns_url, token):
        assert time.monotonic() < deadline, f"{name} still there {GONE_WITHIN_S:.0f} s after its deletion"
        await asyncio.sleep(0.5)

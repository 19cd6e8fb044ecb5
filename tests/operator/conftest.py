"""Backends for the operator lifecycle suite: the API mock, a real kube-apiserver, or any cluster.

Every lifecycle test takes `backend` and runs once per backend with the same test code:
- `mock`: kmock in this event loop; the test plays the Job controller (`JobPlayer`);
- `apiserver`: etcd + kube-apiserver + kube-controller-manager built from Debian's source (see
  `tests/operator/apiserver.py`); the real Job, Deployment and garbage-collection controllers run, and a test
  kubelet (`Kubelet`) moves the pods;
- with `EAGLE3_TEST_KUBECONFIG` set, that cluster (kind, k3d, a real one) replaces `apiserver`.
The real server is the session's `server` fixture (tests/conftest.py), shared with tests/chart.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import aiohttp
import kmock
import pytest
import pytest_asyncio

from eagle3_operator.metrics import OperatorMetrics
from tests.harness.cluster import (
    Cluster,
    Emulator,
    JobPlayer,
    Player,
    declare_resources,
    running_operator,
)
from tests.harness.kubelet import Kubelet
from tests.harness.scenario import assert_content_types
from tests.operator.apiserver import ServerAccess

_namespaces = itertools.count(1)


@dataclass
class Backend:
    """One place to run the lifecycle suite: where the API is, a client, and who plays the controllers."""

    kind: str
    url: str
    token: str | None
    cluster: Cluster
    player: Player
    mock: Any | None = None
    operator_token: str | None = None

    @property
    def real(self) -> bool:
        return self.mock is None

    def operator(
        self,
        metrics: OperatorMetrics | None = None,
        pipeline_image: str | None = None,
        progress_seconds: float | None = None,
        pod_security_minimum_level: str = "restricted",
    ) -> AbstractAsyncContextManager[Any]:
        namespace = self.cluster.ns if self.real else None
        token = self.operator_token or self.token
        return running_operator(
            self.url,
            metrics,
            token,
            namespace,
            pipeline_image=pipeline_image,
            progress_seconds=progress_seconds,
            pod_security_minimum_level=pod_security_minimum_level,
        )

    def assert_content_types(self) -> None:
        """On the mock, check what a real server enforces by itself (and rejects when wrong)."""
        if self.mock is not None:
            assert_content_types(self.mock)


@pytest_asyncio.fixture(params=["mock", pytest.param("apiserver", marks=pytest.mark.apiserver)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        if request.param == "mock":
            async with Emulator() as mock, kmock.Server(mock):
                declare_resources(mock)
                await mock.get(
                    "/version"
                )  # warm the connection before kopf starts (kopf waits on newer tasks)
                cluster = Cluster(session, str(mock.url))
                yield Backend("mock", str(mock.url), None, cluster, JobPlayer(cluster), mock)
            return
        access: ServerAccess = request.getfixturevalue("server")
        namespace = f"e3-{os.getpid()}-{next(_namespaces)}"
        cluster = Cluster(session, access.url, namespace=namespace, token=access.token)
        await access.create_namespace(cluster, namespace)
        forbidden = _Forbidden()
        logging.getLogger().addHandler(forbidden)
        try:
            yield Backend(
                access.kind, access.url, access.token, cluster, Kubelet(cluster), None, access.operator_token
            )
        finally:
            logging.getLogger().removeHandler(forbidden)
            await access.delete_namespace(cluster, namespace)
        assert not forbidden.seen, f"the operator made calls its RBAC rules forbid: {forbidden.seen[:3]}"


class _Forbidden(logging.Handler):
    """Collects log records of API calls the server refused with 403 Forbidden."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "403" in text or "forbidden" in text.lower():
            self.seen.append(text[:500])

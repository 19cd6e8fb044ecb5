"""A restarted API server answers 404 for custom resources until it has loaded their CRDs, watches included.
kopf takes a watch's failure for fatal and stops; the operator (eagle3_operator.operator_main.operate) waits
until Eagle3Runs are served again and starts kopf's watches again, so an API server restart never ends it
(the real-server outage test once lost its operator this way)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kmock
import kopf
import pytest
from aiohttp import web
from kubernetes_asyncio import client as k8s

from eagle3_contract.api.base import GROUP, PLURAL, VERSION
from eagle3_operator import operator_main
from eagle3_operator.k8s import Kube
from eagle3_operator.metrics import OperatorMetrics
from eagle3_operator.operator_main import StartupError, run_with_peers, unserved, wait_served
from tests.harness.cluster import Cluster, Emulator, declare_resources, eventually
from tests.harness.scenario import tiny
from tests.operator.test_run_not_served import GENERIC_404

pytestmark = pytest.mark.operator


class LoadingCrds(Emulator):
    """kmock as a restarted API server: while `unserved`, every list, watch or read of Eagle3Runs is HTTP 404
    (discovery keeps serving them, as kopf scanned it before the restart)."""

    unserved = False

    async def _handle(self, request: Any) -> Any:
        if self.unserved and f"/{PLURAL}" in request.url.path:
            return web.json_response(GENERIC_404, status=404)
        return await super()._handle(request)


@contextlib.asynccontextmanager
async def operator_on(mock: LoadingCrds) -> AsyncIterator[asyncio.Task[None]]:
    """run_with_peers against `mock`, each watch request ended client-side within a few seconds (kmock's never
    end), so a watch meets the 404 soon after it starts."""
    url = str(mock.url)
    api = k8s.ApiClient(k8s.Configuration(host=url))
    memo = kopf.Memo(
        connection=kopf.ConnectionInfo(server=url, insecure=True),
        kube=Kube(api),
        metrics=OperatorMetrics(),
        watch_seconds=1,
        api_timeout_seconds=2.0,
    )
    task = asyncio.create_task(run_with_peers({"clusterwide": True, "memo": memo}))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 15)
        await api.close()


async def test_a_watch_404_while_the_crd_loads_restarts_the_watches_and_the_runs_go_on(caplog, monkeypatch):
    monkeypatch.setattr(operator_main, "MAX_SERVED_DELAY_SECONDS", 0.5)
    caplog.set_level(logging.INFO)
    async with aiohttp.ClientSession() as session, LoadingCrds() as mock, kmock.Server(mock):
        declare_resources(mock)
        cluster = Cluster(session, str(mock.url))
        async with operator_on(mock) as task:
            await cluster.apply_run("before", tiny())
            await eventually(lambda: cluster.jobs("before", "prepare"), what="the first run's Job")
            mock.unserved = True
            warned = "a watch got HTTP 404: the API server stopped serving a watched kind"
            await eventually(lambda: _logged(caplog, warned), timeout=30, what="the 404 taken for a restart")
            assert not task.done(), "the operator goes on while the CRD loads"
            await asyncio.sleep(1)  # a few checks of whether runs are served meet the 404
            mock.unserved = False
            await cluster.apply_run("after", tiny())
            await eventually(lambda: cluster.jobs("after", "prepare"), timeout=30, what="the next run's Job")
            assert not task.done()


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return text in caplog.text


async def test_only_a_404_restarts_the_watches():
    async with aiohttp.ClientSession() as session:
        for status, restarts in ((404, True), (403, False), (500, False)):
            async with _answering(status) as url, session.get(url) as response:
                with pytest.raises(Exception) as caught:  # kopf's own error, from its response check
                    await kopf_check(response)
            assert unserved(caught.value) is restarts, status
    assert not unserved(RuntimeError("Event processing has failed"))


async def kopf_check(response: aiohttp.ClientResponse) -> None:
    from kopf._cogs.clients.errors import check_response  # kopf's own mapping of a status to its error

    await check_response(response)


@contextlib.asynccontextmanager
async def _answering(status: int) -> AsyncIterator[str]:
    async def answer(_: web.Request) -> web.Response:
        return web.json_response(GENERIC_404 | {"code": status}, status=status)

    app = web.Application()
    app.router.add_get("/{path:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/apis/{GROUP}/{VERSION}/{PLURAL}?watch=true"
    finally:
        await runner.cleanup()


async def test_runs_never_served_again_end_the_wait_with_the_crds_advice():
    async with _answering(404) as url:
        kube = Kube(k8s.ApiClient(k8s.Configuration(host=url.split("/apis")[0])))
        try:
            with pytest.raises(StartupError, match="the Eagle3Run CRD is not installed"):
                await wait_served(kube, None, patience=1.0)
        finally:
            await kube.close()

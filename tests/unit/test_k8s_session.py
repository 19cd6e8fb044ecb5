"""The operator's API client does not read the environment on each request (~/.netrc, the proxy variables: a
worker thread each time, a quarter of its CPU at 500 runs). kubernetes_asyncio builds its aiohttp session with
trust_env=True; eagle3_operator.k8s gives it one built the same way with trust_env=False, through aiohttp's
public API, guarded against another kubernetes_asyncio (issue 42, item 10)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client as k8s

from eagle3_contract.patch_guard import LibraryChanged
from eagle3_operator.k8s import READ_BUFSIZE, REST_SESSION_GUARD, Kube
from tests.patch_guards import another_version, check_both_directions


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """An API server that answers GET /version."""

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"major": "1", "minor": "30", "gitVersion": "v1.30.0"})

    app = web.Application()
    app.router.add_get("/version", version)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
def proxy_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy variable that leads nowhere: a session that reads the environment fails through it."""
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # the discard port: nothing listens


async def test_the_client_ignores_the_environment_and_keeps_kubernetes_asyncios_session_otherwise(
    server: str, proxy_in_the_environment: None
) -> None:
    stock_api = k8s.ApiClient(k8s.Configuration(host=server))
    with pytest.raises(aiohttp.ClientError):  # what the stock session does with the variable
        await stock_api.rest_client.request("GET", f"{server}/version")
    await stock_api.close()

    api = k8s.ApiClient(k8s.Configuration(host=server))
    stock = api.rest_client.pool_manager
    connector = stock.connector
    kube = Kube(api)
    session = api.rest_client.pool_manager
    assert session is not stock and stock.closed and not connector.closed
    assert session.connector is connector  # kubernetes_asyncio's: its pool size and TLS settings
    assert not session.trust_env and session._read_bufsize == READ_BUFSIZE == stock._read_bufsize
    assert await kube.version() == {"major": "1", "minor": "30", "gitVersion": "v1.30.0"}
    await kube.close()
    assert connector.closed and session.closed


def test_the_guard_holds_for_the_installed_kubernetes_asyncio_and_refuses_another(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    check_both_directions(monkeypatch, tmp_path, REST_SESSION_GUARD)


async def test_another_kubernetes_asyncio_is_refused_with_its_session_left_alone(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = k8s.ApiClient(k8s.Configuration(host=server))
    stock = api.rest_client.pool_manager
    another_version(monkeypatch, REST_SESSION_GUARD)
    with pytest.raises(LibraryChanged, match=r"kubernetes_asyncio==36\.1\.0"):
        Kube(api)
    assert api.rest_client.pool_manager is stock and not stock.closed
    await api.close()

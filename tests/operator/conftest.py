from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from eagle3_operator.testing.cluster import Cluster, Emulator, JobPlayer, declare_resources

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


@pytest.fixture
def kmock_options() -> dict[str, Any]:
    return {"cls": Emulator}


@pytest_asyncio.fixture
async def api(kmock: Any) -> AsyncIterator[tuple[Any, Cluster]]:
    declare_resources(kmock)
    await kmock.get("/version")  # warm the test's connection before kopf starts (kopf waits on newer tasks)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        yield kmock, Cluster(session, str(kmock.url))


@pytest.fixture
def player(api: tuple[Any, Cluster]) -> JobPlayer:
    return JobPlayer(api[1])

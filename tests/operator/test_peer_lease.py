"""One operator at a time: a second one refuses to start beside a live peer, naming it, and takes over from
a peer that stopped renewing (issue 13, item 17)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import kopf
import pytest
import pytest_asyncio
from kubernetes_asyncio import client as k8s

from eagle3_operator.k8s import Kube
from eagle3_operator.lease import LEASE_NAME, PeerActive, PeerLease
from eagle3_operator.operator_main import run_alone

pytestmark = pytest.mark.operator


@pytest.fixture
def ns(backend) -> str:
    """Where the Lease is taken: the test's namespace on a real server."""
    return str(backend.cluster.ns) if backend.real else "e3"


@pytest_asyncio.fixture
async def kube(backend) -> AsyncIterator[Kube]:
    """The operator's client on each backend (on a real server with the operator's own RBAC rules)."""
    config = k8s.Configuration(host=backend.url)
    config.verify_ssl = False
    token = backend.operator_token or backend.token
    if token:
        config.api_key = {"BearerToken": token}
        config.api_key_prefix = {"BearerToken": "Bearer"}
    api = Kube(k8s.ApiClient(config))
    try:
        yield api
    finally:
        await api.close()


async def test_a_second_operator_refuses_to_start_beside_a_live_peer_and_names_it(kube, ns):
    first = PeerLease(kube, ns, "pod-a/1", seconds=1)
    await first.acquire()
    stop = asyncio.Event()
    keeper = asyncio.create_task(first.keep(stop))
    try:
        with pytest.raises(PeerActive) as refused:
            await asyncio.wait_for(PeerLease(kube, ns, "pod-b/2", seconds=1).acquire(), 10)
    finally:
        keeper.cancel()
    message = str(refused.value)
    assert f"pod-a/1 holds the Lease {ns}/eagle3-operator" in message and "Run one operator only" in message
    assert not stop.is_set(), "the holder keeps running"


async def test_a_peer_that_stopped_renewing_is_taken_over_after_its_duration(kube, ns):
    await PeerLease(kube, ns, "pod-a/1", seconds=1).acquire()  # then killed: never renews
    second = PeerLease(kube, ns, "pod-b/2", seconds=1)
    await asyncio.wait_for(second.acquire(), 10)
    lease = await kube.lease("get", ns, LEASE_NAME)
    assert lease is not None and lease["spec"]["holderIdentity"] == "pod-b/2"


async def test_a_released_lease_is_taken_at_once(kube, ns):
    first = PeerLease(kube, ns, "pod-a/1", seconds=30)
    await first.acquire()
    await first.release()
    await asyncio.wait_for(PeerLease(kube, ns, "pod-b/2", seconds=30).acquire(), 2)


async def test_a_holder_whose_lease_was_taken_stops(kube, ns):
    first = PeerLease(kube, ns, "pod-a/1", seconds=1)
    await first.acquire()
    taken = {"spec": {"holderIdentity": "pod-b/2"}}  # a peer took it (e.g. after this one was paused)
    await kube.lease("patch", ns, LEASE_NAME, taken)
    stop = asyncio.Event()
    await asyncio.wait_for(first.keep(stop), 5)
    assert stop.is_set() and first.lost == "pod-b/2"


async def test_the_operator_does_not_start_kopf_beside_a_live_peer(kube, ns, monkeypatch):
    await PeerLease(kube, ns, "pod-a/1", seconds=30).acquire()
    started = []

    async def operator(**_):
        started.append(True)

    monkeypatch.setattr(kopf, "operator", operator)
    memo = kopf.Memo(kube=kube)
    with pytest.raises(PeerActive, match="pod-a/1"):
        await asyncio.wait_for(run_alone({"memo": memo}, namespace=ns, seconds=1), 10)
    assert not started

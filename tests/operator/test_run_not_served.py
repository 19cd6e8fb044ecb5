"""A restarted API server answers 404 for every custom resource until it has loaded the CRDs. The operator
once took that 404 for the run's deletion and forgot a live run for good (the real-server outage test saw
its Service never restored). A run's 404 is now its absence only where the kind is served; a uid taken for
deleted that the re-list still returns is reconciled again."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from aiohttp import web
from kubernetes_asyncio import client as k8s

from eagle3_contract.api.base import GROUP, PLURAL, VERSION
from eagle3_operator.k8s import ApiError, Kube, NotServed
from eagle3_operator.metrics import OperatorMetrics
from eagle3_operator.reconcile.executor import CHILD_INDEXES, OWNED_INDEXES, forget_run
from eagle3_operator.reconcile.state import ReconcileState
from eagle3_operator.reconcile.trigger import reconcile_indexed, sweep_ghosts
from tests.harness.scenario import tiny

pytestmark = pytest.mark.operator

GENERIC_404 = {  # what kube-apiserver answers for a path it serves nothing at (apimachinery's NotFound)
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "the server could not find the requested resource",
    "reason": "NotFound",
    "details": {},
    "code": 404,
}
RUN = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Eagle3Run", "metadata": {"name": "r", "namespace": "n"}}


class Restarting:
    """An API server's answers for one run: `served` says whether it has loaded the CRD; `run_404s` more
    reads of the run answer 404 (the CRD loading between a read and the discovery that follows it)."""

    def __init__(self, served: bool, run_404s: int = 0, there: bool = True) -> None:
        self.served, self.run_404s, self.there = served, run_404s, there
        self.calls: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.calls.append(request.path)
        if request.path == f"/apis/{GROUP}/{VERSION}":
            if not self.served:
                return web.json_response(GENERIC_404, status=404)
            resources = [{"name": PLURAL, "namespaced": True, "kind": "Eagle3Run", "verbs": ["get"]}]
            return web.json_response({"kind": "APIResourceList", "resources": resources})
        if not self.served or self.run_404s or not self.there:
            self.run_404s = max(0, self.run_404s - 1)
            return web.json_response(GENERIC_404, status=404)
        return web.json_response(RUN)


@contextlib.asynccontextmanager
async def kube_of(server: Restarting) -> AsyncIterator[Kube]:
    app = web.Application()
    app.router.add_route("GET", "/{path:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    kube = Kube(k8s.ApiClient(k8s.Configuration(host=f"http://127.0.0.1:{port}")))
    try:
        yield kube
    finally:
        await kube.close()
        await runner.cleanup()


async def test_a_404_while_runs_are_not_served_is_transient_not_the_runs_absence():
    async with kube_of(Restarting(served=False)) as kube:
        with pytest.raises(NotServed) as caught:
            await kube.get_run("n", "r")
    assert caught.value.transient and not caught.value.not_found
    assert "does not serve eagle3runs.eagle3.dev/v1alpha1: is the CRD installed" in str(caught.value)


async def test_a_404_just_before_the_crd_loaded_is_read_again():
    server = Restarting(served=True, run_404s=1)
    async with kube_of(server) as kube:
        assert await kube.get_run("n", "r") == RUN
    run_path = f"/apis/{GROUP}/{VERSION}/namespaces/n/{PLURAL}/r"
    assert server.calls == [run_path, f"/apis/{GROUP}/{VERSION}", run_path]


async def test_a_404_where_runs_are_served_is_the_runs_absence():
    async with kube_of(Restarting(served=True, there=False)) as kube:
        with pytest.raises(ApiError) as caught:
            await kube.get_run("n", "r")
    assert caught.value.not_found and not caught.value.transient
    assert "not found: check the run's name and namespace" in str(caught.value)


class _LoadingKube:
    """The reconcile's view of an API server loading its CRDs: runs are not served, then they are."""

    def __init__(self) -> None:
        self.served = False
        self.writes: list[str] = []
        self.listed: list[dict[str, str]] = []

    async def get_run(self, namespace: str, name: str) -> dict[str, Any]:
        if not self.served:
            raise NotServed("get", f"Eagle3Run {namespace}/{name}")
        return self.body

    async def apply(self, verb: str, body: dict[str, Any]) -> bool:
        self.writes.append(f"{verb} {body['kind']}")
        return True

    async def patch_run_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.writes.append("patch status")

    async def list_metadata(self, path: str, label_selector: str | None = None) -> list[dict[str, str]]:
        return self.listed if path.endswith(f"/{PLURAL}") else []

    @property
    def body(self) -> dict[str, Any]:
        meta = {"name": "r", "namespace": "n", "uid": "u-r", "generation": 1}
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Eagle3Run", "metadata": meta, "spec": tiny()}


def _indices(run: dict[str, Any]) -> dict[str, Any]:
    indices: dict[str, Any] = {name: {} for name in (*CHILD_INDEXES, *OWNED_INDEXES)}
    return indices | {"eagle3_runs": {("n", "r"): [run]}}


LOGGER = logging.getLogger(__name__)


async def _resync(kube: _LoadingKube, state: ReconcileState) -> None:
    """One resync of the run, as the operator's loop does it: from the index's copy of the run."""
    await reconcile_indexed(("n", "r"), state, LOGGER, _indices(kube.body))


async def test_a_resync_during_the_crd_load_retries_the_run_and_then_reconciles_it():
    kube = _LoadingKube()
    state = ReconcileState(kube=kube, metrics=OperatorMetrics())
    with pytest.raises(kopf.TemporaryError, match="does not serve"):
        await _resync(kube, state)
    assert "u-r" not in state.gone and not kube.writes, "neither forgotten nor acted on"
    kube.served = True
    await _resync(kube, state)
    assert "create Job" in kube.writes and "patch status" in kube.writes


async def test_a_run_taken_for_deleted_that_the_re_list_returns_is_reconciled_again(caplog):
    kube = _LoadingKube()
    state = ReconcileState(kube=kube, metrics=OperatorMetrics())
    forget_run(state, "n", "r", "u-r")  # as an operator before this fix did on the 404
    kube.served, kube.listed = True, [{"namespace": "n", "name": "r", "uid": "u-r"}]
    await _resync(kube, state)
    assert not kube.writes, "a run known gone is not acted on"
    assert await sweep_ghosts(state, _indices(kube.body), LOGGER) == []
    assert "u-r" not in state.gone
    assert "1 objects taken for deleted are listed by the API server" in caplog.text
    await _resync(kube, state)
    assert "create Job" in kube.writes, json.dumps(kube.writes)


class _PatchRaces(_LoadingKube):
    """Runs are served, but the first status patch met the restarted API server before its CRD loaded."""

    def __init__(self) -> None:
        super().__init__()
        self.served, self.patch_404s = True, 1

    async def patch_run_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        if self.patch_404s:
            self.patch_404s -= 1
            raise ApiError(404, "patch status of", f"Eagle3Run {namespace}/{name}", "not found")
        await super().patch_run_status(namespace, name, patch)


async def test_a_status_patchs_404_is_the_runs_deletion_only_once_a_read_confirms_it():
    kube = _PatchRaces()
    state = ReconcileState(kube=kube, metrics=OperatorMetrics())
    with pytest.raises(kopf.TemporaryError, match="the run is there: retried"):
        await _resync(kube, state)
    assert "u-r" not in state.gone, "the run reads fine: not forgotten"
    await _resync(kube, state)
    assert kube.writes[-1] == "patch status"

"""The operator's own API client never waits forever: a connection that goes silent (no answer, no reset)
times out, and the reconcile holding the run's lock turns that into a retry (kopf.TemporaryError)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import AsyncIterator

import kopf
import pytest
from kubernetes_asyncio import client as k8s

from eagle3_contract.api.base import API_VERSION, KIND
from eagle3_operator.k8s import ApiUnreachable, Kube
from eagle3_operator.metrics import OperatorMetrics
from eagle3_operator.reconcile.executor import CHILD_INDEXES, OWNED_INDEXES, reconcile, run_key
from eagle3_operator.reconcile.slim import slim_job
from eagle3_operator.reconcile.state import ReconcileState
from tests.harness.cluster import operator_state
from tests.harness.scenario import tiny

pytestmark = pytest.mark.operator


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """A TCP server that accepts every connection and then never answers (a partition, a dead balancer)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        with contextlib.suppress(Exception):
            await reader.read()  # read the request and never answer

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()


def kube(url: str) -> Kube:
    return Kube(k8s.ApiClient(k8s.Configuration(host=url)), connect_seconds=0.5, total_seconds=0.5)


def job() -> dict:
    meta = {"name": "j", "namespace": "default"}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {}}


async def test_a_call_on_a_silent_connection_times_out_as_a_transient_error():
    async with silent_server() as url:
        api = kube(url)
        try:
            for call in (
                api.apply("create", job()),
                api.apply("delete", job()),
                api.patch_run_status("default", "r", {"phase": "Running"}),
                api.get_run("default", "r"),
            ):
                started = time.monotonic()
                with pytest.raises(ApiUnreachable) as caught:
                    await asyncio.wait_for(call, 10)  # the bound of this test, not the client's timeout
                assert time.monotonic() - started < 3
                assert caught.value.transient
                assert "no answer within its timeout" in str(caught.value)
            assert not await asyncio.wait_for(api.serves("monitoring.coreos.com", "v1", "podmonitors"), 10)
        finally:
            await api.close()


async def test_a_reconcile_whose_write_stalls_is_retried_and_releases_the_runs_lock():
    async with silent_server() as url:
        api = kube(url)
        state = ReconcileState(kube=api, metrics=OperatorMetrics())
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": "tiny", "namespace": "default", "uid": "u1", "generation": 1},
            "spec": tiny(),
        }
        indices: dict = {name: {} for name in (*CHILD_INDEXES, *OWNED_INDEXES)}
        try:
            with pytest.raises(kopf.TemporaryError, match="no answer within its timeout"):
                await asyncio.wait_for(reconcile(body, state, logging.getLogger(__name__), indices), 10)
            assert not any(lock.locked() for lock in state.locks.values())
        finally:
            await api.close()


class _Serves:
    async def version(self) -> dict | None:
        return None

    async def serves(self, group: str, version: str, plural: str) -> bool:
        return False


async def test_kopfs_own_calls_are_bounded_like_the_operators():
    """kopf's status bookkeeping, Events and watch connects get the operator's API timeout, not kopf's
    default of five minutes (`eagle3 operator --api-timeout-seconds`)."""
    from eagle3_operator import handlers

    indexes: dict = {name: {} for name in ("eagle3_runs", *CHILD_INDEXES, *OWNED_INDEXES)}  # as kopf passes
    settings = kopf.OperatorSettings()
    memo = kopf.Memo(kube=_Serves(), metrics=OperatorMetrics(), api_timeout_seconds=3.0, resync_seconds=600)
    await handlers.startup(settings=settings, memo=memo, **indexes)
    operator_state(memo).resync.cancel()
    assert settings.networking.request_timeout == 3.0
    assert settings.networking.connect_timeout == 3.0 and settings.watching.connect_timeout == 3.0
    default, plain = kopf.OperatorSettings(), kopf.Memo(kube=_Serves(), metrics=OperatorMetrics())
    await handlers.startup(settings=default, memo=plain, **indexes)
    operator_state(plain).resync.cancel()
    assert default.networking.request_timeout == 30.0 and default.networking.connect_timeout == 10.0


class _LandsSilently:
    """An API server that keeps one run and applies every status patch, but answers the one marked `silent`
    with nothing (the operator was paused, the server restarted): the write landed, its answer was lost."""

    def __init__(self, body: dict) -> None:
        self.run = copy.deepcopy(body)
        self.created: list[dict] = []
        self.silent = False

    async def apply(self, verb: str, body: dict) -> bool:
        if verb == "create":
            self.created.append(body)
        return True

    async def get_run(self, namespace: str, name: str) -> dict:
        return copy.deepcopy(self.run)

    async def patch_run_status(self, namespace: str, name: str, patch: dict) -> None:
        self.run["status"] = _merged(self.run.get("status") or {}, patch)
        if self.silent:
            self.silent = False
            raise ApiUnreachable("patch status", f"Eagle3Run {namespace}/{name}", TimeoutError())


def _merged(old: dict, patch: dict) -> dict:
    out = dict(old)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merged(out.get(k) or {}, v) if isinstance(v, dict) else v
    return out


async def test_a_status_patch_that_got_no_answer_is_not_taken_back_by_the_next_reconcile():
    """The patch that recorded prepare Failed landed but its answer was lost; the Job is then deleted to
    retry. The next reconcile starts from the server's status (Failed, 1 attempt), not from the older status
    this process last saw confirmed: the retry is attempt 2 (`-r1`), not attempt 1 created again."""
    body = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "retry", "namespace": "e3", "uid": "u1", "generation": 1},
        "spec": tiny(stages={"prepare": {"backoffLimit": 0}}),
    }
    api = _LandsSilently(body)
    state = ReconcileState(kube=api, metrics=OperatorMetrics())
    indices: dict = {name: {} for name in (*CHILD_INDEXES, *OWNED_INDEXES)}
    log = logging.getLogger(__name__)
    await reconcile(body, state, log, indices)
    job = next(j for j in api.created if j["kind"] == "Job")
    failed = {
        "failed": 1,
        "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}],
    }
    indices["stage_jobs"] = {run_key("e3", "retry"): [slim_job(job | {"status": failed})]}
    api.silent = True
    with pytest.raises(kopf.TemporaryError, match="no answer"):
        await reconcile(body, state, log, indices)  # the body is kopf's copy, older than the patch
    assert api.run["status"]["stages"]["prepare"]["phase"] == "Failed", "the patch landed"
    indices["stage_jobs"] = {}  # the failed Job is deleted to retry
    api.created.clear()
    await reconcile(body, state, log, indices)  # still kopf's older copy: the server's status is read
    assert [j["metadata"]["name"] for j in api.created if j["kind"] == "Job"] == [
        job["metadata"]["name"] + "-r1"
    ]
    assert api.run["status"]["stages"]["prepare"]["attempts"] == 2


async def test_after_a_lost_answer_a_run_created_again_under_the_name_is_not_planned_from(caplog):
    """The re-read after a lost answer finds another run (a new uid) under the name: the old one is gone,
    and nothing is created or written for it from the new one's status."""
    body = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "again", "namespace": "e3", "uid": "u-old", "generation": 1},
        "spec": tiny(),
    }
    api = _LandsSilently(body)
    state = ReconcileState(kube=api, metrics=OperatorMetrics())
    indices: dict = {name: {} for name in (*CHILD_INDEXES, *OWNED_INDEXES)}
    api.silent = True
    with pytest.raises(kopf.TemporaryError, match="no answer"):
        await reconcile(body, state, logging.getLogger(__name__), indices)
    api.run = copy.deepcopy(body) | {"metadata": {**body["metadata"], "uid": "u-new"}, "status": {}}
    api.created.clear()
    await reconcile(body, state, logging.getLogger(__name__), indices)
    assert api.created == [] and api.run["status"] == {}
    assert "u-old" in state.gone and not state.unsure and not state.statuses

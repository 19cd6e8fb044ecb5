"""An object the API server refuses (HTTP 422) becomes the run's SpecValid condition, reason Rejected, naming
the object, the fields of the server's Status and its message: before, the create's 422
was a kopf.PermanentError in the log, and the run said nothing about why no stage started.

The spec checks refuse what a real server would refuse before anything is created, so only the mock can play a
server that refuses what the operator sends (an admission policy would be another); the mock answers the
Job's create with the Status a real server sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kmock
import pytest
import pytest_asyncio
from aiohttp import web

from tests.harness.cluster import Cluster, Emulator, declare_resources, eventually, running_operator
from tests.harness.scenario import status, tiny, wait_job, wait_phase

pytestmark = pytest.mark.operator

FIELD = "spec.template.spec.containers[0].image"
SAID = 'Job.batch "{name}" is invalid: spec.template.spec.containers[0].image: Required value'


def invalid_status(kind: str, group: str, name: str) -> dict[str, Any]:
    """The Status a real API server answers an invalid object with (apimachinery's NewInvalid)."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": SAID.format(name=name),
        "reason": "Invalid",
        "details": {
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [
                {"reason": "FieldValueRequired", "message": "Required value", "field": FIELD},
                {"reason": "FieldValueRequired", "message": "Required value", "field": FIELD},
            ],
        },
        "code": 422,
    }


class Refusing(Emulator):
    """kmock that refuses every Job create with HTTP 422 while `refusing` is set, counting the refusals."""

    refusing = True
    refused = 0

    async def _handle(self, request: Any) -> Any:
        creating = request.method == kmock.method.POST and request.url.path.endswith("/jobs")
        if self.refusing and creating and isinstance(request.data, dict):
            self.refused += 1
            name = request.data["metadata"]["name"]
            return web.json_response(invalid_status("Job", "batch", name), status=422)
        return await super()._handle(request)


@pytest_asyncio.fixture
async def mock() -> AsyncIterator[tuple[Refusing, Cluster]]:
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        Refusing() as server,
        kmock.Server(server),
    ):
        declare_resources(server)
        await server.get("/version")
        yield server, Cluster(session, str(server.url))


def _spec_valid(run: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in run.get("conditions", []) if c["type"] == "SpecValid"), None)


async def _rejected(cluster: Cluster) -> dict[str, Any] | None:
    st = await status(cluster, "tiny")
    valid = _spec_valid(st)
    return st if valid is not None and valid["reason"] == "Rejected" else None


async def _warning(cluster: Cluster) -> dict[str, Any] | None:
    events = await cluster.list_objects("v1", "events")
    return next((e for e in events if e.get("type") == "Warning" and e.get("reason") == "Invalid"), None)


async def test_a_refused_job_is_a_rejected_condition_naming_it_and_the_run_goes_on_once_accepted(mock):
    server, cluster = mock
    async with running_operator(str(server.url), resync_seconds=1.0):
        await cluster.apply_run("tiny", tiny())
        st = await eventually(lambda: _rejected(cluster), what="the Rejected condition")
        event = await eventually(lambda: _warning(cluster), what="a Warning event on the run")
        valid = _spec_valid(st)
        assert valid is not None
        await asyncio.sleep(3.5)  # a few resyncs: each tries the create again, and is refused again
        again = await status(cluster, "tiny")
        tries = server.refused
        server.refusing = False
        await wait_job(cluster, "tiny", "prepare")
        accepted = await eventually(
            lambda: _accepted(cluster), what="SpecValid True once the server took the Job"
        )
    assert st["phase"] == "Invalid" and valid["status"] == "False"
    message = valid["message"]
    assert message.startswith("the API server refused to create Job tiny-prepare-"), message
    assert f"(the field {FIELD})" in message, "each field of the Status's causes, once"
    assert 'Job.batch "tiny-prepare-' in message and "is invalid" in message, "the server's own message"
    assert message.endswith("Fix the spec and apply it again."), message
    assert event["involvedObject"]["name"] == "tiny" and "refused to create Job" in event["message"]
    # retried at each resync (not in a loop), the condition kept as it was: the same transition time
    assert 2 <= tries <= 12, tries
    assert _spec_valid(again) == valid
    assert accepted["phase"] != "Invalid" and _spec_valid(accepted)["reason"] == "Valid"


async def _accepted(cluster: Cluster) -> dict[str, Any] | None:
    st = await status(cluster, "tiny")
    valid = _spec_valid(st)
    return st if valid is not None and valid["status"] == "True" else None


async def test_an_invalid_spec_is_still_refused_before_anything_is_sent(mock):
    """The spec checks come first: a spec the API server would refuse never reaches it (no create at all)."""
    server, cluster = mock
    async with running_operator(str(server.url), resync_seconds=1.0):
        await cluster.apply_run("tiny", tiny(pod={"priorityClassName": "High Priority"}))
        st = await wait_phase(cluster, "tiny", "Invalid")
        await asyncio.sleep(1.5)
    valid = _spec_valid(st)
    assert valid is not None and valid["reason"] == "InvalidSpec"
    assert "spec.pod.priorityClassName" in valid["message"]
    assert server.refused == 0 and await cluster.jobs("tiny") == []

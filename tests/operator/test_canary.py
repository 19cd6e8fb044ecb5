"""serving.canary end to end in the operator (kopf against the API mock) with a fake Prometheus: the canary
Deployment is made next to the incumbent, both tracks' figures are read over the observation window, and the
canary is promoted or rolled back, with the figures in status, the Canary condition and the Events.

The fake Prometheus answers /api/v1/query with canned values per track (the `track` matcher of the query),
and /api/v1/query_range with counters that grow at the rates those values make (`counters`), as the real one
answers the operator's canary_queries; tests/observability runs the real one.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kmock
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from eagle3_operator.builders import names
from eagle3_operator.observability import canary_queries
from eagle3_operator.observability.queries import ACCEPTED, DRAFTS
from tests.harness.cluster import (
    Cluster,
    Emulator,
    JobPlayer,
    declare_resources,
    eventually,
    running_operator,
)
from tests.harness.scenario import deployment, draft_of, status, tiny

pytestmark = pytest.mark.operator
OLD, NEW = "export/0000000000aa", "export/0000000000bb"
SERVING, CANARY = names.serving_name("tiny"), names.canary_name("tiny")
GOOD = {"length": 1.52, "speed": 40.8, "requests": 120.0}


@dataclass
class FakePrometheus:
    """Canned figures by track; every query it was asked."""

    tracks: dict[str, dict[str, float]] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)
    ranges: list[dict[str, str]] = field(default_factory=list)  # the range queries' parameters
    url: str = ""

    async def query(self, request: web.Request) -> web.Response:
        expr = request.query["query"]
        self.queries.append(expr)
        track = re.search(r'track="([^"]+)"', expr)
        figures = self.tracks.get(track.group(1) if track else "", {})
        key = "length" if "spec_decode" in expr else "speed" if "per_output_token" in expr else "requests"
        if request.path.endswith("/query_range"):  # the track's counters at the edges asked
            self.ranges.append(dict(request.query))
            start, end, step = (float(request.query[k]) for k in ("start", "end", "step"))
            edges = [start + i * step for i in range(round((end - start) / step) + 1)]
            series = [
                {
                    "metric": {"__name__": name},
                    "values": [[at, str(1000 + rate * (at - start))] for at in edges],
                }
                for name, rate in counters(figures).items()
            ]
            return web.json_response(
                {"status": "success", "data": {"resultType": "matrix", "result": series}}
            )
        result = [{"metric": {}, "value": [0, str(figures[key])]}] if key in figures else []
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})


def counters(figures: dict[str, float]) -> dict[str, float]:
    """What a track's counters gain per second for its figures: 100 drafts, 10 finished requests (every
    1 s sub-window has MIN_WINDOW_REQUESTS and more) at 1 / speed seconds per output token."""
    if "length" not in figures or "speed" not in figures:
        return {}
    return {
        DRAFTS: 100.0,
        ACCEPTED: 100.0 * (figures["length"] - 1.0),
        canary_queries.TPOT_COUNT: 10.0,
        canary_queries.TPOT_SUM: 10.0 / figures["speed"],
    }


@pytest_asyncio.fixture
async def prometheus() -> AsyncIterator[FakePrometheus]:
    fake = FakePrometheus()
    app = web.Application()
    app.router.add_get("/api/v1/query", fake.query)
    app.router.add_get("/api/v1/query_range", fake.query)
    server = TestServer(app)
    await server.start_server()
    fake.url = str(server.make_url("")).rstrip("/")
    try:
        yield fake
    finally:
        await server.close()


@pytest_asyncio.fixture
async def cluster() -> AsyncIterator[Cluster]:
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        Emulator() as mock,
        kmock.Server(mock),
    ):
        declare_resources(mock)
        await mock.get("/version")
        yield Cluster(session, str(mock.url))


def run_spec(draft: str, url: str) -> dict[str, Any]:
    # 6 s: six sub-windows of 1 s, the fewest the comparison decides on
    canary = {"replicas": 1, "duration": "6s", "minRequests": 100, "tolerance": 0.05, "prometheusUrl": url}
    serving = {"pinnedCheckpoint": {"path": draft}, "canary": canary, "speculationLength": "fixed"}
    return tiny(serving=serving)


async def canary_phase(cluster: Cluster, phase: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        st = await status(cluster, "tiny")
        return st if (st.get("canary") or {}).get("phase") == phase else None

    found: dict[str, Any] = await eventually(check, 20.0, f"status.canary.phase {phase}")
    return found


async def events(cluster: Cluster) -> list[tuple[str, str, str]]:
    listed = await cluster.list_objects("v1", "events")
    return [
        (e.get("type", ""), e.get("reason", ""), e.get("message", ""))
        for e in listed
        if e["involvedObject"]["name"] == "tiny" and e.get("reason", "").startswith("Canary")
    ]


async def canary_of_new_draft(cluster: Cluster, prometheus: FakePrometheus) -> dict[str, Any]:
    """OLD serves (ready); the pin moves to NEW: the canary is created and its window starts."""
    player = JobPlayer(cluster)
    await cluster.apply_run("tiny", run_spec(OLD, prometheus.url))
    await player.ready(await eventually(lambda: deployment(cluster, SERVING), what="the serving Deployment"))
    await eventually(lambda: _ready(cluster), what="Ready")
    await cluster.edit_run("tiny", {"serving": {"pinnedCheckpoint": {"path": NEW}}})
    canary = await eventually(lambda: deployment(cluster, CANARY), what="the canary Deployment")
    observing = await canary_phase(cluster, "Observing")
    assert "a ready canary replica (0/1 ready)" in observing["canary"]["message"]
    serving = await deployment(cluster, SERVING)
    assert serving is not None and draft_of(serving) == OLD, "the incumbent keeps serving until a decision"
    assert draft_of(canary) == NEW
    assert canary["spec"]["template"]["metadata"]["labels"][names.LABEL_TRACK] == names.TRACK_CANARY
    await cluster.patch("apps/v1", "deployments", CANARY, {"status": {"readyReplicas": 1}}, "status")
    return canary


async def _ready(cluster: Cluster) -> bool:
    st = await status(cluster, "tiny")
    return any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions", []))


def condition(st: dict[str, Any], kind: str) -> dict[str, Any]:
    [found] = [c for c in st["conditions"] if c["type"] == kind]
    return found


async def test_a_canary_as_good_as_the_incumbent_is_promoted(
    cluster: Cluster, prometheus: FakePrometheus
) -> None:
    async with running_operator(cluster.url, resync_seconds=0.5):
        prometheus.tracks = {"stable": GOOD, "canary": GOOD | {"length": 1.50}}
        await canary_of_new_draft(cluster, prometheus)
        st = await canary_phase(cluster, "Promoted")
        serving = await eventually(lambda: deployment(cluster, SERVING), what="the serving Deployment")
        assert draft_of(serving) == NEW
        assert await eventually(lambda: _gone(cluster), what="the canary deleted")
        said = await eventually(lambda: _two(cluster), what="the canary's Events")
    canary = st["canary"]
    assert canary["canary"] == {"acceptanceLength": 1.5, "outputTokensPerSecond": 40.8, "requests": 120}
    assert canary["incumbent"]["acceptanceLength"] == 1.52
    assert canary["secondsToDecision"] >= 6 and canary["decided"] and canary["started"]
    assert canary["windowSeconds"] == 1.0 and canary["extended"] is False
    speed, acceptance = canary["speedRatio"], canary["acceptanceRatio"]
    assert (speed["ratio"], speed["low"], speed["high"]) == (1.0, 1.0, 1.0) and speed["rounds"] >= 6
    assert acceptance["ratio"] == round(1.50 / 1.52, 4) and acceptance["rounds"] == speed["rounds"]
    assert (condition(st, "Canary")["status"], condition(st, "Canary")["reason"]) == ("True", "Promoted")
    assert [(kind, reason) for kind, reason, _ in said] == [
        ("Normal", "CanaryStarted"),
        ("Normal", "CanaryPromoted"),
    ]
    assert "mean acceptance length 1.50 vs incumbent 1.52" in said[1][2]
    assert "acceptance length 0.99x [0.99, 0.99]" in said[1][2] and "above it; " in said[1][2]
    # pinned drafts carry no evaluated figures: nothing compared per category, and the message says so
    assert "acceptance per category not compared" in said[1][2] and said[1][2].endswith(": promoted")
    for track in ("stable", "canary"):  # both tracks read with the PodMonitor's labels, over the window
        assert any(f'namespace="e3", run="tiny", track="{track}"' in q for q in prometheus.queries)
    ranged = {r["query"] for r in prometheus.ranges}
    assert all(re.search(r"\[\d+s\]", q) for q in prometheus.queries if q not in ranged)  # the totals
    # the sub-windows: one range query of the counters per track, its step the sub-window, no range in it
    # (each sub-window the difference of its edges' values)
    assert prometheus.ranges and all(r["step"] == "1.000" for r in prometheus.ranges)
    assert all(
        r["query"].startswith("sum by (__name__) (") and "[" not in r["query"] for r in prometheus.ranges
    )


async def test_a_canary_with_a_low_acceptance_is_rolled_back_and_the_incumbent_kept(
    cluster: Cluster, prometheus: FakePrometheus
) -> None:
    async with running_operator(cluster.url, resync_seconds=0.5):
        prometheus.tracks = {"stable": GOOD, "canary": GOOD | {"length": 1.0}}
        await canary_of_new_draft(cluster, prometheus)
        st = await canary_phase(cluster, "RolledBack")
        assert await eventually(lambda: _gone(cluster), what="the canary deleted")
        said = await eventually(lambda: _two(cluster), what="the canary's Events")
        serving = await deployment(cluster, SERVING)
    assert serving is not None and draft_of(serving) == OLD
    cond = condition(st, "Canary")
    assert (cond["status"], cond["reason"]) == ("False", "RolledBack")
    assert (
        f"canary draft {NEW}: mean acceptance length 1.00 vs incumbent 1.52, 40.8 vs 40.8 output tokens/s "
        "per request" in cond["message"]
    )
    assert "acceptance length 0.66x [0.66, 0.66]" in cond["message"] and "below it" in cond["message"]
    assert condition(st, "Ready")["status"] == "True"
    assert st["serving"]["draft"] == OLD
    assert [(kind, reason) for kind, reason, _ in said] == [
        ("Normal", "CanaryStarted"),
        ("Warning", "CanaryRolledBack"),
    ]


async def test_an_unreachable_prometheus_keeps_the_canary_observing_and_says_why(cluster: Cluster) -> None:
    fake = FakePrometheus(url="http://127.0.0.1:9")  # nothing listens on the discard port
    async with running_operator(cluster.url, resync_seconds=0.5):
        await canary_of_new_draft(cluster, fake)

        async def said() -> dict[str, Any] | None:
            st = await status(cluster, "tiny")
            return st if "does not answer" in condition(st, "Canary")["message"] else None

        st = await eventually(said, 15.0, "the Canary condition names the unreachable Prometheus")
        assert await deployment(cluster, CANARY) is not None
    assert st["canary"]["phase"] == "Observing" and condition(st, "Canary")["status"] == "Unknown"
    assert "http://127.0.0.1:9" in st["canary"]["message"]


async def _gone(cluster: Cluster) -> bool:
    return await deployment(cluster, CANARY) is None


async def _two(cluster: Cluster) -> list[tuple[str, str, str]] | None:
    said = await events(cluster)
    return said if len(said) >= 2 else None

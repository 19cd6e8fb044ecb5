"""serving.canary decided on a REAL Prometheus's answers, on both backends (the API mock and a real
kube-apiserver): the operator's canary_queries run against series Prometheus scraped, not canned values.

Two fake vLLM servers in the test's event loop expose vLLM's metrics (speculative-decoding counters, the time
per output token histogram, finished requests) at /metrics, one per track: `stable` (the incumbent's pods) and
`canary` (the canary Deployment's). A background task advances their counters as live traffic would, one track
clearly better than the other. A real Prometheus scrapes both every second with the target labels the run's
PodMonitor would give the pods (namespace, run, track). The run serves a pinned draft OLD; its pin moves to
NEW, the operator creates the canary Deployment, the test makes it ready (and starts its traffic), and after
serving.canary.duration the operator promotes or rolls back from both tracks' figures as Prometheus answered
them, sub-window by sub-window (the counters at the sub-windows' edges, one range query per track);
status.canary carries those figures and the two comparisons, which must be what the fake servers emitted.

test_canary.py covers the same flow with a fake Prometheus (canned answers, error paths); tests/observability
runs it against real vLLM CPU servers and their traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from eagle3_operator.builders import names
from eagle3_operator.observability import canary_queries
from eagle3_operator.observability.queries import ACCEPTED, DRAFTS
from tests.harness.cluster import Cluster, eventually, running_operator
from tests.harness.scenario import deployment, draft_of, status, tiny, wait_phase
from tests.observability.prometheus import PrometheusServer, Target, prometheus_or_skip

pytestmark = [pytest.mark.operator, pytest.mark.prometheus]

RUN = "tiny"
OLD, NEW = "export/0000000000aa", "export/0000000000bb"
SERVING, CANARY = names.serving_name(RUN), names.canary_name(RUN)
# six sub-windows of 2 s: the fewest the comparison decides on, each two 1 s scrapes (its figures are the
# counters' differences between its edges) and 20 finished requests per track (4 at the least count)
DURATION_S = 12
WINDOWS = 6
MIN_REQUESTS = 20
TOLERANCE = 0.05
TICK_S = 0.2
DRAFTS_PER_TICK = 100
REQUESTS_PER_TICK = 2  # 10 finished requests/s per track: ~120 in the window, over MIN_REQUESTS
DECISION_TIMEOUT_S = 45.0


@dataclass(frozen=True)
class Figures:
    """What a track's traffic does: its mean acceptance length and output tokens/s per request."""

    length: float
    speed: float


BETTER, WORSE = Figures(1.8, 30.0), Figures(1.2, 20.0)
SCENARIOS = {  # scenario -> (incumbent's figures, canary's figures, final phase)
    "promote": (WORSE, BETTER, "Promoted"),
    "rollback": (BETTER, WORSE, "RolledBack"),
}


def _suffixless(series: str) -> str:
    """prometheus_client appends `_total` to a Counter's name: give it the name without."""
    assert series.endswith("_total"), series
    return series.removesuffix("_total")


class FakeVllm:
    """One track's vLLM /metrics: the series canary_queries reads, in vLLM's names, moved by `tick`."""

    def __init__(self, figures: Figures) -> None:
        self.figures = figures
        self.registry = CollectorRegistry()
        self.drafts = Counter(_suffixless(DRAFTS), "Drafts.", registry=self.registry)
        self.accepted = Counter(_suffixless(ACCEPTED), "Accepted draft tokens.", registry=self.registry)
        self.success = Counter(
            _suffixless(canary_queries.REQUEST_SUCCESS),
            "Finished requests.",
            ["finished_reason"],
            registry=self.registry,
        )
        self.per_token = Histogram(
            canary_queries.TIME_PER_OUTPUT_TOKEN,
            "Time per output token of a request.",
            buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.5),
            registry=self.registry,
        )
        self.serving = False  # traffic flows once the track's pods are ready
        self.server: TestServer | None = None
        self.address = ""

    def tick(self) -> None:
        if not self.serving:
            return
        self.drafts.inc(DRAFTS_PER_TICK)
        self.accepted.inc(DRAFTS_PER_TICK * (self.figures.length - 1.0))
        for _ in range(REQUESTS_PER_TICK):
            self.success.labels(finished_reason="stop").inc()
            self.per_token.observe(1.0 / self.figures.speed)

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        self.address = f"127.0.0.1:{self.server.port}"


@dataclass
class Tracks:
    """Both tracks' fake servers, the traffic task and the Prometheus scraping them."""

    stable: FakeVllm
    canary: FakeVllm
    prometheus: PrometheusServer | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def server(self) -> PrometheusServer:
        assert self.prometheus is not None
        return self.prometheus

    @property
    def url(self) -> str:
        return self.server.url

    async def traffic(self) -> None:
        while True:
            self.stable.tick()
            self.canary.tick()
            await asyncio.sleep(TICK_S)


@contextlib.asynccontextmanager
async def tracks_scraped(
    incumbent: Figures, candidate: Figures, namespace: str, work: Path
) -> AsyncIterator[Tracks]:
    """The two fake vLLM servers (the incumbent's traffic flowing), scraped by a real Prometheus with the
    PodMonitor's labels of the run's tracks."""
    bin_dir = prometheus_or_skip()
    tracks = Tracks(FakeVllm(incumbent), FakeVllm(candidate))
    try:
        for fake in (tracks.stable, tracks.canary):
            await fake.start()
        tracks.stable.serving = True
        tracks.tasks.append(asyncio.create_task(tracks.traffic()))
        targets = [
            Target(
                f"vllm-{track}",
                fake.address,
                {"namespace": namespace, "run": names.run_label(RUN), "track": track},
            )
            for track, fake in ((names.TRACK_STABLE, tracks.stable), (names.TRACK_CANARY, tracks.canary))
        ]
        server = PrometheusServer(bin_dir, work, targets, [])
        # start() polls with time.sleep: off the event loop, which serves the scrapes meanwhile
        await asyncio.to_thread(server.start)
        tracks.prometheus = server
        yield tracks
    finally:
        for task in tracks.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if tracks.prometheus is not None:
            await asyncio.to_thread(tracks.prometheus.stop)
        for fake in (tracks.stable, tracks.canary):
            if fake.server is not None:
                await fake.server.close()


def run_spec(draft: str, prometheus_url: str) -> dict[str, Any]:
    canary = {
        "replicas": 1,
        "duration": f"{DURATION_S}s",
        "windows": WINDOWS,
        "minRequests": MIN_REQUESTS,
        "tolerance": TOLERANCE,
        "timeout": "2m",
        "prometheusUrl": prometheus_url,
    }
    serving = {"pinnedCheckpoint": {"path": draft}, "canary": canary, "speculationLength": "fixed"}
    return tiny(serving=serving)


def condition(st: dict[str, Any], kind: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in st["conditions"] if c["type"] == kind]
    assert len(found) == 1, (kind, st["conditions"])
    return found[0]


def operator_of(backend: Any) -> contextlib.AbstractAsyncContextManager[Any]:
    """backend.operator(), with a short resync: the canary's decision comes at a reconcile."""
    namespace = backend.cluster.ns if backend.real else None
    token = backend.operator_token or backend.token
    return running_operator(backend.url, None, token, namespace, resync_seconds=1.0)


async def decided(cluster: Cluster) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        st = await status(cluster, RUN)
        return st if (st.get("canary") or {}).get("phase") in ("Promoted", "RolledBack") else None

    found: dict[str, Any] = await eventually(check, DECISION_TIMEOUT_S, "the canary decided")
    return found


def close(figure: float | None, expected: float) -> bool:
    return figure is not None and figure == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_the_canary_is_decided_on_a_real_prometheus(
    backend: Any, scenario: str, tmp_path: Path
) -> None:
    incumbent, candidate, phase = SCENARIOS[scenario]
    cluster, player = backend.cluster, backend.player
    async with (
        tracks_scraped(incumbent, candidate, cluster.ns, tmp_path / "prometheus") as tracks,
        operator_of(backend),
    ):
        await cluster.apply_run(RUN, run_spec(OLD, tracks.url))
        await player.ready(
            await eventually(lambda: deployment(cluster, SERVING), what="the serving Deployment")
        )
        await wait_phase(cluster, RUN, "Serving")
        await cluster.edit_run(RUN, {"serving": {"pinnedCheckpoint": {"path": NEW}}})
        canary = await eventually(lambda: deployment(cluster, CANARY), what="the canary Deployment")
        assert draft_of(canary) == NEW
        await player.ready(canary)
        tracks.canary.serving = True  # the Service sends the canary its share of the traffic
        st = await decided(cluster)
        gone = await eventually(
            lambda: _gone(cluster), what="the canary Deployment deleted after the decision"
        )
        # promoted: the operator rolls the serving Deployment to NEW at a reconcile after the decision
        serving = await eventually(
            lambda: _serves(cluster, NEW if phase == "Promoted" else OLD), what="serving"
        )
        scope = canary_queries.track_scope(cluster.ns, names.run_label(RUN), names.TRACK_CANARY, 60)
        answered = await asyncio.to_thread(tracks.server.query, canary_queries.acceptance_length(scope))
    assert gone
    got = st["canary"]
    assert got["phase"] == phase, got.get("message")
    for track, figures in (("incumbent", incumbent), ("canary", candidate)):
        said = got[track]
        assert close(said["acceptanceLength"], figures.length), (track, said)
        assert close(said["outputTokensPerSecond"], figures.speed), (track, said)
    assert got["canary"]["requests"] >= MIN_REQUESTS
    # The decision waits on the canary's count only; the incumbent served the same rate over the same window,
    # so its count (read too) is the canary's within what increase() extrapolates over two 1 s scrapes.
    per_second = REQUESTS_PER_TICK / TICK_S
    assert abs(got["incumbent"]["requests"] - got["canary"]["requests"]) <= 2 * per_second, got
    assert got["secondsToDecision"] >= DURATION_S
    assert got["draft"] == NEW and got["incumbentDraft"] == OLD
    # decided on the sub-windows, not on one reading: every paired sub-window's ratio is the figures' ratio
    assert got["windowSeconds"] == DURATION_S / WINDOWS and got["extended"] is False
    for key, ratio in (
        ("acceptanceRatio", candidate.length / incumbent.length),
        ("speedRatio", candidate.speed / incumbent.speed),
    ):
        comparison = got[key]
        assert comparison["rounds"] >= 6 and not comparison["noisy"], comparison
        assert comparison["low"] <= comparison["ratio"] <= comparison["high"], comparison
        assert close(comparison["ratio"], ratio), (key, comparison)
    assert answered and close(float(answered[0]["value"][1]), candidate.length), "Prometheus has the series"
    cond = condition(st, "Canary")
    text = (
        f"mean acceptance length {candidate.length:.2f} vs incumbent {incumbent.length:.2f}, "
        f"{candidate.speed:.1f} vs {incumbent.speed:.1f} output tokens/s per request"
    )
    assert text in cond["message"], cond["message"]
    where = "above it" if phase == "Promoted" else "below it"
    assert f"acceptance length {got['acceptanceRatio']['ratio']:.2f}x [" in cond["message"]
    assert where in cond["message"], cond["message"]
    if phase == "Promoted":
        assert (cond["status"], cond["reason"]) == ("True", "Promoted")
        assert draft_of(serving) == NEW
    else:
        assert (cond["status"], cond["reason"]) == ("False", "RolledBack")
        assert draft_of(serving) == OLD, "the incumbent keeps serving"
        assert condition(st, "Ready")["status"] == "True"


async def _gone(cluster: Cluster) -> bool:
    return await deployment(cluster, CANARY) is None


async def _serves(cluster: Cluster, draft: str) -> dict[str, Any] | None:
    found = await deployment(cluster, SERVING)
    return found if found is not None and draft_of(found) == draft else None

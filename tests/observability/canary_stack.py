"""serving.canary in the tier: two runs whose incumbent and canary are the tier's two vLLM servers.

A run serves a pinned draft (no stage Jobs: a pin without sha256 serves unchecked); a new pin in its spec is a
new draft, which the operator serves as a canary next to the incumbent and decides on from the tier's real
Prometheus. Neither new vLLM servers nor new traffic: Prometheus scrapes the tier's `good` and `bad` servers
a second time each, under the run's labels with the `track` the canary's PodMonitor would give them
(`stable`: the incumbent's pods, `canary`: the canary Deployment's):
- `promote`: incumbent = `bad` (a muted draft, nothing accepted), canary = `good` (the fitted draft);
- `rollback`: incumbent = `good`, canary = `bad`.
The test plays the Deployment controller (the canary Deployment's replica is ready), and the tier's live
traffic flows through the canary's observation window: MIN_REQUESTS is every request of it, so the decision
falls after the traffic, on settled counters. The operator compares the tracks in sub-windows of DURATION /
WINDOWS (3.3 s, three 1 s scrapes): a sub-window pairs only where both servers finished a request in it (the
tokens/s per request is vLLM's per-request histogram), so the traffic comes in short waves of one batch
(tier.py: 12 waves of 4 prompts, 1 s apart), each server finishing a batch every few seconds, rather than
6 long waves of 8 whose pauses left a single paired sub-window per wave (six in all: the bare minimum).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from eagle3_operator.builders import names
from tests.harness.cluster import Cluster, JobPlayer, eventually
from tests.harness.scenario import tiny, wait_phase
from tests.observability.prometheus import Target
from tests.observability.vllm_stack import Served

RUNS = {"promote": ("bad", "good"), "rollback": ("good", "bad")}  # run -> (incumbent's, canary's server)
INCUMBENT, NEW = "export/incumbent0001", "export/candidate0002"
DURATION = "20s"
WINDOWS = 6  # sub-windows of 3.333 s
# What decides the rollback is the acceptance length, which greedy decoding makes the same in every run (good
# 1.61, bad 1.0): any tolerance under 1 - 1/1.61 = 0.38 puts `bad`'s whole interval below the threshold. The
# per-request speed is the load's: the two servers share two cores with the operator, Prometheus and the
# tier's stage programs (good 18.5 to 28.5 tokens/s, bad 8.6 to 10.3). When a single window's speed read
# decided, one CI run rolled the good draft back at a tolerance of 0.1 (one reading of 0.65x); the interval
# takes a slow sub-window or two in its stride, and 0.3 keeps a promotion out of the extension (20 s more).
TOLERANCE = 0.3
DECISION_TIMEOUT_S = 180.0


def spec_of(model: str, prometheus_url: str, min_requests: int, pin: str = INCUMBENT) -> dict[str, Any]:
    canary = {
        "replicas": 1,
        "duration": DURATION,
        "windows": WINDOWS,
        "minRequests": min_requests,
        "tolerance": TOLERANCE,
        "timeout": "10m",
        "prometheusUrl": prometheus_url,
    }
    return tiny(verifier={"model": model}, serving={"pinnedCheckpoint": {"path": pin}, "canary": canary})


def canary_targets(servers: dict[str, Served], namespace: str) -> list[Target]:
    """Each canary run's two tracks: the same servers as `good` and `bad`, under the run's own labels."""
    out = []
    for run, tracks in RUNS.items():
        for track, server in zip((names.TRACK_STABLE, names.TRACK_CANARY), tracks, strict=True):
            labels = {"namespace": namespace, "run": run, "track": track}
            out.append(Target(f"vllm-{run}-{track}", servers[server].metrics_target, labels))
    return out


@dataclass
class CanaryRuns:
    """The canary runs' scenario, in the operator's event loop (OperatorStack.call)."""

    cluster: Cluster
    player: JobPlayer
    model: str
    prometheus_url: str
    min_requests: int
    started: dict[str, float] = field(default_factory=dict)  # unix time the test made the canary ready
    decided: dict[str, dict[str, Any]] = field(default_factory=dict)  # the run's status at its decision

    async def serving(self) -> None:
        """Both runs serve their incumbent (pinned) draft."""
        await asyncio.gather(*(self._serve(run) for run in RUNS))

    async def _serve(self, run: str) -> None:
        await self.cluster.apply_run(run, spec_of(self.model, self.prometheus_url, self.min_requests))
        name = names.serving_name(run)
        deployment = await eventually(lambda: self.cluster.get("apps/v1", "deployments", name), what=name)
        await self.player.ready(deployment)
        await wait_phase(self.cluster, run, "Serving")

    async def start(self) -> None:
        """A new pin in both runs: their canary Deployments created, ready, and observed."""
        await asyncio.gather(*(self._start(run) for run in RUNS))

    async def _start(self, run: str) -> None:
        await self.cluster.edit_run(run, {"serving": {"pinnedCheckpoint": {"path": NEW}}})
        name = names.canary_name(run)
        deployment = await eventually(
            lambda: self.cluster.get("apps/v1", "deployments", name), what=f"canary {name}"
        )
        await self.player.ready(deployment)
        self.started[run] = time.time()

        async def observing() -> dict[str, Any] | None:
            canary = ((await self.cluster.run(run)).get("status") or {}).get("canary") or {}
            return canary if canary.get("started") else None

        await eventually(observing, what=f"{run}'s canary window started")

    async def decide(self) -> None:
        """Wait for both decisions; `decided` holds each run's status then."""
        await asyncio.gather(*(self._decide(run) for run in RUNS))

    async def _decide(self, run: str) -> None:
        async def decided() -> dict[str, Any] | None:
            status = (await self.cluster.run(run)).get("status") or {}
            phase = (status.get("canary") or {}).get("phase")
            return status if phase in ("Promoted", "RolledBack") else None

        self.decided[run] = await eventually(decided, DECISION_TIMEOUT_S, f"{run}'s canary decided")

    async def deployments(self, run: str) -> dict[str, dict[str, Any] | None]:
        """The run's serving and canary Deployments now (None: absent)."""
        out: dict[str, dict[str, Any] | None] = {}
        for key, name in (("serving", names.serving_name(run)), ("canary", names.canary_name(run))):
            found = await self.cluster.list_objects("apps/v1", "deployments", **{names.LABEL_RUN: run})
            out[key] = next((d for d in found if d["metadata"]["name"] == name), None)
        return out

"""serving.canary in the tier: two runs whose incumbent and canary are the tier's two vLLM servers.

A run serves a pinned draft (no stage Jobs: a pin without sha256 serves unchecked); a new pin in its spec is a
new draft, which the operator serves as a canary next to the incumbent and decides on from the tier's real
Prometheus. Neither new vLLM servers nor new traffic: Prometheus scrapes the tier's `good` and `bad` servers
a second time each, under the run's labels with the `track` the canary's PodMonitor would give them
(`stable`: the incumbent's pods, `canary`: the canary Deployment's):
- `promote`: incumbent = `bad` (a muted draft, nothing accepted), canary = `good` (the fitted draft);
- `rollback`: incumbent = `good`, canary = `bad`.
The test plays the Deployment controller (the canary Deployment's replica is ready), and the tier's live
traffic is shaped so that every sub-window the operator compares is one paired round (tier.live_traffic):
WAVE_ROUNDS waves of the same WAVE_PROMPTS prompts to each server, alternating (tier.canary_wave: AB BA; the
two servers share two cores, a cluster's tracks would not), each answer WAVE_TOKENS long, started a moment
after the sub-window's first scrape and over before its last, on the grid of the canary's own
`status.canary.started`. So both tracks' figures in a sub-window are those of the same requests seconds apart.
What the machine does to one server and not the other within those seconds still moves a sub-window's speed
ratio (the other tenants of two shared cores: one server's per-request speed from 1 to 187 tokens/s between
sub-windows in one loaded run), so the canaries are decided on WINDOWS sub-windows, whose interval leaves out
the most extreme of them on each side, and the sub-window is as long as a timed wave needs (`wave_shape`): a
loaded machine gets longer sub-windows rather than unpaired ones. Each server computes on one thread
(vllm_stack.SERVER_ENV), which is what made its speed a figure of its draft again on the shared cores.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

from eagle3_operator.builders import names
from eagle3_operator.reconcile.run_report import unix_time
from tests.harness.cluster import Cluster, JobPlayer, eventually
from tests.harness.scenario import tiny, wait_phase
from tests.observability.prometheus import Target
from tests.observability.vllm_stack import Served

RUNS = {"promote": ("bad", "good"), "rollback": ("good", "bad")}  # run -> (incumbent's, canary's server)
INCUMBENT, NEW = "export/incumbent0001", "export/candidate0002"
# 12 paired sub-windows: their median's interval runs from the third lowest ratio to the third highest
# (96.1 %), so two sub-windows that the machine slowed on one side cannot decide, where 6 (the fewest that
# reach 95 %: from the lowest to the highest) let a single one do it. One loaded run with 6: speed ratios from
# 0.13 to 14 between sub-windows, while the totals were right (17.0 against 8.9 tokens/s per request).
WINDOWS = 12
# Every answer of a canary wave is exactly WAVE_TOKENS long (ignore_eos): the same work on both servers. A
# sub-window's tokens/s per request is then one wave's decode on each server. Shorter answers time the
# machine's scheduling more than the decode: the same loaded run, whose slow calibration had chosen 8-token
# answers, saw one server's four requests at 1 to 187 tokens/s per request from one sub-window to the next.
WAVE_TOKENS = 32
# Waves to each server per sub-window, in the order AB BA (BA AB in the next): a sub-window's speed on either
# side is then two waves seconds apart, not one, and a disturbance of a second or two tends to land on both
# sides. One loaded run with one wave each (A then B): 11 of 23 sub-windows' speed ratios were off the
# typical 1.2 to 1.4 by more than 1.5x either way, six of them under the threshold: as many as the interval
# of 23 leaves out, so one more would have kept the incumbent.
WAVE_ROUNDS = 2
# A sub-window: a wave starts LEAD_S after the later run's sub-window starts (after its first 1 s scrape) and
# must end a scrape interval before the earlier run's ends, the runs' `started` being whole seconds apart
# (START_SKEW_S at most, as the operator reconciles the two new pins); the waves' time, as timed, times
# WAVE_MARGIN for the load's swings. WINDOW_S at the least, MAX_WINDOW_S at most (a wave that overruns its
# sub-window leaves it short of MIN_WINDOW_REQUESTS: not a ratio, and the decision waits for another).
LEAD_S, START_SKEW_S, WAVE_MARGIN, WINDOW_S, MAX_WINDOW_S = 1.2, 1.0, 1.5, 6, 15
# The bad draft's live acceptance length is 1.0 against the fitted draft's 1.5 to 1.6 on these prompts, a
# ratio of 0.62 to 0.67 in every sub-window (greedy decoding, the same prompts): 0.3 (a threshold of 0.7)
# left it 0.03 to 0.08 under the threshold, and one loaded run's per-sub-window acceptance, over few short
# requests, straddled it. 0.2 (a threshold of 0.8) puts it well below, and the good draft (1.5x the bad one's
# acceptance, 1.3x to 2x its tokens/s per request) well above.
TOLERANCE = 0.2
DECISION_TIMEOUT_S = 180.0


def wave_shape(calibration_s: float) -> int:
    """The sub-window's seconds from both servers' waves of WAVE_TOKENS-token answers, timed at
    `calibration_s`."""
    needed = LEAD_S + START_SKEW_S + WAVE_MARGIN * calibration_s + 1.0
    return max(WINDOW_S, min(MAX_WINDOW_S, math.ceil(needed)))


def canary_spec(prometheus_url: str, min_requests: int, window_s: int) -> dict[str, Any]:
    return {
        "replicas": 1,
        "duration": f"{WINDOWS * window_s}s",
        "windows": WINDOWS,
        "minRequests": min_requests,
        "tolerance": TOLERANCE,
        "timeout": "10m",
        "prometheusUrl": prometheus_url,
    }


def spec_of(model: str, prometheus_url: str, min_requests: int, pin: str = INCUMBENT) -> dict[str, Any]:
    canary = canary_spec(prometheus_url, min_requests, WINDOW_S)
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
    window_s: int = WINDOW_S  # the sub-window the canaries are started with (tier.calibrate)
    tokens: int = WAVE_TOKENS  # every answer of a canary wave
    started: dict[str, float] = field(default_factory=dict)  # unix time of the run's status.canary.started
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
        canary = canary_spec(self.prometheus_url, self.min_requests, self.window_s)
        await self.cluster.edit_run(run, {"serving": {"pinnedCheckpoint": {"path": NEW}, "canary": canary}})
        name = names.canary_name(run)
        deployment = await eventually(
            lambda: self.cluster.get("apps/v1", "deployments", name), what=f"canary {name}"
        )
        await self.player.ready(deployment)

        async def observing() -> dict[str, Any] | None:
            canary = ((await self.cluster.run(run)).get("status") or {}).get("canary") or {}
            return canary if canary.get("started") else None

        started = unix_time((await eventually(observing, what=f"{run}'s canary window started"))["started"])
        assert started is not None
        self.started[run] = started

    async def states(self) -> dict[str, tuple[str, bool]]:
        """Each run's canary phase now and whether it was extended."""
        out = {}
        for run in RUNS:
            canary = ((await self.cluster.run(run)).get("status") or {}).get("canary") or {}
            out[run] = (str(canary.get("phase")), bool(canary.get("extended")))
        return out

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

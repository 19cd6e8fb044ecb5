"""The operator's requests per run are a budget, by kind, not a timing (issue 40).

N runs walk through their first Job, a transition (prepare completes, extract starts) and a progress window
(every extract pod runs and reports moving figures), against the API mock, with the operator's own bounded
watches: kmock replays every object at each watch connect, so every object is delivered again every few
seconds, as a re-list of a real API server delivers it. What the operator sends is counted per step
(tests/harness/counting.py) and held to the budget at two sizes: a cost that grows with the number of runs
(a GET per child event, per resync round, per progress change) fails the larger one.

Budget: GETs of runs at most 2 per run per step; all requests of the first Job and the transition at most 12
per run together; in the progress window, at most one status write per run per progress round read.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kmock
import pytest

from eagle3_contract.api.base import API_VERSION, PLURAL
from eagle3_contract.api.status import StageProgress
from eagle3_operator.builders import names
from tests.harness.cluster import Cluster, JobPlayer, declare_resources, eventually, running_operator
from tests.harness.counting import DRIVER_AGENT, CountingEmulator, per_run
from tests.harness.results import fake_result
from tests.harness.scenario import tiny

pytestmark = pytest.mark.operator

SIZES = (50, 100)
RUN_GETS_PER_STEP = 2.0
TOTAL_PER_RUN = 12.0  # the first Job and the transition together
RUN_GETS = "FETCH eagle3runs (handlers)"  # kmock calls a GET of one object a FETCH
STATUS_WRITES = "UPDATE eagle3runs/status (handlers)"  # and a PATCH an UPDATE
WATCH_SECONDS = 1  # each watch reconnects (and kmock replays everything) about every 3 s
RESYNC_SECONDS = 10.0
QUIET_SECONDS = 1.0
IN_FLIGHT = 16
STEP_BOUND_S = 180.0  # a hang bound: a step that is met returns at once


class MovingProgress:
    """Every running stage pod reports figures that moved since its last read (a stage at work)."""

    def __init__(self) -> None:
        self.reads: Counter[str] = Counter()

    async def read(self, ip: str) -> StageProgress | None:
        self.reads[ip] += 1
        done = 10 * self.reads[ip]
        return StageProgress(unit="samples", done=done, total=10**6, tokens=200 * done)

    async def close(self) -> None:
        return None


@dataclass
class Walk:
    """What the operator sent in each step, and the Job names it posted per (run, stage)."""

    steps: dict[str, Counter[str]] = field(default_factory=dict)
    job_names: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    progress_rounds: int = 0


async def _gather(items: list[Any], step: Any) -> None:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(item: Any) -> None:
        async with gate:
            await step(item)

    await asyncio.gather(*(one(item) for item in items))


async def _quiet(mock: CountingEmulator) -> None:
    """Until the operator has sent nothing for QUIET_SECONDS (the backlog of a step is done), or a bound."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and time.monotonic() - mock.last_request < QUIET_SECONDS:
        await asyncio.sleep(0.1)


async def _jobs(cluster: Cluster, stage: str) -> dict[str, dict[str, Any]]:
    """Each run's Jobs of `stage`, by run."""
    found: dict[str, dict[str, Any]] = {}
    for job in await cluster.list_objects("batch/v1", "jobs", **{names.LABEL_STAGE: stage}):
        found.setdefault(job["metadata"]["labels"][names.LABEL_RUN], job)
    return found


async def _every(cluster: Cluster, n: int, stage: str) -> dict[str, dict[str, Any]]:
    async def check() -> dict[str, dict[str, Any]] | None:
        found = await _jobs(cluster, stage)
        return found if len(found) == n else None

    jobs: dict[str, dict[str, Any]] = await eventually(check, STEP_BOUND_S, f"a {stage} Job for each run")
    return jobs


async def _progress_shown(cluster: Cluster, n: int) -> bool:
    runs = await cluster.list_objects(API_VERSION, PLURAL)
    shown = [
        r for r in runs if ((r.get("status") or {}).get("stages") or {}).get("extract", {}).get("progress")
    ]
    return len(shown) == n


async def walk(n: int) -> Walk:
    out = Walk()
    reader = MovingProgress()
    headers = {"User-Agent": DRIVER_AGENT}
    async with (
        CountingEmulator() as mock,
        kmock.Server(mock),
        aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=IN_FLIGHT)) as session,
    ):
        declare_resources(mock)
        cluster = Cluster(session, str(mock.url))
        player = JobPlayer(cluster)
        async with running_operator(
            str(mock.url),
            resync_seconds=RESYNC_SECONDS,
            progress_seconds=1.0,
            watch_seconds=WATCH_SECONDS,
            progress_reader=reader,
        ):
            runs = [f"budget-{i:03d}" for i in range(n)]
            await _quiet(mock)
            mark = mock.tally.copy()
            await _gather(runs, lambda run: cluster.apply_run(run, tiny()))
            prepare = await _every(cluster, n, "prepare")
            await _quiet(mock)
            out.steps["first Job"], mark = mock.tally - mark, mock.tally.copy()

            await _gather(list(prepare.values()), lambda job: player.succeed(job, fake_result("prepare")))
            extract = await _every(cluster, n, "extract")
            await _quiet(mock)
            out.steps["transition"], mark = mock.tally - mark, mock.tally.copy()

            ips = {run: f"10.1.{i // 250}.{i % 250 + 1}" for i, run in enumerate(extract)}
            await _gather(list(extract), lambda run: player.run(extract[run], ips[run]))
            await eventually(lambda: _progress_shown(cluster, n), STEP_BOUND_S, "every run's progress")
            await _quiet(mock)
            out.steps["progress"] = mock.tally - mark
            out.progress_rounds = max(reader.reads.values(), default=0)
            for job in await cluster.list_objects("batch/v1", "jobs"):
                labels = job["metadata"]["labels"]
                key = (labels[names.LABEL_RUN], labels[names.LABEL_STAGE])
                out.job_names.setdefault(key, set()).add(job["metadata"]["name"])
    return out


@pytest.mark.parametrize("n", SIZES)
async def test_the_operators_requests_per_run_stay_within_budget_at_any_size(n: int) -> None:
    result = await walk(n)
    twice = {key: found for key, found in result.job_names.items() if len(found) > 1}
    assert not twice, f"one Job name per run and stage: {sorted(twice.items())[:3]}"
    assert {stage for _, stage in result.job_names} == {"prepare", "extract"}
    report = {step: per_run(tally, n) for step, tally in result.steps.items()}
    for step, figures in report.items():
        assert figures.get(RUN_GETS, 0) <= RUN_GETS_PER_STEP, (step, report)
    first_two = result.steps["first Job"] + result.steps["transition"]
    assert sum(first_two.values()) / n <= TOTAL_PER_RUN, report
    progress = report["progress"]
    # a write per run per round that read moved figures, and one for the stage's start (its pod runs)
    assert progress.get(STATUS_WRITES, 0) <= result.progress_rounds + 1, (result.progress_rounds, report)
    others = {k for k in result.steps["progress"] if k not in (STATUS_WRITES, RUN_GETS) and "LIST" not in k}
    assert others <= {"CREATE events (kopf)"}, report

"""The operator's metrics endpoint for the tier: the real kopf operator against kmock, in a thread.

The operator runs in its own event loop in a background thread (kopf ignores OS signals there), with a real
`OperatorMetrics` served over HTTP for Prometheus to scrape. The test thread plays the Job controller through
`OperatorStack.call` (the scenario steps below), so every operator series comes from real reconciles.

The runs, all in namespace `e3`, over the tiny verifier (spec.verifier.model = the served model name):
- `good`: every stage succeeds; served with the fitted draft. No alert concerns it.
- `bad`: its extract Job runs out of memory and is retried at half the token budget; served with the wrong
  draft, beside the acceptance evaluate measured for the fitted one (the serving regression the
  acceptance alerts are for).
- `stuck`: its prepare Job runs past spec.stages.prepare.activeDeadlineSeconds (nobody ends it): its pod
  cannot pull its image (ImagePullBackOff), the pod the operator reports in blockedBy and Eagle3PodNotRunning.
- `broken`: its prepare Job fails with an error (backoffLimit 0) as soon as it starts, before Prometheus first
  scrapes the operator (`fail_fast`, see tier.py): the first sample of its failure counter is already 1, the
  case `increase()` misses, and Eagle3StageFailed must fire for it all the same. The run fails.
- `training`: prepare, extract and vocab succeed; its train Job runs (the real train stage of stage_stack
  reports its progress as this run's): the running stage whose expected time comes from its pod's ETA.
- `hung`: regenerates (generate stage); its prepare succeeds and its generate Job runs (stage_stack's
  generate that waits on a hung vLLM): a running stage without an ETA.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import aiohttp
import kmock
from prometheus_client import start_http_server

from eagle3_operator.metrics import OperatorMetrics
from eagle3_pipeline.serving.vllm_server import free_port
from tests.harness.cluster import (
    NS,
    WAIT_BOUND_S,
    Cluster,
    Emulator,
    JobPlayer,
    declare_resources,
    eventually,
    now,
    running_operator,
)
from tests.harness.results import fake_result
from tests.harness.scenario import tiny, wait_job, wait_phase

T = TypeVar("T")
NAMESPACE = NS
STUCK_DEADLINE_S = 2
LIVE_RUNS = ("training", "hung")  # runs whose running stage is a real stage program (stage_stack)
RUNNING_S = 3.0  # how long `bad`'s OOM Job runs first: Prometheus (1 s scrapes) sees its counters at 0 first
# Bounds, not speeds: a step that is met returns at once. The operator shares 2 cores with two vLLM servers
# starting, Prometheus and the stage programs here, and with two busy loops beside the suite the whole
# scenario before evaluation outlasted 60 s once the servers were up.
CALL_TIMEOUT_S = 300.0
# how long the next stage's Job may take to appear (10 s once ran out after evaluate, 30 s was the next bound)
JOB_WAIT_S = WAIT_BOUND_S
RESYNC_S = 2.0  # a canary under observation is reconciled (its figures read) this often (canary_stack)
LAST_FAILURE = "eagle3_run_stage_last_failure_timestamp_seconds"


def spec_of(run: str, model: str) -> dict[str, Any]:
    """The runs' specs: the tiny scenario's, over `model`, with each run's own stage settings."""
    stages: dict[str, dict[str, Any]] = {
        "bad": {"extract": {"backoffLimit": 0}},
        "stuck": {"prepare": {"activeDeadlineSeconds": STUCK_DEADLINE_S}},
        "broken": {"prepare": {"backoffLimit": 0}},
    }.get(run, {})
    regeneration = {"enabled": run == "hung"}
    return tiny(
        verifier={"model": model},
        evaluation={"minAcceptanceLength": 1.1},
        stages=stages,
        regeneration=regeneration,
    )


class OperatorStack:
    """kmock, the operator and its metrics endpoint, in an event loop of their own."""

    def __init__(self) -> None:
        self.metrics = OperatorMetrics()
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="operator", daemon=True)
        self.stack = AsyncExitStack()
        self.cluster: Cluster | None = None
        self.player: JobPlayer | None = None
        self._http: Any = None

    @property
    def metrics_target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT_S) -> T:
        """Run `coro` in the operator's loop and wait for its result."""
        return self.submit(coro).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Run `coro` in the operator's loop; its result comes later."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def start(self) -> None:
        self.thread.start()
        try:
            self.call(self._enter())
            self.port = free_port()
            self._http = start_http_server(self.port, addr="127.0.0.1", registry=self.metrics.registry)
        except BaseException:
            self.close()
            raise

    async def _enter(self) -> None:
        mock = await self.stack.enter_async_context(Emulator())
        await self.stack.enter_async_context(kmock.Server(mock))
        declare_resources(mock)
        await mock.get("/version")  # warm the connection before kopf starts
        session = await self.stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        )
        self.cluster = Cluster(session, str(mock.url))
        self.player = JobPlayer(self.cluster)
        await self.stack.enter_async_context(
            running_operator(str(mock.url), self.metrics, resync_seconds=RESYNC_S)
        )

    def close(self) -> None:
        """Stop the metrics endpoint, the operator and the mock, then the loop and its thread."""
        if self._http is not None:
            server, thread = self._http
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)
            self._http = None
        if self.thread.is_alive():
            with contextlib.suppress(Exception):
                self.call(self.stack.aclose())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)
        if not self.loop.is_running():
            self.loop.close()

    # --- the scenario ---------------------------------------------------------------------------------------

    async def fail_fast(self, model: str) -> None:
        """`broken` created and failed at once; returns when the operator has counted the failure."""
        assert self.cluster is not None
        await self.cluster.apply_run("broken", spec_of("broken", model))
        await self._broken()
        labels = {"namespace": NAMESPACE, "run": "broken", "stage": "prepare", "reason": "Error"}

        async def counted() -> float | None:
            return self.metrics.registry.get_sample_value(LAST_FAILURE, labels)

        await eventually(counted, what="the operator counting broken's failure")

    async def before_evaluation(self, model: str) -> None:
        """The other runs created; good and bad wait at evaluate, stuck stays where it is."""
        assert self.cluster is not None
        for run in ("good", "bad", "stuck", *LIVE_RUNS):
            await self.cluster.apply_run(run, spec_of(run, model))
        await asyncio.gather(
            self._stuck(),
            self._good_until_evaluate(),
            self._bad_until_evaluate(),
            self._running("training", ("prepare", "extract", "vocab"), "train"),
            self._running("hung", ("prepare",), "generate"),
        )

    async def _succeed(self, run: str, stage: str, result: dict[str, Any]) -> None:
        assert self.cluster is not None and self.player is not None
        job = await wait_job(self.cluster, run, stage, JOB_WAIT_S)
        await self._start_job(job)
        await self.player.succeed(job, result)

    async def _start_job(self, job: dict[str, Any]) -> None:
        """The Job controller's part: the Job's pod is running."""
        assert self.cluster is not None
        status = {"status": {"active": 1, "startTime": now()}}
        await self.cluster.patch("batch/v1", "jobs", job["metadata"]["name"], status, "status")

    async def _good_until_evaluate(self) -> None:
        for stage in ("prepare", "extract", "vocab", "train"):
            await self._succeed("good", stage, fake_result(stage))

    async def _running(self, run: str, done: tuple[str, ...], running: str) -> None:
        """`done` succeed; the Job of `running` starts and runs (its program is stage_stack's)."""
        assert self.cluster is not None
        for stage in done:
            await self._succeed(run, stage, fake_result(stage))
        await self._start_job(await wait_job(self.cluster, run, running, JOB_WAIT_S))

    async def _bad_until_evaluate(self) -> None:
        assert self.cluster is not None and self.player is not None
        await self._succeed("bad", "prepare", fake_result("prepare"))
        first = await wait_job(self.cluster, "bad", "extract", JOB_WAIT_S)
        await self._start_job(first)
        await asyncio.sleep(RUNNING_S)
        await self.player.fail(
            first, "CUDA out of memory", reason="OOMKilled", exit_code=137, job_reason="PodFailurePolicy"
        )
        for stage in ("extract", "vocab", "train"):  # extract: the retry at half the budget
            await self._succeed("bad", stage, fake_result(stage))

    async def _stuck(self) -> None:
        assert self.cluster is not None and self.player is not None
        job = await wait_job(self.cluster, "stuck", "prepare", JOB_WAIT_S)
        await self.player.stall(
            job, "ImagePullBackOff", 'Back-off pulling image "eagle3-operator/pipeline:0.1.0"'
        )

    async def _broken(self) -> None:
        assert self.cluster is not None and self.player is not None
        job = await wait_job(self.cluster, "broken", "prepare", JOB_WAIT_S)
        await self._start_job(job)  # and fails at once (see the module doc)
        await self.player.fail(
            job, "Traceback (most recent call last):\nValueError: row 17 has no assistant turn"
        )
        await wait_phase(self.cluster, "broken", "Failed")

    async def to_serving(
        self, evaluations: dict[str, dict[str, Any]], exports: dict[str, dict[str, Any]]
    ) -> None:
        """Succeed evaluate and export of each run with the results given; its Deployment becomes ready."""
        await asyncio.gather(*(self._serve(run, evaluations[run], exports[run]) for run in evaluations))

    async def _serve(self, run: str, evaluation: dict[str, Any], export: dict[str, Any]) -> None:
        assert self.cluster is not None and self.player is not None
        cluster = self.cluster
        await self._succeed(run, "evaluate", evaluation)
        await self._succeed(run, "export", export)
        deployment = await eventually(lambda: cluster.deployment(run), what=f"the vLLM Deployment of {run}")
        await self.player.ready(deployment)
        await wait_phase(cluster, run, "Serving")

    async def phases(self) -> dict[str, str]:
        assert self.cluster is not None
        out = {}
        for run in ("good", "bad", "stuck", "broken", *LIVE_RUNS):
            out[run] = ((await self.cluster.run(run)).get("status") or {}).get("phase", "")
        return out

"""The running step of the scale benchmark: every run's stage pod runs and reports progress for a while.

Each run's extract Job gets a running pod at a loopback address of its own (127.1.x.y); one aiohttp server in
this process listens on all of them at the contract's metrics port and answers each address with the
exposition of that run's own StageReporter (the pipeline's reporter, as a stage program serves it), which
advances every second. The operator reads them as it reads stage pods in a cluster; what the benchmark
counts is the status writes that causes (the mock counts every PATCH of eagle3runs/status, which kmock
calls an UPDATE).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from tests.harness.cluster import Cluster, JobPlayer

from eagle3_contract.stage_metrics import METRICS_PATH, METRICS_PORT
from eagle3_pipeline.runtime.reporter import StageReporter

ROWS = 10**6  # far more than a window reaches: the stage stays running


def address(i: int) -> str:
    """The loopback address of run number i's pod (127.1.0.1, ...; 250 per third octet)."""
    return f"127.1.{i // 250}.{i % 250 + 1}"


@contextlib.asynccontextmanager
async def endpoints(reporters: dict[str, StageReporter]) -> AsyncIterator[None]:
    """/metrics of each reporter at its address (the dict's key), port METRICS_PORT, until the block ends."""

    async def metrics(request: web.Request) -> web.Response:
        host = request.transport.get_extra_info("sockname")[0] if request.transport else ""
        reporter = reporters.get(host)
        if reporter is None:
            raise web.HTTPNotFound()
        return web.Response(body=reporter.exposition().encode(), content_type="text/plain")

    app = web.Application()
    app.router.add_get(METRICS_PATH, metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        for ip in reporters:
            await web.TCPSite(runner, ip, METRICS_PORT).start()
        yield
    finally:
        await runner.cleanup()


async def report_progress(
    cluster: Cluster, jobs: dict[str, dict[str, Any]], window: float, writes: Callable[[], int]
) -> tuple[int, float]:
    """Run each run's Job pod (jobs: run -> its extract Job) with a reporter advancing every second, for
    `window` seconds; the status writes (`writes()`) made meanwhile, and the window's length."""
    player = JobPlayer(cluster)
    reporters = {address(i): StageReporter("extract", log_seconds=1e9) for i in range(len(jobs))}
    for reporter in reporters.values():
        reporter.begin("samples", ROWS)
    async with endpoints(reporters):
        for ip, job in zip(reporters, jobs.values(), strict=True):
            await player.run(job, ip)
        before, started = writes(), time.monotonic()
        while time.monotonic() - started < window:
            await asyncio.sleep(1.0)
            for reporter in reporters.values():
                reporter.advance(10, tokens=2000)
        return writes() - before, time.monotonic() - started

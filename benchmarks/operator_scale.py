"""Operator scale against the API mock: N Eagle3Runs created at once, how fast the operator keeps up.

    python benchmarks/operator_scale.py --runs 10 100 500 [--json out.json]

For each N: a fresh kmock API server in this process (with the load generator), the real operator in a child
process (benchmarks/operator_child.py), so its RSS and CPU are its own. Measured:

* first Job: from a run's creation (its POST returned) to the operator's POST of its prepare Job;
* transition: from the prepare Job's completion (pod + Job status written, as the Job controller would) to
  the operator's POST of the run's extract Job, all N completed at once after the operator went quiet;
* the operator's peak RSS (VmHWM), CPU seconds and requests; this process's CPU (mock + load generator).

Job POSTs are timestamped inside the mock's request handler, so nothing polls the API.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kmock

from eagle3_operator.builders import names
from eagle3_operator.testing.cluster import Cluster, Emulator, JobPlayer, declare_resources
from eagle3_operator.testing.scenario import RESULTS, tiny

logger = logging.getLogger(__name__)

CHILD = Path(__file__).with_name("operator_child.py")
USER_AGENT = "eagle3-bench"
IN_FLIGHT = 64
QUIET_SECONDS = 1.0
# The watches the operator opens (kopf's indexes and handlers); the runs are created once all are open.
WATCHED = {"eagle3runs", "jobs", "pods", "deployments", "services", "configmaps", "persistentvolumeclaims"}


@dataclass
class Probe:
    """What the mock saw: Job POSTs by stage and run (with a timestamp), the operator's requests."""

    jobs: dict[str, dict[str, float]] = field(default_factory=dict)
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)
    watched: set[str] = field(default_factory=set)
    last_request: float = 0.0
    handled_seconds: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def job_posted(self, data: dict[str, Any]) -> None:
        labels = data["metadata"].get("labels") or {}
        run, stage = labels.get(names.LABEL_RUN, ""), labels.get(names.LABEL_STAGE, "")
        self.jobs.setdefault(stage, {}).setdefault(run, time.monotonic())
        if stage == "prepare":
            self.bodies.setdefault(run, data)
        self.changed.set()

    async def wait(self, check: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not check():
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.2))
        return True


class BenchEmulator(Emulator):
    """The tests' Emulator, plus a Probe fed from inside the request handler."""

    probe: Probe

    async def _handle(self, request: Any) -> Any:
        probe = self.probe
        ours = request.headers.get("User-Agent", "").startswith(USER_AGENT)
        plural = getattr(request.resource, "plural", None) or "-"
        if not ours:
            probe.requests[f"{request.method.name if request.method else '?'} {plural}"] += 1
            probe.last_request = time.monotonic()
        if request.action == kmock.action.WATCH:
            probe.watched.add(plural)
            probe.changed.set()
            return await super()._handle(request)
        started = time.perf_counter()
        response = await super()._handle(request)
        probe.handled_seconds += time.perf_counter() - started
        if request.action == kmock.action.CREATE and plural == "jobs" and response.status < 300:
            probe.job_posted(request.data)
        return response


@dataclass
class Figures:
    runs: int
    wall_s: float
    first_job_p50_s: float
    first_job_p99_s: float
    first_job_max_s: float
    transition_p50_s: float
    transition_p99_s: float
    transition_max_s: float
    create_s: float
    operator_requests: int
    operator_cpu_s: float
    bench_cpu_s: float
    mock_handling_s: float
    operator_rss_start_mb: float
    operator_peak_rss_mb: float
    first_jobs_seen: int
    transitions_seen: int
    requests_by_kind: dict[str, int]
    operator_log_warnings: int


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (p99 of 10 values is the maximum); NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def proc_status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def bounded(items: Sequence[str], step: Callable[[str], Awaitable[None]]) -> None:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(item: str) -> None:
        async with gate:
            await step(item)

    await asyncio.gather(*(one(item) for item in items))


@contextlib.asynccontextmanager
async def operator_process(url: str, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """The operator in a child process, started and READY; stopped (SIGTERM, then SIGKILL) on exit."""
    with log.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), url, stdout=asyncio.subprocess.PIPE, stderr=stderr
        )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if line.strip() != b"READY":
            raise RuntimeError(f"the operator did not start; see {log}")
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def quiet(probe: Probe, seconds: float, timeout: float) -> None:
    """Until the operator has sent no request for `seconds` (its backlog from the last step is done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and time.monotonic() - probe.last_request < seconds:
        await asyncio.sleep(0.1)


async def drive(
    cluster: Cluster, probe: Probe, runs: list[str], timeout: float
) -> tuple[dict[str, float], dict[str, float], float]:
    """Create the runs, wait for their prepare Jobs, complete those, wait for the extract Jobs."""
    created: dict[str, float] = {}
    completed: dict[str, float] = {}
    player = JobPlayer(cluster)

    async def create(run: str) -> None:
        await cluster.apply_run(run, tiny())
        created[run] = time.monotonic()

    async def complete(run: str) -> None:
        await player.succeed(probe.bodies[run], RESULTS["prepare"])
        completed[run] = time.monotonic()

    started = time.monotonic()
    await bounded(runs, create)
    create_s = time.monotonic() - started
    n = len(runs)
    if not await probe.wait(lambda: len(probe.jobs.get("prepare", {})) >= n, timeout):
        logger.warning("only %d of %d prepare Jobs within %.0f s", len(probe.jobs.get("prepare", {})), n, timeout)
    await quiet(probe, QUIET_SECONDS, timeout)
    await bounded([r for r in runs if r in probe.bodies], complete)
    if not await probe.wait(lambda: len(probe.jobs.get("extract", {})) >= len(completed), timeout):
        logger.warning("only %d of %d extract Jobs within %.0f s", len(probe.jobs.get("extract", {})), n, timeout)
    return created, completed, create_s


def latencies(probe: Probe, stage: str, since: dict[str, float]) -> list[float]:
    seen = probe.jobs.get(stage, {})
    return [seen[run] - t for run, t in since.items() if run in seen]


async def measure(n: int, timeout: float) -> Figures:
    """One benchmark round: a fresh mock API server and a fresh operator, N runs."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "operator.log"
        async with BenchEmulator() as mock, kmock.Server(mock) as server:
            mock.probe = probe = Probe()
            declare_resources(mock)
            async with (
                aiohttp.ClientSession(
                    headers={"User-Agent": USER_AGENT}, connector=aiohttp.TCPConnector(limit=IN_FLIGHT)
                ) as session,
                operator_process(str(server.url), log) as proc,
            ):
                await probe.wait(lambda: WATCHED <= probe.watched, 30)
                await quiet(probe, QUIET_SECONDS, 30)
                rss_start = proc_status_kb(proc.pid, "VmRSS")
                cpu_before, bench_before = proc_cpu_seconds(proc.pid), time.process_time()
                requests_before, handled_before = probe.requests.copy(), probe.handled_seconds
                started = time.monotonic()
                runs = [f"bench-{i:04d}" for i in range(n)]
                created, completed, create_s = await drive(Cluster(session, str(server.url)), probe, runs, timeout)
                wall = time.monotonic() - started
                peak, cpu = proc_status_kb(proc.pid, "VmHWM"), proc_cpu_seconds(proc.pid) - cpu_before
                bench_cpu = time.process_time() - bench_before
        warnings_logged = sum(1 for line in log.read_text().splitlines() if line.startswith(("WARN", "ERROR")))
    first, transition = latencies(probe, "prepare", created), latencies(probe, "extract", completed)
    requests = probe.requests - requests_before
    return Figures(
        runs=n, wall_s=wall,
        first_job_p50_s=percentile(first, 50), first_job_p99_s=percentile(first, 99),
        first_job_max_s=max(first, default=math.nan),
        transition_p50_s=percentile(transition, 50), transition_p99_s=percentile(transition, 99),
        transition_max_s=max(transition, default=math.nan),
        create_s=create_s, operator_requests=sum(requests.values()),
        operator_cpu_s=cpu, bench_cpu_s=bench_cpu, mock_handling_s=probe.handled_seconds - handled_before,
        operator_rss_start_mb=rss_start / 1024, operator_peak_rss_mb=peak / 1024,
        first_jobs_seen=len(first), transitions_seen=len(transition),
        requests_by_kind=dict(requests.most_common()), operator_log_warnings=warnings_logged,
    )  # fmt: skip


HEADER = (
    "| runs | wall s | create s | first Job p50 / p99 / max s | transition p50 / p99 / max s "
    "| operator requests | operator CPU s | mock+load CPU s | operator RSS start / peak MB |\n"
    "|---:|---:|---:|---|---|---:|---:|---:|---|"
)


def row(f: Figures) -> str:
    first = f"{f.first_job_p50_s:.2f} / {f.first_job_p99_s:.2f} / {f.first_job_max_s:.2f}"
    trans = f"{f.transition_p50_s:.2f} / {f.transition_p99_s:.2f} / {f.transition_max_s:.2f}"
    missing = ""
    if f.first_jobs_seen < f.runs or f.transitions_seen < f.runs:
        missing = f" (only {f.first_jobs_seen} first Jobs, {f.transitions_seen} transitions)"
    return (
        f"| {f.runs}{missing} | {f.wall_s:.1f} | {f.create_s:.1f} | {first} | {trans} | {f.operator_requests} "
        f"| {f.operator_cpu_s:.1f} | {f.bench_cpu_s:.1f} "
        f"| {f.operator_rss_start_mb:.0f} / {f.operator_peak_rss_mb:.0f} |"
    )


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, nargs="+", default=[10, 100, 500], help="N per round")
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per step before giving up")
    args = parser.parse_args(argv)
    results = []
    print(HEADER, flush=True)
    for n in args.runs:
        figures = await measure(n, args.timeout)
        results.append(figures)
        print(row(figures), flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    raise SystemExit(asyncio.run(main()))

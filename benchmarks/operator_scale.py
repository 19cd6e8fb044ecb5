"""Operator scale against the API mock: N Eagle3Runs created at once, how fast the operator keeps up.

    python benchmarks/operator_scale.py --runs 10 100 500 [--json out.json] [--server apiserver]

For each N: a fresh kmock API server in this process (with the load generator), the real operator in a child
process (benchmarks/operator_child.py), so its RSS and CPU are its own. (`--server apiserver`: a real
kube-apiserver instead, see scale_apiserver.py.) Measured:

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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kmock
from scale_common import (
    IN_FLIGHT,
    QUIET_SECONDS,
    USER_AGENT,
    bounded,
    operator_process,
    percentile,
    proc_cpu_seconds,
    proc_status_kb,
    read_log,
)
from scale_progress import report_progress
from tests.harness.cluster import Cluster, JobPlayer, declare_resources
from tests.harness.counting import CountingEmulator
from tests.harness.results import fake_result
from tests.harness.scenario import tiny

from eagle3_operator.builders import names

logger = logging.getLogger(__name__)

# The watches the operator opens (kopf's indexes and handlers); the runs are created once all are open.
WATCHED = {"eagle3runs", "jobs", "pods", "deployments", "services", "configmaps", "persistentvolumeclaims"}
STATUS_WRITES = "UPDATE eagle3runs/status (handlers)"  # kmock names a PATCH an UPDATE


@dataclass
class Probe:
    """What the mock saw: Job POSTs by stage and run (with a timestamp), the operator's requests."""

    jobs: dict[str, dict[str, float]] = field(default_factory=dict)
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    extract_bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    job_names: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    watched: set[str] = field(default_factory=set)
    last_request: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def job_posted(self, data: dict[str, Any]) -> None:
        labels = data["metadata"].get("labels") or {}
        run, stage = labels.get(names.LABEL_RUN, ""), labels.get(names.LABEL_STAGE, "")
        self.jobs.setdefault(stage, {}).setdefault(run, time.monotonic())
        self.job_names.setdefault((run, stage), set()).add(data["metadata"]["name"])
        if stage == "prepare":
            self.bodies.setdefault(run, data)
        if stage == "extract":
            self.extract_bodies.setdefault(run, data)
        self.changed.set()

    def status_writes(self) -> int:
        """The operator's PATCHes of eagle3runs/status (its handlers'; kopf's own bookkeeping apart)."""
        return sum(n for what, n in self.requests.items() if what == STATUS_WRITES)

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


class BenchEmulator(CountingEmulator):
    """The tests' counting mock (tests/harness/counting.py: a short memory, requests tallied by kind), plus
    a Probe fed from inside the request handler."""

    probe: Probe
    driver_agent = USER_AGENT

    async def _observe(self, request: Any) -> Any:
        probe = self.probe
        what = self.kind_of(request)
        if what is not None:
            probe.requests[what] += 1
            probe.last_request = time.monotonic()
        if request.action == kmock.action.WATCH:
            probe.watched.add(getattr(request.resource, "plural", None) or "-")
            probe.changed.set()
            return await self._serve(request)
        try:
            response = await self._serve(request)
        except kmock.KubernetesError as err:
            labels = (request.data.get("metadata") or {}).get("labels") or {} if request.data else {}
            stage = labels.get(names.LABEL_STAGE, "")
            probe.refused[f"{err.status} {what or 'load generator'} {stage}".rstrip()] += 1
            raise
        plural = getattr(request.resource, "plural", None)
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
    operator_cpu_first_s: float
    operator_cpu_transition_s: float
    bench_cpu_s: float
    operator_rss_start_mb: float
    operator_peak_rss_mb: float
    first_jobs_seen: int
    transitions_seen: int
    requests_by_kind: dict[str, int]
    refused: dict[str, int]
    duplicate_jobs: int
    reconciles_ok: int
    reconciles_error: int
    reconcile_seconds: float
    operator_log_lines: int
    operator_log_warnings: list[str]
    status_writes: int = 0  # the operator's status PATCHes over the round
    progress_writes: int = 0  # of which while every run's stage reported progress
    progress_window_s: float = 0.0
    load_average: list[float] = field(default_factory=list)  # 1, 5, 15 min at the end of the round


async def quiet(probe: Probe, seconds: float, timeout: float) -> None:
    """Until the operator has sent no request for `seconds` (its backlog from the last step is done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and time.monotonic() - probe.last_request < seconds:
        await asyncio.sleep(0.1)


@dataclass
class Driven:
    """When each run was created and its prepare Job completed; the operator's CPU between the steps."""

    created: dict[str, float] = field(default_factory=dict)
    completed: dict[str, float] = field(default_factory=dict)
    create_s: float = 0.0
    cpu_first_s: float = 0.0
    cpu_transition_s: float = 0.0
    progress_writes: int = 0
    progress_window_s: float = 0.0


async def drive(
    cluster: Cluster,
    probe: Probe,
    runs: list[str],
    timeout: float,
    cpu: Callable[[], float],
    window: float = 0.0,
) -> Driven:
    """Create the runs, wait for their prepare Jobs, complete those, wait for the extract Jobs; then, for
    `window` seconds, their pods run and report progress (scale_progress.py)."""
    out, player, n = Driven(), JobPlayer(cluster), len(runs)

    async def create(run: str) -> None:
        await cluster.apply_run(run, tiny())
        out.created[run] = time.monotonic()

    async def complete(run: str) -> None:
        await player.succeed(probe.bodies[run], fake_result("prepare"))
        out.completed[run] = time.monotonic()

    started, cpu_started = time.monotonic(), cpu()
    await bounded(runs, create)
    out.create_s = time.monotonic() - started
    if not await probe.wait(lambda: len(probe.jobs.get("prepare", {})) >= n, timeout):
        logger.warning("%d of %d prepare Jobs in %.0f s", len(probe.jobs.get("prepare", {})), n, timeout)
    await quiet(probe, QUIET_SECONDS, timeout)
    cpu_quiet = cpu()
    out.cpu_first_s = cpu_quiet - cpu_started
    await bounded([r for r in runs if r in probe.bodies], complete)
    if not await probe.wait(lambda: len(probe.jobs.get("extract", {})) >= len(out.completed), timeout):
        done = len(probe.jobs.get("extract", {}))
        logger.warning("%d of %d extract Jobs in %.0f s", done, len(out.completed), timeout)
    out.cpu_transition_s = cpu() - cpu_quiet
    if window > 0:
        await quiet(probe, QUIET_SECONDS, timeout)
        jobs = {run: probe.extract_bodies[run] for run in runs if run in probe.extract_bodies}
        out.progress_writes, out.progress_window_s = await report_progress(
            cluster, jobs, window, probe.status_writes
        )
    return out


def latencies(probe: Probe, stage: str, since: dict[str, float]) -> list[float]:
    seen = probe.jobs.get(stage, {})
    return [seen[run] - t for run, t in since.items() if run in seen]


@dataclass
class Sample:
    """The raw outcome of one round, before the percentiles."""

    n: int
    driven: Driven
    wall_s: float
    bench_cpu_s: float
    rss_start_kb: int
    rss_peak_kb: int
    requests: Counter[str]
    refused: Counter[str]


async def run_round(
    mock: BenchEmulator,
    url: str,
    log: Path,
    n: int,
    timeout: float,
    window: float = 0.0,
    operator_args: Sequence[str] = (),
) -> Sample:
    """The operator (operator_child.py with `operator_args`) started against `url`; N runs driven through
    their first transition."""
    probe = mock.probe
    async with (
        aiohttp.ClientSession(
            headers={"User-Agent": USER_AGENT}, connector=aiohttp.TCPConnector(limit=IN_FLIGHT)
        ) as session,
        operator_process(url, log, *operator_args) as proc,
    ):
        await probe.wait(lambda: probe.watched >= WATCHED, 30)
        await quiet(probe, QUIET_SECONDS, 30)
        rss_start = proc_status_kb(proc.pid, "VmRSS")
        bench_before = time.process_time()
        requests_before, refused_before = probe.requests.copy(), probe.refused.copy()
        started = time.monotonic()
        runs = [f"bench-{i:04d}" for i in range(n)]
        driven = await drive(
            Cluster(session, url), probe, runs, timeout, lambda: proc_cpu_seconds(proc.pid), window
        )
        return Sample(
            n=n, driven=driven, wall_s=time.monotonic() - started,
            bench_cpu_s=time.process_time() - bench_before,
            rss_start_kb=rss_start, rss_peak_kb=proc_status_kb(proc.pid, "VmHWM"),
            requests=probe.requests - requests_before, refused=probe.refused - refused_before,
        )  # fmt: skip


async def measure(
    n: int, timeout: float, log: Path, window: float = 0.0, operator_args: Sequence[str] = ()
) -> Figures:
    """One benchmark round: a fresh mock API server and a fresh operator, N runs."""
    async with BenchEmulator() as mock, kmock.Server(mock) as server:
        mock.probe = Probe()
        declare_resources(mock)
        sample = await run_round(mock, str(server.url), log, n, timeout, window, operator_args)
    oplog = read_log(log)
    reconciles = oplog.reconciles
    driven = sample.driven
    first = latencies(mock.probe, "prepare", driven.created)
    transition = latencies(mock.probe, "extract", driven.completed)
    return Figures(
        runs=n, wall_s=sample.wall_s, create_s=driven.create_s,
        first_job_p50_s=percentile(first, 50), first_job_p99_s=percentile(first, 99),
        first_job_max_s=max(first, default=math.nan),
        transition_p50_s=percentile(transition, 50), transition_p99_s=percentile(transition, 99),
        transition_max_s=max(transition, default=math.nan),
        operator_requests=sum(sample.requests.values()),
        operator_cpu_first_s=driven.cpu_first_s, operator_cpu_transition_s=driven.cpu_transition_s,
        bench_cpu_s=sample.bench_cpu_s,
        operator_rss_start_mb=sample.rss_start_kb / 1024, operator_peak_rss_mb=sample.rss_peak_kb / 1024,
        first_jobs_seen=len(first), transitions_seen=len(transition),
        requests_by_kind=dict(sample.requests.most_common()), refused=dict(sample.refused.most_common()),
        duplicate_jobs=sum(1 for found in mock.probe.job_names.values() if len(found) > 1),
        reconciles_ok=int(reconciles.get("ok", 0)), reconciles_error=int(reconciles.get("error", 0)),
        reconcile_seconds=reconciles.get("seconds", math.nan), operator_log_lines=len(oplog.lines),
        operator_log_warnings=oplog.warnings,
        status_writes=sample.requests.get(STATUS_WRITES, 0), progress_writes=driven.progress_writes,
        progress_window_s=driven.progress_window_s, load_average=list(os.getloadavg()),
    )  # fmt: skip


HEADER = (
    "| runs | wall s | create s | first Job p50 / p99 / max s | transition p50 / p99 / max s "
    "| operator requests | operator CPU s (first / transition) | mock+load CPU s "
    "| operator RSS start / peak MB | status writes per run (round / progress window) "
    "| runs with two Job names for a stage | load average (1 / 5 min) |\n"
    "|---:|---:|---:|---|---|---:|---|---:|---|---|---:|---|"
)


def row(f: Figures) -> str:
    first = f"{f.first_job_p50_s:.2f} / {f.first_job_p99_s:.2f} / {f.first_job_max_s:.2f}"
    trans = f"{f.transition_p50_s:.2f} / {f.transition_p99_s:.2f} / {f.transition_max_s:.2f}"
    missing = ""
    if f.first_jobs_seen < f.runs or f.transitions_seen < f.runs:
        missing = f" (first Jobs seen: {f.first_jobs_seen}, transitions: {f.transitions_seen})"
    return (
        f"| {f.runs}{missing} | {f.wall_s:.1f} | {f.create_s:.1f} | {first} | {trans} "
        f"| {f.operator_requests} | {f.operator_cpu_first_s:.1f} / {f.operator_cpu_transition_s:.1f} "
        f"| {f.bench_cpu_s:.1f} "
        f"| {f.operator_rss_start_mb:.0f} / {f.operator_peak_rss_mb:.0f} "
        f"| {f.status_writes / f.runs:.2f} / {f.progress_writes / f.runs:.2f} "
        f"in {f.progress_window_s:.0f} s | {f.duplicate_jobs} "
        f"| {f.load_average[0]:.1f} / {f.load_average[1]:.1f} |"
    )


@dataclass
class Mode:
    """One kind of server: its table header, a round (N, timeout, log, round number), a table row."""

    header: str
    measure: Callable[[int, float, Path, int], Awaitable[Any]]
    row: Callable[[Any], str]


def measure_mock(
    window: float, operator_args: Sequence[str]
) -> Callable[[int, float, Path, int], Awaitable[Figures]]:
    async def measure_round(n: int, timeout: float, log: Path, _round: int) -> Figures:
        return await measure(n, timeout, log, window, operator_args)

    return measure_round


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, nargs="+", default=[10, 100, 500], help="N per round")
    parser.add_argument("--repeat", type=int, default=1, help="rounds per N (one table row each)")
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    parser.add_argument("--logs", type=Path, help="keep the operator's log of each round in this folder")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per step before giving up")
    parser.add_argument(
        "--server", choices=["mock", "apiserver"], default="mock",
        help="the kmock API mock in this process, or a real kube-apiserver (tests/operator/apiserver.py)",
    )  # fmt: skip
    parser.add_argument(
        "--progress-window", type=float, default=120.0,
        help="seconds every run's extract pod runs and reports progress after the transition (0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--watch-seconds", type=int,
        help="the operator's watch timeout (its --watch-seconds). Default: the operator's own (8) against a "
        "real API server; 0 against the mock, as the tests run the operator there: kmock ignores the timeout "
        "and replays every object at each connect, so a bounded watch re-lists everything every ~10 s, which "
        "no real server does (--watch-seconds 8 measures that stress)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.server == "apiserver":
        import scale_apiserver  # imports the test suite's server helpers; only wanted here

        watch = () if args.watch_seconds is None else ("--watch-seconds", str(args.watch_seconds))
        mode = Mode(scale_apiserver.HEADER, await scale_apiserver.start(watch), scale_apiserver.row)
    else:
        watch = ("--watch-seconds", str(0 if args.watch_seconds is None else args.watch_seconds))
        mode = Mode(HEADER, measure_mock(args.progress_window, watch), row)
    results = []
    print(mode.header, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        for i, n in enumerate(n for n in args.runs for _ in range(args.repeat)):
            figures = await mode.measure(n, args.timeout, logs / f"operator-{i}-{n}.log", i)
            results.append(figures)
            print(mode.row(figures), flush=True)
            if args.json:  # after each round: a later one may fail
                args.json.write_text(json.dumps([asdict(f) for f in results], indent=2) + "\n")
            for line in figures.operator_log_warnings[:3]:
                if (
                    "Unresolved resources" not in line
                ):  # PodMonitors: no Prometheus operator here, as designed
                    logger.warning("operator: %s", line[:300])
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("eagle3_pipeline.runtime.reporter").setLevel(
        logging.WARNING
    )  # the scale_progress reporters
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    raise SystemExit(asyncio.run(main()))

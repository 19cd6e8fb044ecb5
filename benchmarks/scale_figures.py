"""The figures of a round against a real kube-apiserver (scale_apiserver.py), and its table row."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scale_common import OperatorLog, percentile

MB = 1024  # kB


@dataclass
class Sample:
    """The raw outcome of one round: timestamps (monotonic s), CPU seconds by process, memory in kB."""

    n: int
    wall_s: float
    created: dict[str, float]
    completed: dict[str, float]
    create_s: float
    # CPU s by process (and "wall": s since creation) at creation, at the last first Job,
    # once quiet after the first Jobs, at the last extract Job
    cpu: list[dict[str, float]]
    rss_start_kb: int
    memory_kb: dict[str, tuple[int, int]]  # VmRSS, VmHWM by process, at the end of the round
    jobs: dict[str, dict[str, float]]  # stage -> run -> the Job's ADDED event
    complete: dict[str, float]  # Job name -> its first event with the Complete condition
    prepare: dict[str, str]  # run -> its prepare Job
    job_names: dict[tuple[str, str], set[str]]
    load: tuple[float, float, float]  # the machine's load average at the end of the round
    watch_restarts: int  # this process's watches resumed: the events they missed were timestamped late
    requests: dict[str, int]  # the operator's requests over the round by kind (`get eagle3runs`), audited


@dataclass
class ServerFigures:
    runs: int
    wall_s: float
    create_s: float
    first_job_s: list[float]  # p50, p99, max
    transition_s: list[float]
    job_controller_s: list[float]  # pod finished -> its Job Complete (the real Job controller)
    after_complete_s: list[float]  # Job Complete -> the extract Job (the operator)
    burst_s: float  # from the first creation to the last first Job
    burst_cpu_s: dict[str, float]  # CPU s in the burst, by process (operator, apiserver, etcd, ...)
    operator_cpu_first_s: float  # from creation until quiet (includes reacting to the Job controller's pods)
    operator_cpu_transition_s: float
    cpu_s: dict[str, float]  # the whole round, by process (apiserver, etcd, controller-manager, bench)
    operator_rss_start_mb: float
    rss_mb: dict[str, float]  # at the end of the round, by process
    peak_rss_mb: dict[str, float]  # VmHWM: the server's since it started (all rounds so far)
    first_jobs_seen: int
    transitions_seen: int
    duplicate_jobs: int
    reconciles_ok: int
    reconciles_error: int
    reconcile_seconds: float
    operator_log_lines: int
    operator_log_warnings: list[str]
    load_average: list[float]  # 1, 5, 15 minutes, at the end of the round (the machine is shared)
    watch_restarts: int
    requests_by_kind: dict[str, int]  # the operator's, over the round, from the server's audit log
    operator_requests: int  # of them, all but watches


def stats(values: list[float]) -> list[float]:
    return [percentile(values, 50), percentile(values, 99), max(values, default=math.nan)]


def between(start: dict[str, float], end: dict[str, float]) -> list[float]:
    return [end[key] - t for key, t in start.items() if key in end]


def figures(s: Sample, oplog: OperatorLog) -> ServerFigures:
    first = between(s.created, s.jobs.get("prepare", {}))
    transition = between(s.completed, s.jobs.get("extract", {}))
    complete = {run: s.complete[job] for run, job in s.prepare.items() if job in s.complete}
    start, burst, quiet, end = s.cpu
    return ServerFigures(
        runs=s.n, wall_s=s.wall_s, create_s=s.create_s, first_job_s=stats(first),
        transition_s=stats(transition), job_controller_s=stats(between(s.completed, complete)),
        after_complete_s=stats(between(complete, s.jobs.get("extract", {}))),
        burst_s=burst["wall"],
        burst_cpu_s={name: burst[name] - start[name] for name in start if name != "wall"},
        operator_cpu_first_s=quiet["operator"] - start["operator"],
        operator_cpu_transition_s=end["operator"] - quiet["operator"],
        cpu_s={name: end[name] - start[name] for name in end if name not in ("operator", "wall")},
        operator_rss_start_mb=s.rss_start_kb / MB,
        rss_mb={name: rss / MB for name, (rss, _) in s.memory_kb.items()},
        peak_rss_mb={name: peak / MB for name, (_, peak) in s.memory_kb.items()},
        first_jobs_seen=len(first), transitions_seen=len(transition),
        duplicate_jobs=sum(1 for found in s.job_names.values() if len(found) > 1),
        reconciles_ok=int(oplog.reconciles.get("ok", 0)),
        reconciles_error=int(oplog.reconciles.get("error", 0)),
        reconcile_seconds=oplog.reconciles.get("seconds", math.nan),
        operator_log_lines=len(oplog.lines), operator_log_warnings=oplog.warnings, load_average=list(s.load),
        watch_restarts=s.watch_restarts, requests_by_kind=s.requests,
        operator_requests=sum(n for what, n in s.requests.items() if not what.startswith("watch ")),
    )  # fmt: skip


HEADER = (
    "| runs | wall s | create s | first Job p50 / p99 / max s | transition p50 / p99 / max s "
    "| of which pod → Job Complete (Job controller) p50 / p99 / max s "
    "| Job Complete → extract Job (operator) p50 / p99 / max s "
    "| last first Job s | operator CPU s (to last first Job / until quiet / transition) "
    "| API server / etcd / controller manager / bench CPU s (to last first Job; round) "
    "| operator RSS start / peak MB | API server / etcd RSS MB (end of round; peak since start) "
    "| load average (1 / 5 min) | operator requests per run (of which GETs of runs) "
    "| API server CPU ms per run (round) |\n"
    "|---:|---:|---:|---|---|---|---|---:|---|---|---|---|---|---|---:|"
)


def row(f: ServerFigures) -> str:
    missing = ""
    if f.first_jobs_seen < f.runs or f.transitions_seen < f.runs:
        missing = f" (first Jobs seen: {f.first_jobs_seen}, transitions: {f.transitions_seen})"
    if f.watch_restarts:
        missing += f" (watches resumed {f.watch_restarts} times: some events timestamped late)"
    cpu = " / ".join(
        f"{f.burst_cpu_s.get(p, math.nan):.1f}; {f.cpu_s.get(p, math.nan):.1f}"
        for p in ("apiserver", "etcd", "controller-manager", "bench")
    )
    operator_cpu = (
        f"{f.burst_cpu_s.get('operator', math.nan):.1f} / {f.operator_cpu_first_s:.1f} "
        f"/ {f.operator_cpu_transition_s:.1f}"
    )
    rss = " / ".join(
        f"{f.rss_mb.get(p, math.nan):.0f}; {f.peak_rss_mb.get(p, math.nan):.0f}"
        for p in ("apiserver", "etcd")
    )
    return (
        f"| {f.runs}{missing} | {f.wall_s:.1f} | {f.create_s:.1f} | {spread3(f.first_job_s)} "
        f"| {spread3(f.transition_s)} | {spread3(f.job_controller_s)} | {spread3(f.after_complete_s)} "
        f"| {f.burst_s:.1f} | {operator_cpu} | {cpu} "
        f"| {f.operator_rss_start_mb:.0f} / {f.peak_rss_mb.get('operator', math.nan):.0f} | {rss} "
        f"| {f.load_average[0]:.1f} / {f.load_average[1]:.1f} "
        f"| {f.operator_requests / f.runs:.1f} ({f.requests_by_kind.get('get eagle3runs', 0) / f.runs:.2f}) "
        f"| {1000 * f.cpu_s.get('apiserver', math.nan) / f.runs:.0f} |"
    )


def spread3(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)

"""What both modes of the operator scale benchmark share: the operator process, /proc figures, percentiles.

See operator_scale.py (the API mock, and the entry point) and scale_apiserver.py (a real kube-apiserver).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# The benchmarks run as scripts; the operator test harness (tests/harness) imports from the repository root.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHILD = Path(__file__).with_name("operator_child.py")
# The child's line before it cancels kopf, and the prefix of its reconcile figures (see operator_child.py).
STOPPING, METRICS = "--- stopping ---", "reconcile metrics:"
USER_AGENT = "eagle3-bench"
IN_FLIGHT = 64
QUIET_SECONDS = 1.0


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
async def operator_process(url: str, log: Path, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """The operator in a child process, started and READY; stopped (SIGTERM, then SIGKILL) on exit.

    `args` go to operator_child.py after the URL (`--token`, `--namespace`).
    """
    with log.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), url, *args, stdout=asyncio.subprocess.PIPE, stderr=stderr
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


@dataclass
class OperatorLog:
    """What the operator logged while it ran (before it was told to stop), and its reconcile figures."""

    lines: list[str]
    reconciles: dict[str, float]

    @property
    def warnings(self) -> list[str]:
        return [line for line in self.lines if line.startswith(("WARN", "ERROR"))]


def read_log(log: Path) -> OperatorLog:
    before, _, after = log.read_text().partition(STOPPING)
    reconciles: dict[str, float] = next(
        (json.loads(line[len(METRICS) :]) for line in after.splitlines() if line.startswith(METRICS)), {}
    )
    return OperatorLog(before.splitlines(), reconciles)

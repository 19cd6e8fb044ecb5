"""Live progress: read each running stage pod's progress metrics and reconcile the runs whose figures moved.

Every stage program serves its progress on the `metrics` port (eagle3_contract.stage_metrics). A task of the
operator reads, once per round, the endpoint of every running stage pod (node 0's of a multi-node stage)
and keeps the figures in `ReconcileState.progress[run key][JobView.progress_key]`; the planner copies them
into `status.stages.<stage>.progress` and the Progress and ETA columns. Only a run whose figures moved is
reconciled, so a run writes its status at most once per round for its progress; the round lasts
`progress_seconds` (default 30 s), longer when many stages run (at most WRITES_PER_SECOND progress writes a
second over all runs: 500 running stages make a 100 s round), so 500 runs cause no status write storm.

A pod whose endpoint does not answer (an older image, a network policy) has no live progress; the stage's
status shows its phase as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from eagle3_contract.api.status import StageProgress
from eagle3_contract.stage_metrics import METRICS_PATH, METRICS_PORT, parse_progress
from eagle3_operator.builders import names
from eagle3_operator.reconcile.observe import progress_key, running_pod_ip
from eagle3_operator.reconcile.state import Key, ReconcileState

logger = logging.getLogger(__name__)
PROGRESS_SECONDS = 30.0
WRITES_PER_SECOND = 5.0
READ_SECONDS = 3.0
CONCURRENT_READS = 32
# (run key, progress key, pod IP)
Target = tuple[Key, str, str]
# when the figures moved (a fresh read of them is otherwise no news)
SAME_EXCEPT = {"updated", "eta", "eta_seconds"}


def round_seconds(progress_seconds: float | None, running: int) -> float:
    """How long a round lasts: `progress_seconds` (None: PROGRESS_SECONDS), or longer so that the reads'
    status writes stay under WRITES_PER_SECOND over all runs."""
    base = float(progress_seconds or PROGRESS_SECONDS)
    return max(base, running / WRITES_PER_SECOND)


def targets(runs: Mapping[Key, Any], pods: Mapping[Key, Any], gone: set[str]) -> list[Target]:
    """The running stage pods of the runs in the index (node 0's of a multi-node stage), with their IPs."""
    found: list[Target] = []
    for key in list(runs):
        for pod in list(pods.get(key, [])):
            meta = pod.get("metadata") or {}
            labels = meta.get("labels") or {}
            if meta.get("uid") in gone or labels.get(names.LABEL_HASH) is None:
                continue
            rank = labels.get("batch.kubernetes.io/job-completion-index")
            ip = running_pod_ip([pod]) if rank in (None, "0") else None
            if ip:
                attempt = labels.get(names.LABEL_ATTEMPT, "0")
                found.append(
                    (key, progress_key(labels[names.LABEL_STAGE], labels[names.LABEL_HASH], attempt), ip)
                )
    return found


@dataclass
class Reader:
    """Reads stage pods' /metrics over HTTP (the pod network, as Prometheus does)."""

    session: aiohttp.ClientSession
    port: int = METRICS_PORT

    async def read(self, ip: str) -> StageProgress | None:
        host = f"[{ip}]" if ":" in ip else ip
        try:
            async with self.session.get(f"http://{host}:{self.port}{METRICS_PATH}") as response:
                if response.status != 200:
                    return None
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None
        try:
            return parse_progress(text)
        except ValueError:
            return None

    @classmethod
    def open(cls, port: int = METRICS_PORT) -> Reader:
        timeout = aiohttp.ClientTimeout(total=READ_SECONDS)
        return cls(aiohttp.ClientSession(timeout=timeout), port)

    async def close(self) -> None:
        await self.session.close()


def stamped(progress: StageProgress, now: datetime) -> StageProgress:
    """The figures with when they were read and, from the ETA's seconds, when the stage should finish."""
    eta = None
    if progress.eta_seconds is not None:
        eta = (now + timedelta(seconds=progress.eta_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return progress.model_copy(update={"updated": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "eta": eta})


def moved(before: StageProgress | None, after: StageProgress) -> bool:
    """Whether the figures differ beyond the read's time (an ETA that only ticks down is no news)."""
    if before is None:
        return True
    return before.model_dump(exclude=SAME_EXCEPT) != after.model_dump(exclude=SAME_EXCEPT)


async def read_round(reader: Reader, found: list[Target]) -> dict[Key, dict[str, StageProgress]]:
    """Every target's figures, CONCURRENT_READS at a time; a target that does not answer is left out."""
    limit = asyncio.Semaphore(CONCURRENT_READS)
    now = datetime.now(UTC)

    async def one(target: Target) -> tuple[Target, StageProgress | None]:
        async with limit:
            return target, await reader.read(target[2])

    out: dict[Key, dict[str, StageProgress]] = {}
    for (key, job, _), progress in await asyncio.gather(*(one(t) for t in found)):
        if progress is not None:
            out.setdefault(key, {})[job] = stamped(progress, now)
    return out


def remember(
    known_progress: dict[Key, dict[str, StageProgress]], fresh: dict[Key, dict[str, StageProgress]]
) -> set[Key]:
    """Keep the round's figures, and only those: a stage that ended (or did not answer this round) keeps
    the figures its status holds. Returns the runs whose figures moved (their reconcile writes them)."""
    changed = set()
    kept: dict[Key, dict[str, StageProgress]] = {}
    for key, jobs in fresh.items():
        known = known_progress.get(key, {})
        kept[key] = {}
        for job, progress in jobs.items():
            if moved(known.get(job), progress):
                changed.add(key)
                kept[key][job] = progress
            else:  # the figures as written: a reconcile for another cause writes nothing for them
                kept[key][job] = known[job]
    known_progress.clear()
    known_progress.update(kept)
    return changed


async def poll(
    reader: Reader,
    state: ReconcileState,
    progress_seconds: float | None,
    runs: Mapping[Key, Any],
    pods: Mapping[Key, Any],
    reconcile_run: Callable[[Key], Awaitable[None]],
    acting: Callable[[], Awaitable[bool]] | None = None,
) -> None:
    """Read the progress of every running stage pod for ever, a round at a time, and reconcile the runs
    whose figures moved; a round is skipped while `acting()` says no (a standby operator). Survives every
    exception: a failing round must not end the readings for good."""
    while True:
        if acting is not None and not await acting():
            await asyncio.sleep(round_seconds(progress_seconds, 0))
            continue
        found = targets(runs, pods, state.gone)
        started = time.monotonic()
        try:
            changed = remember(state.progress, await read_round(reader, found))
            for key in sorted(changed):
                await reconcile_run(key)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("a round of reading the stages' progress failed; the next one retries")
        elapsed = time.monotonic() - started
        await asyncio.sleep(max(round_seconds(progress_seconds, len(found)) - elapsed, 0.5))

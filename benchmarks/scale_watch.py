"""What the benchmark sees of a real API server: its own watches on Jobs and pods, and the server's metrics.

A real server cannot be instrumented: Job ADDED events are timestamped here as they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tests.harness.cluster import Cluster

from eagle3_operator.builders import names

logger = logging.getLogger(__name__)

# The watches the operator opens in its namespace (kopf's indexes and handlers).
WATCHED = {"eagle3runs", "jobs", "pods", "deployments", "services", "configmaps", "persistentvolumeclaims"}
WATCH_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_read=None)
WATCH_SECONDS = 3600  # asked of the server; a watch it ends sooner is resumed all the same


@dataclass
class Seen:
    """What this process's watches saw: Job ADDED events by stage and run, Jobs' Complete, their pods."""

    jobs: dict[str, dict[str, float]] = field(default_factory=dict)
    job_names: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    prepare: dict[str, str] = field(default_factory=dict)
    complete: dict[str, float] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    opened: set[str] = field(default_factory=set)  # watches open
    restarts: Counter[str] = field(default_factory=Counter)  # watches resumed (see `stream`)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def job(self, kind: str, body: dict[str, Any]) -> None:
        at, meta = time.monotonic(), body["metadata"]
        labels = meta.get("labels") or {}
        run, stage = labels.get(names.LABEL_RUN, ""), labels.get(names.LABEL_STAGE, "")
        if kind == "ADDED":
            self.jobs.setdefault(stage, {}).setdefault(run, at)
            self.job_names.setdefault((run, stage), set()).add(meta["name"])
            if stage == "prepare":
                self.prepare.setdefault(run, meta["name"])
        conditions = (body.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Complete" and c.get("status") == "True" for c in conditions):
            self.complete.setdefault(meta["name"], at)
        self.changed.set()

    def pod(self, kind: str, body: dict[str, Any]) -> None:
        job = (body["metadata"].get("labels") or {}).get("job-name")
        if job and kind != "DELETED":
            self.pods[job] = body
            self.changed.set()

    async def wait(self, check: Callable[[], bool], timeout: float, what: str) -> bool:
        deadline = time.monotonic() + timeout
        while not check():
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                logger.warning("not within %.0f s: %s", timeout, what)
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.2))
        return True


async def stream(
    cluster: Cluster, api: str, plural: str, handle: Callable[[str, dict[str, Any]], None], seen: Seen
) -> None:
    """Watch `plural` in the cluster's namespace, events to `handle`; resumed where it stopped if it ends.

    The API server closes a watch whose reader falls behind (a busy machine); the events it missed come
    when it is resumed, and their timestamps are late: `seen.restarts` counts the resumptions.
    """
    version = ""
    while True:
        params = {"watch": "1", "timeoutSeconds": str(WATCH_SECONDS), "allowWatchBookmarks": "true"}
        if version:
            params["resourceVersion"] = version
        async with cluster.session.get(
            cluster.path(api, plural),
            params=params,
            headers=cluster.headers,
            ssl=False,
            timeout=WATCH_TIMEOUT,
        ) as resp:
            resp.raise_for_status()
            seen.opened.add(plural)
            seen.changed.set()
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":  # e.g. 410 Gone: too far behind to resume
                    raise RuntimeError(f"the watch on {plural}: {event['object']}")
                version = event["object"]["metadata"].get("resourceVersion") or version
                if event["type"] != "BOOKMARK":
                    handle(event["type"], event["object"])
        seen.restarts[plural] += 1
        logger.warning("the watch on %s ended; resuming from resourceVersion %s", plural, version)


@contextlib.asynccontextmanager
async def watching(
    cluster: Cluster, api: str, plural: str, handle: Callable[[str, dict[str, Any]], None], seen: Seen
) -> AsyncIterator[None]:
    """A watch on `plural` in the cluster's namespace (open before this yields), events to `handle`."""
    task = asyncio.create_task(stream(cluster, api, plural, handle, seen))
    await seen.wait(lambda: plural in seen.opened or task.done(), 30, f"the watch on {plural} open")
    if plural not in seen.opened:
        task.cancel()
        raise RuntimeError(f"no watch on {plural}: {task.exception() if task.done() else 'timed out'}")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def namespaced_watches(cluster: Cluster) -> Counter[str]:
    """Open namespaced watches by resource, from the API server's own metrics."""
    async with cluster.session.get(f"{cluster.url}/metrics", headers=cluster.headers, ssl=False) as resp:
        text = await resp.text()
    found: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("apiserver_longrunning_gauge{") and 'verb="WATCH"' in line:
            labels, value = line.rsplit(" ", 1)
            if 'scope="namespace"' in labels:
                found[labels.split('resource="', 1)[1].split('"', 1)[0]] += int(float(value))
    return found


async def operator_watching(cluster: Cluster, before: Counter[str], timeout: float) -> None:
    """Until the server counts one more watch on each resource the operator watches than `before`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now_open = await namespaced_watches(cluster)
        if all(now_open[r] > before[r] for r in WATCHED):
            return
        await asyncio.sleep(0.2)
    logger.warning("the server does not count the operator's watches on all of %s", sorted(WATCHED))

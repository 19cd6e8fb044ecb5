"""Operator high availability on the real API server: two `eagle3 operator` processes peer through kopf's
KopfPeering (eagle3_operator.peering); only the active one acts, and the standby carries a run on when the
active one is killed (SIGKILL: its keep-alive expires) or stops (SIGTERM: its record goes at once), creating
each stage's Job exactly once. A tie of priorities is re-drawn rather than pausing both for ever.

The processes run with a short peering lifetime ($EAGLE3_PEERING_LIFETIME_SECONDS), so that a killed one is
replaced within seconds; the module takes about a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from eagle3_operator.lease import LEASE_ENV, LEASE_NAME
from eagle3_operator.peering import LIFETIME_ENV, PEERING_NAME
from tests.harness.cluster import Cluster, eventually
from tests.harness.kubelet import Kubelet
from tests.harness.operator_process import OperatorProcess, operator_process
from tests.harness.scenario import complete, status, tiny, wait_job
from tests.operator.apiserver import ROOT, ServerAccess

pytestmark = [pytest.mark.operator, pytest.mark.apiserver, pytest.mark.timeout(600)]
_namespaces = iter(range(1, 1000))
RECONCILED = 'eagle3_operator_reconciles_total{result="ok"}'
# How long a test waits for a standby to carry a run on: long enough for any load on the machine (how fast a
# hand-over is would be a benchmark's figure, never a test's assertion).
RESUME_BOUND_S = 120
LONG_LIFETIME_S = 3 * RESUME_BOUND_S  # a standby that waited for this record to expire would be too late
# Pairs of operators started together (issue 41: 4 of 15 pairs had both active); EAGLE3_PEERING_PAIRS=20 for
# the measurement. PAIRS_AT_ONCE pairs start at the same time, each in a namespace of its own.
PAIRS = int(os.environ.get("EAGLE3_PEERING_PAIRS", "8"))
PAIRS_AT_ONCE = 4
WATCHED_S = 5.0  # how long both roles are sampled once one operator is active
SAMPLE_S = 0.2


@dataclass
class Place:
    access: ServerAccess
    cluster: Cluster
    kubelet: Kubelet
    namespace: str
    jobs: dict[str, set[str]] = field(default_factory=dict)  # every Job name seen -> its uids

    def operator(self, tmp_path: Path, priority: int, lifetime: int, lease: int | None = None) -> Any:
        """`eagle3 operator` for this namespace with the operator's own RBAC token, peering at `priority`."""
        return operator_process(
            self.access.url, self.access.operator_token or "", self.namespace, tmp_path, resync_seconds=1.0,
            extra_args=["--priority", str(priority)],
            env={LIFETIME_ENV: str(lifetime), LEASE_ENV: str(lease or lifetime), "POD_ID": ""},
        )  # fmt: skip

    async def watch_jobs(self) -> None:
        """Record every Job of the namespace, often (the test kubelet never deletes one)."""
        while True:
            for job in await self.cluster.list_objects("batch/v1", "jobs"):
                self.jobs.setdefault(job["metadata"]["name"], set()).add(job["metadata"]["uid"])
            await asyncio.sleep(0.1)

    async def lease_holder(self, cluster: Cluster | None = None) -> str | None:
        """Who holds the operators' Lease (eagle3_operator.lease) in `cluster`'s namespace (this one's)."""
        found = await (cluster or self.cluster).get("coordination.k8s.io/v1", "leases", LEASE_NAME)
        return (found.get("spec") or {}).get("holderIdentity")

    async def peering(self) -> dict[str, Any]:
        found: dict[str, Any] = await self.cluster.get("kopf.dev/v1", "kopfpeerings", PEERING_NAME)
        return found


async def _install_peering_crds(cluster: Cluster, url: str) -> None:
    """kopf's peering CRDs, as the chart installs them (a server started here has them already)."""
    for crd in yaml.safe_load_all((ROOT / "crds" / "kopf-peering.yaml").read_text()):
        with contextlib.suppress(AssertionError, aiohttp.ClientResponseError):
            await cluster._call("POST", f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)


@pytest_asyncio.fixture
async def place(request: pytest.FixtureRequest) -> AsyncIterator[Place]:
    access: ServerAccess = request.getfixturevalue("server")
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        namespace = f"e3p-{os.getpid()}-{next(_namespaces)}"
        cluster = Cluster(session, access.url, namespace=namespace, token=access.token)
        await _install_peering_crds(cluster, access.url)
        await access.create_namespace(cluster, namespace)
        place = Place(access, cluster, Kubelet(cluster), namespace)
        watcher = asyncio.create_task(place.watch_jobs())
        try:
            yield place
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
            await access.delete_namespace(cluster, namespace)


def identity(op: OperatorProcess) -> str:
    """The process's name among its peers (eagle3_operator.peering.identity, no POD_ID)."""
    return f"{socket.gethostname()}/{op.proc.pid}"


async def role(op: OperatorProcess, wanted: str, timeout: float = 30) -> None:
    """Until the process logs that it is `wanted` (active, standby)."""

    async def logged() -> bool | None:
        return True if f"this operator ({identity(op)}" in op.log() and _last_role(op) == wanted else None

    await eventually(logged, timeout=timeout, what=f"operator {identity(op)} {wanted}")


def _last_role(op: OperatorProcess) -> str | None:
    lines = [line for line in op.log().splitlines() if f"this operator ({identity(op)}" in line]
    return _role_of(lines[-1]) if lines else None


def _role_of(line: str) -> str:
    """The role a line `this operator (...) is ...` gives: active, standby, or starting (not decided yet)."""
    if line.rstrip().endswith(" is active"):
        return "active"
    return "standby" if " is standby" in line else "starting"


async def reconciles(op: OperatorProcess) -> float:
    for line in (await op.metrics()).splitlines():
        if line.startswith(RECONCILED):
            return float(line.split()[-1])
    return 0.0


async def job_within(cluster: Cluster, run: str, stage: str, seconds: float) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        jobs = await cluster.jobs(run, stage)
        return jobs[0] if jobs else None

    job: dict[str, Any] = await eventually(found, timeout=seconds, what=f"a {stage} Job of {run}")
    return job


def assert_each_job_created_once(place: Place, stages: tuple[str, ...]) -> None:
    """One Job per stage (no retry's `-r1`), and each with one uid: never deleted and created again."""
    for stage in stages:
        names = [name for name in place.jobs if f"-{stage}" in name]
        assert len(names) == 1, f"{stage}: Jobs {names}"
        assert len(place.jobs[names[0]]) == 1, f"{names[0]} was created more than once: {place.jobs}"


def assert_no_forbidden_calls(*ops: OperatorProcess) -> None:
    for op in ops:
        refused = [line for line in op.log().splitlines() if " 403" in line or "forbidden" in line.lower()]
        assert not refused, f"calls its RBAC rules forbid: {refused[:3]}"


async def test_a_demoted_operator_stops_acting_and_carries_the_run_on_when_the_active_one_is_killed(
    place, tmp_path
):
    """The first operator works a run alone; a second of a higher priority takes over (the first stands by,
    its caches still full: only the peering gate keeps its resync from acting on them); the second is killed
    mid-run and the first carries the run on."""
    cluster, kubelet = place.cluster, place.kubelet
    async with place.operator(tmp_path, priority=100, lifetime=3) as first:
        await role(first, "active")
        await cluster.apply_run("ha", tiny())
        await wait_job(cluster, "ha", "prepare")
        async with place.operator(tmp_path, priority=200, lifetime=3) as second:
            await role(second, "active")
            await role(first, "standby")
            await asyncio.sleep(1.5)  # a resync round under way when it turned standby ends
            before = await reconciles(first)
            await complete(cluster, kubelet, "ha", ("prepare",))
            await wait_job(cluster, "ha", "extract")
            await asyncio.sleep(3)  # three of the standby's resync rounds
            assert await reconciles(second) > 0
            assert await reconciles(first) == before, "the standby acted"

            second.kill()  # mid-run: extract's Job runs
            await second.wait(10)
            await complete(cluster, kubelet, "ha", ("extract",))
            # the killed one's record expires after its 3 s lifetime and kopf resumes the standby; the bound
            # only says that it happens (however loaded the machine is), not how fast
            await job_within(cluster, "ha", "vocab", RESUME_BOUND_S)
            await complete(cluster, kubelet, "ha", ("vocab",))
            await wait_job(cluster, "ha", "train")

            # the operator creates train's Job, then writes the status that says vocab succeeded: a read
            # between the two sees vocab Running, so the status is waited for, not read once
            async def carried_on() -> bool:
                stages = (await status(cluster, "ha"))["stages"]
                return all(stages[s]["phase"] == "Succeeded" for s in ("prepare", "extract", "vocab"))

            await eventually(carried_on, timeout=RESUME_BOUND_S, what="prepare, extract and vocab Succeeded")
            assert await reconciles(first) > before
            await role(first, "active")
            assert identity(second) not in ((await place.peering()).get("status") or {})  # cleaned up
            assert_no_forbidden_calls(first, second)
    assert_each_job_created_once(place, ("prepare", "extract", "vocab", "train"))


async def test_a_gracefully_stopped_operator_hands_over_at_once(place, tmp_path):
    """With a lifetime (and a Lease) longer than the test waits, a standby waiting for either to expire would
    never take over in time: a graceful stop deletes the record and releases the Lease, and the standby takes
    over at once."""
    cluster, kubelet = place.cluster, place.kubelet
    async with place.operator(tmp_path, priority=200, lifetime=LONG_LIFETIME_S) as active:
        await role(active, "active")
        assert await place.lease_holder() == identity(active)
        async with place.operator(tmp_path, priority=100, lifetime=LONG_LIFETIME_S) as standby:
            await role(standby, "standby")
            await cluster.apply_run("calm", tiny())
            await wait_job(cluster, "calm", "prepare")
            assert await reconciles(standby) == 0, "the standby acted"

            assert await active.stop() == 0, active.log()[-2000:]
            peers = (await place.peering()).get("status") or {}
            assert identity(active) not in peers and identity(standby) in peers
            await complete(cluster, kubelet, "calm", ("prepare",))
            await job_within(cluster, "calm", "extract", RESUME_BOUND_S)
            await role(standby, "active")
            assert await place.lease_holder() == identity(standby)  # released, not expired: LONG_LIFETIME_S
            assert_no_forbidden_calls(active, standby)
    assert_each_job_created_once(place, ("prepare", "extract"))


async def test_operators_of_the_same_priority_resolve_the_tie_and_one_acts(place, tmp_path):
    """kopf pauses every operator that sees a peer of its own priority; the one whose identity sorts last
    re-draws a lower priority, so the run does not wait for ever."""
    cluster = place.cluster
    async with (
        place.operator(tmp_path, priority=5, lifetime=5) as one,
        place.operator(tmp_path, priority=5, lifetime=5) as two,
    ):
        first, second = sorted((one, two), key=identity)
        await role(second, "standby")
        await role(first, "active")
        assert "re-draws" in second.log() and "re-draws" not in first.log()
        await cluster.apply_run("tie", tiny())
        await wait_job(cluster, "tie", "prepare")
        assert await reconciles(second) == 0, "the re-drawn operator acted"
        assert_no_forbidden_calls(one, two)
    assert_each_job_created_once(place, ("prepare",))


async def _roles(ops: tuple[OperatorProcess, ...]) -> tuple[str | None, ...]:
    answers = await asyncio.gather(*(op.probes() for op in ops))
    return tuple(((a or {}).get("peering") or {}).get("role") for a in answers)


async def _started_together(
    place: Place, tmp_path: Path, index: int, spawning: asyncio.Lock
) -> dict[str, Any]:
    """Two operators for a namespace of their own, spawned back to back (default priorities: start order);
    the roles /healthz reports, sampled until one is active and for WATCHED_S after."""
    namespace, work = f"{place.namespace}-t{index}", tmp_path / f"pair-{index}"
    work.mkdir()
    cluster = Cluster(place.cluster.session, place.access.url, namespace=namespace, token=place.access.token)
    await place.access.create_namespace(cluster, namespace)
    token = place.access.operator_token or ""
    try:
        async with contextlib.AsyncExitStack() as stack:
            spawned, ops = [], []
            async with spawning:  # the two spawns of a pair back to back, no other pair's in between
                for _ in range(2):
                    ops.append(
                        await stack.enter_async_context(
                            operator_process(place.access.url, token, namespace, work, wait_ready=False)
                        )
                    )
                    spawned.append(asyncio.get_running_loop().time())
            await asyncio.gather(*(op.ready(timeout=RESUME_BOUND_S) for op in ops))
            samples: list[tuple[str | None, ...]] = []

            async def one_active() -> bool | None:
                samples.append(await _roles(tuple(ops)))
                return True if samples[-1].count("active") == 1 else None

            await eventually(one_active, timeout=RESUME_BOUND_S, what=f"one active operator in {namespace}")
            end = asyncio.get_running_loop().time() + WATCHED_S
            while asyncio.get_running_loop().time() < end:
                samples.append(await _roles(tuple(ops)))
                await asyncio.sleep(SAMPLE_S)
            logged = [_last_role_of(op) for op in ops]
            active = [identity(op) for op, r in zip(ops, samples[-1], strict=True) if r == "active"]
            holder = await place.lease_holder(cluster)
            return {
                "gap_s": spawned[1] - spawned[0],
                "samples": samples,
                "logged": logged,
                "lease": (active, holder),
            }
    finally:
        await place.access.delete_namespace(cluster, namespace)


def _last_role_of(op: OperatorProcess) -> str | None:
    lines = [line for line in op.log().splitlines() if "this operator (" in line]
    return _role_of(lines[-1]) if lines else None


async def test_operators_started_together_are_never_both_active(place, tmp_path):
    """Issue 41: two operators started within 100 ms must never both act or report active, not even before
    either keep-alive is written. kopf pauses one at once; every component follows kopf's decision (the
    resync, the progress reads, the retries and /healthz ask kopf's own pause state, not a second reading of
    the peering object)."""
    results, spawning = [], asyncio.Lock()
    for first in range(0, PAIRS, PAIRS_AT_ONCE):
        indexes = range(first, min(first + PAIRS_AT_ONCE, PAIRS))
        results += await asyncio.gather(*(_started_together(place, tmp_path, i, spawning) for i in indexes))
    # the spawns of a pair are back to back (tens of ms apart; over 100 ms only on a loaded machine): the
    # invariant holds at any gap, so the gaps are reported, not asserted
    gaps = [round(r["gap_s"], 3) for r in results]
    both = [i for i, r in enumerate(results) if any(s.count("active") > 1 for s in r["samples"])]
    assert not both, (
        f"both active in pairs {both} of {len(results)} (start gaps {gaps} s): "
        f"{[results[i]['samples'] for i in both]}"
    )
    last = [r["samples"][-1] for r in results]
    assert all(s.count("active") == 1 and s.count("standby") == 1 for s in last), last
    assert all(sorted(r["logged"]) == ["active", "standby"] for r in results), [r["logged"] for r in results]
    assert all(r["lease"][0] == [r["lease"][1]] for r in results), [r["lease"] for r in results]

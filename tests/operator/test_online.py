"""Online hidden states through the real kopf operator, on each backend (see conftest.py): producers (and the
Mooncake master) around the train stage, a producer crash while training, and a run deleted mid-training."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from eagle3_contract.api.base import API_VERSION, KIND, PLURAL
from eagle3_contract.online import ENV_HIDDEN_STATES_ENDPOINT, ENV_MOONCAKE_MASTER
from eagle3_operator.builders.names import LABEL_RUN, LABEL_STAGE
from tests.harness.cluster import Cluster, eventually
from tests.harness.results import fake_result
from tests.harness.scenario import complete, status, tiny, wait_job, wait_phase

pytestmark = pytest.mark.operator
ONLINE = {"mode": "online", "transfer": "volume"}
MOONCAKE = {"mode": "online", "transfer": "mooncake"}
KINDS = (("Deployment", "apps/v1", "deployments"), ("Service", "v1", "services"), ("Job", "batch/v1", "jobs"))


async def deployment(cluster: Cluster, run: str, stage: str) -> dict[str, Any] | None:
    found = await cluster.list_objects("apps/v1", "deployments", **{LABEL_RUN: run, LABEL_STAGE: stage})
    return found[0] if found else None


async def wait_deployment(cluster: Cluster, run: str, stage: str) -> dict[str, Any]:
    found: dict[str, Any] = await eventually(
        lambda: deployment(cluster, run, stage), what=f"the {stage} Deployment of {run}"
    )
    return found


async def available(backend: Any, body: dict[str, Any]) -> None:
    """The Deployment's pods are ready: the kubelet's part (the real Deployment controller then counts them
    available); on the mock the test also plays the Deployment controller."""
    await backend.player.ready(body)
    if not backend.real:
        ready = {"status": {"readyReplicas": 1, "availableReplicas": 1}}
        await backend.cluster.patch("apps/v1", "deployments", body["metadata"]["name"], ready, "status")


async def producers_status(cluster: Cluster, run: str, phase: str, timeout: float = 30.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        producers = (await status(cluster, run)).get("producers") or {}
        return producers if producers.get("phase") == phase else None

    found: dict[str, Any] = await eventually(check, timeout, f"producers of {run} {phase}")
    return found


async def gone(cluster: Cluster, run: str, stage: str) -> bool:
    labels = {LABEL_RUN: run, LABEL_STAGE: stage}
    deployments = await cluster.list_objects("apps/v1", "deployments", **labels)
    services = await cluster.list_objects("v1", "services", **labels)
    return not deployments and not services


def env_of(job: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


async def test_online_run_starts_producers_before_training_and_deletes_them_after(backend):
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("tiny", tiny(extraction=ONLINE))
        await complete(cluster, player, "tiny", ("prepare", "vocab"))
        producers = await wait_deployment(cluster, "tiny", "producers")
        # the Service is created before its Deployment, in the same reconcile
        assert await cluster.get("v1", "services", "tiny-producers")
        pending = await producers_status(cluster, "tiny", "Pending")
        assert pending["endpoint"] == f"http://tiny-producers.{cluster.ns}.svc:8000/v1"
        assert await cluster.jobs("tiny", "train") == [], "the train Job waits for a producer"
        await available(backend, producers)
        train = await wait_job(cluster, "tiny", "train")
        assert env_of(train)[ENV_HIDDEN_STATES_ENDPOINT] == pending["endpoint"]
        await producers_status(cluster, "tiny", "Running")
        await complete(cluster, player, "tiny", ("train",))
        deleted = await producers_status(cluster, "tiny", "Deleted")
        await eventually(lambda: gone(cluster, "tiny", "producers"), what="the producers deleted")
        await complete(cluster, player, "tiny", ("evaluate", "export"))
        serving = await wait_deployment(cluster, "tiny", "serve")
        await player.ready(serving)
        final = await wait_phase(cluster, "tiny", "Serving")
    assert deleted["message"].startswith("the train stage succeeded")
    assert final["stages"]["extract"]["phase"] == "Skipped"
    assert final["producers"]["phase"] == "Deleted"
    assert [j["metadata"]["labels"][LABEL_STAGE] for j in await cluster.jobs("tiny", "train")] == ["train"]
    backend.assert_content_types()


async def test_a_producer_crash_mid_training_leaves_the_training_running(backend):
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("tiny", tiny(extraction=MOONCAKE))
        await complete(cluster, player, "tiny", ("prepare", "vocab"))
        master = await wait_deployment(cluster, "tiny", "mooncake")
        producers = await wait_deployment(cluster, "tiny", "producers")
        await available(backend, producers)
        await asyncio.sleep(0.5)
        assert await cluster.jobs("tiny", "train") == [], "the train Job waits for the Mooncake master too"
        await available(backend, master)
        train = await wait_job(cluster, "tiny", "train")
        assert env_of(train)[ENV_MOONCAKE_MASTER] == f"tiny-mooncake.{cluster.ns}.svc:50051"
        # the producer runs out of memory and crash-loops: its Deployment keeps replacing it
        await player.crash_loop(producers, 137, "torch.OutOfMemoryError: CUDA out of memory")
        if not backend.real:
            down = {"status": {"readyReplicas": 0, "availableReplicas": 0}}
            await cluster.patch("apps/v1", "deployments", "tiny-producers", down, "status")

        async def blocked() -> dict[str, Any] | None:
            found = (await status(cluster, "tiny")).get("producers") or {}
            return found if (found.get("blockedBy") or {}).get("reason") == "CrashLoopBackOff" else None

        crashed = await eventually(blocked, 30, "the crash loop in status.producers.blockedBy")
        assert "CUDA out of memory" in crashed["blockedBy"]["message"]
        assert [j["metadata"]["name"] for j in await cluster.jobs("tiny", "train")] == [
            train["metadata"]["name"]
        ]
        assert (await status(cluster, "tiny"))["stages"]["train"]["jobName"] == train["metadata"]["name"]
        await available(backend, producers)  # the replacement runs
        await eventually(
            lambda: _not_blocked(cluster, "tiny"), 30, "the producers running again, nothing blocked"
        )
        await complete(cluster, player, "tiny", ("train",))
        await eventually(lambda: gone(cluster, "tiny", "producers"), 30, "the producers deleted")
        await eventually(lambda: gone(cluster, "tiny", "mooncake"), 30, "the Mooncake master deleted")


async def _indexed_jobs(cluster: Cluster) -> bool:
    """Whether the server runs Indexed Jobs (1.22+); the mock answers no /version and is taken for new."""
    try:
        version = await cluster._call("GET", f"{cluster.url}/version")
    except Exception:  # the mock has no /version
        return True
    return int(str(version.get("minor") or "99").rstrip("+")) >= 22


async def test_deleting_a_run_mid_training_takes_every_online_child_along(backend):
    """Two training nodes where the server has Indexed Jobs (the mock); one on Kubernetes 1.20, which
    drops completionMode (the operator refuses two nodes there: test_server_features.py)."""
    cluster, player = backend.cluster, backend.player
    nodes = 2 if await _indexed_jobs(cluster) else 1
    async with backend.operator():
        run = await cluster.apply_run("tiny", tiny(extraction=MOONCAKE, training={"nodes": nodes}))
        await complete(cluster, player, "tiny", ("prepare", "vocab"))
        await available(backend, await wait_deployment(cluster, "tiny", "mooncake"))
        await available(backend, await wait_deployment(cluster, "tiny", "producers"))
        train = await wait_job(cluster, "tiny", "train")
        if nodes > 1:
            assert train["spec"]["completionMode"] == "Indexed"
            assert train["spec"]["parallelism"] == train["spec"]["completions"] == 2
            assert train["spec"]["template"]["spec"]["subdomain"] == train["metadata"]["name"]
            headless = await cluster.get("v1", "services", train["metadata"]["name"])
            assert headless["spec"]["clusterIP"] == "None"
        children = {
            kind: await cluster.list_objects(api, plural, **{LABEL_RUN: "tiny"})
            for kind, api, plural in KINDS
        }
        services = 3 if nodes > 1 else 2  # the headless Service of a multi-node train Job
        expected = {"Deployment": 2, "Service": services, "Job": 3}
        assert {k: len(found) for k, found in children.items()} == expected
        for child in (c for found in children.values() for c in found):
            [owner] = child["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["uid"]) == (KIND, run["metadata"]["uid"]), child["metadata"]["name"]
        await cluster.delete(API_VERSION, PLURAL, "tiny")
        if backend.real:
            await eventually(lambda: _nothing_left(cluster, "tiny"), 60, "the garbage collector's work")
        else:  # no garbage collector: a late child event must not recreate anything
            await player.succeed(train, fake_result("train"))
            await asyncio.sleep(0.5)
            assert len(await cluster.jobs("tiny")) == len(children["Job"])


async def _not_blocked(cluster: Cluster, run: str) -> bool:
    producers = (await status(cluster, run)).get("producers") or {}
    return producers.get("phase") == "Running" and "blockedBy" not in producers


async def _nothing_left(cluster: Cluster, run: str) -> bool:
    labels = {LABEL_RUN: run}
    for _, api, plural in KINDS:
        if await cluster.list_objects(api, plural, **labels):
            return False
    return True

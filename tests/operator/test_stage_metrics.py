"""A running stage's live progress, from its pod's metrics endpoint to status, `kubectl get` and Events.

The train stage's pod "runs" at a loopback address where the pipeline's own StageReporter serves the
progress metrics the stage program serves in a pod (eagle3_contract.stage_metrics); the operator reads them as
it reads a pod's in a cluster. On the real API server, `kubectl get e3r` is the server's Table of the
printer columns, read with kubectl's Accept header.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from eagle3_contract.api.base import API_VERSION, PLURAL
from eagle3_contract.stage_metrics import METRICS_PORT
from eagle3_pipeline.runtime.reporter import StageReporter
from tests.harness.cluster import Cluster, eventually
from tests.harness.results import fake_result
from tests.harness.scenario import ORDER, complete, status, tiny, wait_job

pytestmark = pytest.mark.operator
EPOCHS, STEPS_PER_EPOCH = 3, 10


def pod_ip() -> str:
    """A loopback address of this process's own (the port is the contract's, as in every pod)."""
    return f"127.0.{os.getpid() % 250 + 1}.{os.getpid() % 200 + 20}"


async def train_progress(cluster: Cluster, **wanted: Any) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        st = await status(cluster, "tiny")
        live = st.get("stages", {}).get("train", {}).get("progress") or {}
        return st if all(live.get(k) == v for k, v in wanted.items()) else None

    found: dict[str, Any] = await eventually(check, what=f"train progress {wanted}")
    return found


async def get_e3r(cluster: Cluster) -> dict[str, str]:
    """The run's row of `kubectl get e3r` (default columns), as the server renders it."""
    table = await cluster.table(API_VERSION, PLURAL)
    names = [c["name"] for c in table["columnDefinitions"] if c.get("priority", 0) == 0]
    [row] = [r for r in table["rows"] if r["object"]["metadata"]["name"] == "tiny"]
    return dict(zip(names, row["cells"], strict=False))


async def event_reasons(cluster: Cluster) -> list[str]:
    events = await cluster.list_objects("v1", "events")
    return [e.get("reason", "") for e in events if e["involvedObject"]["name"] == "tiny"]


async def test_a_train_stage_shows_its_epoch_and_step_advancing(backend):
    cluster, player = backend.cluster, backend.player
    ip = pod_ip()
    with StageReporter("train", log_seconds=3600) as reporter:
        reporter.serve(METRICS_PORT, ip)
        async with backend.operator(progress_seconds=0.5):
            await cluster.apply_run("tiny", tiny())
            await complete(cluster, player, "tiny", ORDER[: ORDER.index("train")])
            job = await wait_job(cluster, "tiny", "train")
            reporter.train_plan(EPOCHS, STEPS_PER_EPOCH)
            await player.run(job, ip)
            reporter.train_steps(4, loss=2.5, steps=4, tokens=4000)
            st = await train_progress(cluster, step=4, epochsDone=0)
            assert (st["currentStage"], st["progress"]) == ("train", "train 0/3 ep")
            assert st["stages"]["train"]["progress"]["total"] == EPOCHS * STEPS_PER_EPOCH
            assert st["stages"]["train"]["progress"]["trainLoss"] == 2.5

            for epoch in (1, 2):
                await asyncio.sleep(1.1)  # the reporter's rate (and ETA) needs a second of steps
                reporter.train_steps(epoch * STEPS_PER_EPOCH, loss=2.0 / epoch, steps=6, tokens=6000)
                reporter.train_epoch(epoch, 1.9 - 0.2 * epoch, [0.6, 0.4], 1.8 + 0.1 * epoch)
                st = await train_progress(cluster, step=epoch * STEPS_PER_EPOCH, epochsDone=epoch)
                live = st["stages"]["train"]["progress"]
                assert st["progress"] == f"train {epoch}/{EPOCHS} ep"
                assert live["valLoss"] == pytest.approx(1.9 - 0.2 * epoch)
                assert live["valAccuracyByPosition"] == [0.6, 0.4]
                assert live["updated"] and live["rate"] > 0 and st["eta"]
                if backend.real:  # kmock renders no Table
                    row = await get_e3r(cluster)
                    assert list(row) == ["Name", "Stage", "Progress", "ETA", "Accept", "Ready", "Age"]
                    assert (row["Stage"], row["Progress"]) == ("train", f"train {epoch}/{EPOCHS} ep")
                    assert row["ETA"] == st["eta"] and row["Ready"] == "False"

            await player.succeed(job, fake_result("train"))
            st = await train_progress(cluster, epochsDone=EPOCHS, done=EPOCHS * STEPS_PER_EPOCH)
            assert "rate" not in st["stages"]["train"]["progress"]
            if backend.real:  # kopf posts Events through the API: kmock keeps none to list
                reasons = await eventually(
                    lambda: _with(event_reasons(cluster), "StageSucceeded"), what="the Events"
                )
                assert reasons.count("EpochCompleted") == 2


async def _with(reasons: Any, wanted: str) -> list[str] | None:
    found: list[str] = await reasons
    return found if wanted in found else None

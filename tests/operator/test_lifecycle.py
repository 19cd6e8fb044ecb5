"""Whole lifecycles of an Eagle3Run through the real kopf operator, on each backend (see conftest.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from eagle3_contract.api.base import API_VERSION, PLURAL
from eagle3_contract.api.speculation import SCHEDULE_KEY, SpeculationTable, schedule_argument
from eagle3_operator.builders.names import ANNOTATION_SPEC_HASH, LABEL_MANAGED_BY
from eagle3_operator.metrics import OperatorMetrics
from tests.harness.cluster import eventually, running_operator
from tests.harness.results import fake_result
from tests.harness.scenario import (
    ORDER,
    complete,
    drive_to_serving,
    status,
    tiny,
    wait_job,
    wait_phase,
)

pytestmark = pytest.mark.operator
PORT = {"name": "http", "port": 8000, "protocol": "TCP"}
MODEL = tiny()["verifier"]["model"]  # the `model` label of the run's series


async def test_run_goes_from_prepare_to_serving(backend):
    cluster, player = backend.cluster, backend.player
    metrics = OperatorMetrics()
    async with backend.operator(metrics):
        await cluster.apply_run("tiny", tiny())
        first = await wait_job(cluster, "tiny", "prepare")
        st = await wait_phase(cluster, "tiny", "Running")
        assert st["currentStage"] == "prepare"
        assert st["stages"]["generate"]["phase"] == "Skipped"
        final = await drive_to_serving(cluster, player, "tiny")
        # the reconcile that wrote Serving records its metrics after the status write: let it finish
        await eventually(lambda: _remembered(metrics, cluster.ns, "Serving"), what="metrics see Serving")

    jobs = await cluster.jobs("tiny")
    assert sorted(j["metadata"]["labels"]["eagle3.dev/stage"] for j in jobs) == sorted(ORDER)
    for job in jobs:
        labels = job["metadata"]["labels"]
        assert labels[LABEL_MANAGED_BY] == "eagle3-operator" and labels["eagle3.dev/run"] == "tiny"
        assert job["metadata"]["ownerReferences"][0]["kind"] == "Eagle3Run"
        assert job["metadata"]["ownerReferences"][0]["uid"]
    assert first["spec"]["template"]["spec"]["containers"][0]["command"][:3] == ["eagle3", "stage", "prepare"]
    assert final["phase"] == "Serving"
    assert final["acceptanceLength"] == 1.6
    assert final["stages"]["prepare"]["result"] == fake_result("prepare")  # the termination message, as is
    checkpoint = dict(final["checkpoint"])
    table = SpeculationTable.model_validate(checkpoint.pop("speculation"))  # evaluate's sweep, for tuned
    assert table == SpeculationTable.model_validate(fake_result("evaluate")["speculation"])
    assert checkpoint == {
        "path": final["stages"]["export"]["outputDir"],
        "sha256": fake_result("export")["sha256"],
        "bytes": fake_result("export")["bytes"],
        "acceptanceLength": 1.6,
        "acceptanceRate": 0.2,
        "method": "eagle3",
    }
    assert final["serving"]["readyReplicas"] == 1
    assert final["serving"]["url"] == f"http://tiny-vllm.{cluster.ns}.svc:8000"
    conditions = {c["type"]: c for c in final["conditions"]}
    assert conditions["Ready"]["status"] == "True" and conditions["GatePassed"]["status"] == "True"
    assert all(c["observedGeneration"] == 1 for c in final["conditions"])
    deployment = await cluster.deployment("tiny")
    assert (
        deployment["spec"]["template"]["metadata"]["annotations"]["eagle3.dev/draft"]
        == final["checkpoint"]["path"]
    )
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    config = json.loads(args[args.index("--speculative-config") + 1])
    # serving.speculationLength tuned: vLLM's per-batch-size k, from the table
    assert config[SCHEDULE_KEY] == schedule_argument(table.schedule)
    assert await cluster.get("v1", "services", "tiny-vllm")
    claim = await cluster.get("v1", "persistentvolumeclaims", "tiny-artifacts")
    assert "ownerReferences" not in claim["metadata"], "the artifacts volume outlives the run by default"
    backend.assert_content_types()
    sample, run = metrics.registry.get_sample_value, {"namespace": cluster.ns, "run": "tiny"}
    assert sample("eagle3_run_acceptance_length", run | {"model": MODEL, "sampling": "greedy"}) == 1.6
    prepare = {"namespace": cluster.ns, "stage": "prepare"}
    assert sample("eagle3_operator_stage_duration_seconds_count", prepare) == 1
    attempts = {s: sample("eagle3_operator_stage_attempts_total", run | {"stage": s}) for s in ORDER}
    assert attempts == dict.fromkeys(ORDER, 1.0), "one Job per stage, each counted once"
    assert sample("eagle3_operator_runs", {"namespace": cluster.ns, "phase": "Serving"}) == 1
    draft = {"model": MODEL, "checkpoint": final["checkpoint"]["path"], "sha256": "ab" * 32}
    assert sample("eagle3_serving_draft_info", run | draft) == 1
    assert sample("eagle3_serving_draft_rollout_timestamp_seconds", run | {"sha256": "ab" * 32}) > 0


async def test_spec_edit_reruns_only_affected_stages_and_rolls_the_deployment(backend):
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("tiny", tiny())
        before = await drive_to_serving(cluster, player, "tiny")
        old = await cluster.deployment("tiny")
        await cluster.edit_run("tiny", {"training": {"learningRate": 0.002}})
        await complete(cluster, player, "tiny", ("train", "evaluate", "export"))

        async def rolled():
            dep = await cluster.deployment("tiny")
            draft = dep["spec"]["template"]["metadata"]["annotations"]["eagle3.dev/draft"]
            return dep if draft != before["checkpoint"]["path"] else None

        new = await eventually(rolled, what="deployment rolled to the new draft")
        after = await status(cluster, "tiny")
    per_stage = {s: len(await cluster.jobs("tiny", s)) for s in ORDER}
    assert per_stage == {"prepare": 1, "extract": 1, "vocab": 1, "train": 2, "evaluate": 2, "export": 2}
    for stage in ("prepare", "extract", "vocab"):
        assert after["stages"][stage]["hash"] == before["stages"][stage]["hash"]
    for stage in ("train", "evaluate", "export"):
        assert after["stages"][stage]["hash"] != before["stages"][stage]["hash"]
    assert (
        new["metadata"]["annotations"]["eagle3.dev/spec-hash"]
        != old["metadata"]["annotations"]["eagle3.dev/spec-hash"]
    )
    assert after["observedGeneration"] == 2
    backend.assert_content_types()


async def test_pinned_checkpoint_serves_without_training(backend):
    """Without a sha256 the pin serves unchecked (test_gitops.py: with one, verify runs first)."""
    cluster = backend.cluster
    pinned = {"pinnedCheckpoint": {"path": "export/0123456789ab"}}
    async with backend.operator():
        await cluster.apply_run("pinned", tiny(serving=pinned))
        deployment = await eventually(lambda: cluster.deployment("pinned"), what="deployment")
        st = await eventually(lambda: _with_serving(cluster, "pinned"), what="serving status")
    assert await cluster.jobs("pinned") == []
    assert all(s["phase"] == "Skipped" for s in st["stages"].values())
    assert st["checkpoint"] == {"path": "export/0123456789ab"}
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert any("/artifacts/export/0123456789ab" in a for a in args)


async def test_gate_failure_keeps_the_previous_draft_serving(backend):
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("tiny", tiny(evaluation={"minAcceptanceLength": 1.2}))
        before = await drive_to_serving(cluster, player, "tiny")
        await cluster.edit_run("tiny", {"training": {"epochs": 1}})
        await complete(cluster, player, "tiny", ("train",))
        await complete(
            cluster, player, "tiny", ("evaluate",), evaluate=fake_result("evaluate", acceptance_length=1.05)
        )
        st = await wait_phase(cluster, "tiny", "Failed")
        deployment = await cluster.deployment("tiny")
    conditions = {c["type"]: c for c in st["conditions"]}
    assert conditions["GatePassed"]["status"] == "False"
    assert conditions["GatePassed"]["reason"] == "AcceptanceBelowGate"
    assert "1.050 is below evaluation.minAcceptanceLength 1.2" in conditions["Failed"]["message"]
    assert len(await cluster.jobs("tiny", "export")) == 1, "a draft below the gate is not exported"
    draft = deployment["spec"]["template"]["metadata"]["annotations"]["eagle3.dev/draft"]
    assert draft == before["checkpoint"]["path"], "the old draft keeps serving"
    assert st["serving"]["draft"] == before["checkpoint"]["path"]


async def test_deleting_a_run_stops_everything_and_keeps_the_artifacts(backend):
    cluster, player = backend.cluster, backend.player
    metrics = OperatorMetrics()
    async with backend.operator(metrics):
        await cluster.apply_run("tiny", tiny())
        job = await wait_job(cluster, "tiny", "prepare")
        await wait_phase(cluster, "tiny", "Running")
        await eventually(lambda: _remembered(metrics, cluster.ns), what="metrics remember the run")
        await cluster.delete(API_VERSION, PLURAL, "tiny")
        await eventually(lambda: _forgotten(metrics, cluster.ns), what="metrics forget the run")
        if backend.real:
            await eventually(lambda: _gone(cluster, "tiny"), timeout=60, what="the garbage collector's work")
        else:  # the mock has no garbage collector: a late child event must not recreate anything
            await player.succeed(job, {"samples": 1})
        await _settle()
    left = [j["metadata"]["name"] for j in await cluster.jobs("tiny")]
    assert left == ([] if backend.real else [job["metadata"]["name"]])
    assert job["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    claim = await cluster.get("v1", "persistentvolumeclaims", "tiny-artifacts")
    assert "ownerReferences" not in claim["metadata"]


async def test_operator_restart_mid_run_creates_no_duplicates(backend):
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("tiny", tiny())
        await complete(cluster, player, "tiny", ("prepare",))
        await wait_job(cluster, "tiny", "extract")
    restarted = OperatorMetrics()
    async with backend.operator(restarted):
        await _settle()
        await complete(cluster, player, "tiny", ("extract",))
        await wait_job(cluster, "tiny", "vocab")
        await _settle()
    assert {s: len(await cluster.jobs("tiny", s)) for s in ("prepare", "extract", "vocab")} == {
        "prepare": 1, "extract": 1, "vocab": 1,
    }  # fmt: skip
    run = {"namespace": cluster.ns, "run": "tiny"}
    attempts = {
        s: restarted.registry.get_sample_value("eagle3_operator_stage_attempts_total", run | {"stage": s})
        for s in ("prepare", "extract", "vocab")
    }
    assert attempts == {"prepare": 0, "extract": 0, "vocab": 1}, "Jobs older than the process are not counted"


async def test_an_upgraded_operator_converges_the_service_an_older_one_made(backend):
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("tiny", tiny())
        await drive_to_serving(cluster, player, "tiny")
        service = await eventually(lambda: cluster.get("v1", "services", "tiny-vllm"))
    wanted = service["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
    older = {"metadata": {"annotations": {ANNOTATION_SPEC_HASH: None}}}
    older["spec"] = {"ports": [{**PORT, "targetPort": 9000}]}
    await cluster.patch("v1", "services", "tiny-vllm", older)  # what an operator before the hash made
    async with backend.operator():

        async def converged():
            now = await cluster.get("v1", "services", "tiny-vllm")
            return now if now["metadata"].get("annotations", {}).get(ANNOTATION_SPEC_HASH) == wanted else None

        service = await eventually(converged, what="the Service patched back to the builder's")
    assert service["spec"]["ports"] == [{**PORT, "targetPort": "http"}]


async def test_runs_without_a_pipeline_image_get_the_operators(backend):
    cluster = backend.cluster
    own = {"images": {"pipeline": "registry.example.com/team/pipeline:7"}}
    async with backend.operator(pipeline_image="registry.example.com/ml/eagle3-pipeline:0.2.0"):
        await cluster.apply_run("tiny", tiny())
        await cluster.apply_run("mine", tiny(**own))
        default, named = (
            await wait_job(cluster, "tiny", "prepare"),
            await wait_job(cluster, "mine", "prepare"),
        )
    image = {
        j["metadata"]["name"]: j["spec"]["template"]["spec"]["containers"][0]["image"]
        for j in (default, named)
    }
    assert image[default["metadata"]["name"]] == "registry.example.com/ml/eagle3-pipeline:0.2.0"
    assert image[named["metadata"]["name"]] == "registry.example.com/team/pipeline:7", "the run's own wins"
    assert "pipeline" not in (await cluster.run("tiny"))["spec"].get("images", {}), "it writes no spec"


async def test_the_resync_loop_reconciles_runs_without_any_event(backend):
    if backend.real:
        pytest.skip("timing of the loop, not of the server")
    metrics = OperatorMetrics()
    async with running_operator(backend.url, metrics, resync_seconds=0.2):
        await backend.cluster.apply_run("tiny", tiny())
        await wait_job(backend.cluster, "tiny", "prepare")
        await asyncio.sleep(0.5)  # the events of the creation have been handled
        before = metrics.reconciles.labels("ok")._value.get()

        async def three_more() -> bool:  # a round lists and reads the run first: no fixed pace is promised
            return metrics.reconciles.labels("ok")._value.get() - before >= 3

        await eventually(three_more, what="three reconciles with no event at all")
    assert len(await backend.cluster.jobs("tiny")) == 1, "and they create nothing twice"


async def _with_serving(cluster, run):
    st = await status(cluster, run)
    return st if "serving" in st else None


async def _gone(cluster, run):
    jobs = await cluster.jobs(run)
    configmaps = await cluster.list_objects("v1", "configmaps", **{"eagle3.dev/run": run})
    return not jobs and not configmaps


async def _remembered(metrics: OperatorMetrics, namespace: str, phase: str | None = None) -> bool:
    memory = metrics.memory.get((namespace, "tiny"))
    return memory is not None and (phase is None or memory.phase == phase)


async def _forgotten(metrics: OperatorMetrics, namespace: str) -> bool:
    labels = {"namespace": namespace, "run": "tiny", "stage": "prepare"}
    return (namespace, "tiny") not in metrics.memory and (
        metrics.registry.get_sample_value("eagle3_operator_stage_attempts_total", labels) is None
    )


async def _settle() -> None:
    await asyncio.sleep(0.5)

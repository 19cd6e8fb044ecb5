"""Failure paths through the real kopf operator on each backend: retries, OOM, suspend, invalid specs."""

from __future__ import annotations

import asyncio

import pytest

from eagle3_contract.exit_codes import OOM_EXIT_CODE
from eagle3_operator.metrics import OperatorMetrics
from tests.harness.cluster import declare_resources, eventually
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


def conditions(st: dict) -> dict[str, dict]:
    return {c["type"]: c for c in st.get("conditions", [])}


async def test_a_stage_that_exhausts_its_retries_fails_the_run_with_its_last_message(backend):
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("tiny", tiny(stages={"prepare": {"backoffLimit": 0}}))
        job = await wait_job(cluster, "tiny", "prepare")
        await player.fail(job, "Traceback (most recent call last):\nValueError: row 17 has no assistant turn")
        st = await wait_phase(cluster, "tiny", "Failed")
        event = await eventually(lambda: _warning_event(cluster), what="a Warning event on the run")
    failed = conditions(st)["Failed"]
    assert failed["status"] == "True" and failed["reason"] == "BackoffLimitExceeded"
    assert event["reason"] == "Failed" and "row 17 has no assistant turn" in event["message"]
    assert event["involvedObject"]["kind"] == "Eagle3Run"
    assert failed["message"].startswith("stage prepare: Job tiny-prepare-")
    assert "row 17 has no assistant turn" in failed["message"]
    assert st["currentStage"] == "prepare"
    assert st["stages"]["prepare"]["phase"] == "Failed"
    assert len(await cluster.jobs("tiny")) == 1, "a failed stage starts nothing after it"


async def test_a_pod_failure_within_the_backoff_limit_is_retried_by_the_job(backend):
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("tiny", tiny())
        job = await wait_job(cluster, "tiny", "prepare")
        await wait_phase(cluster, "tiny", "Running")  # the Job is made before the status that says so
        await player.fail_pod(job, "connection reset by peer", n=0)
        await asyncio.sleep(0.3)  # a chance to (wrongly) fail the run: a slow operator only makes it likelier
        assert (await status(cluster, "tiny"))["phase"] == "Running"
        await player.succeed(job, {"samples": 3})
        await wait_job(cluster, "tiny", "extract")
        # the reconcile that creates extract's Job writes the status after it: wait for that write
        st = await eventually(lambda: _succeeded(cluster, "prepare"), what="prepare Succeeded in status")
    assert st["stages"]["prepare"]["phase"] == "Succeeded"
    assert conditions(st)["Failed"]["status"] == "False"


async def test_a_pod_that_cannot_pull_its_image_is_reported_and_the_run_goes_on_once_it_can(backend):
    cluster, player = backend.cluster, backend.player
    pull = 'Back-off pulling image "eagle3-operator/pipeline:0.1.0"'
    async with backend.operator():
        await cluster.apply_run("tiny", tiny())
        job = await wait_job(cluster, "tiny", "prepare")
        await player.stall(job, "ImagePullBackOff", pull)

        async def reported():
            st = await status(cluster, "tiny")
            return st if "blockedBy" in st["stages"]["prepare"] else None

        st = await eventually(reported, what="the stuck pod in status")
        event = await eventually(
            lambda: _warning_event(cluster, "PodNotRunning"), what="a PodNotRunning Event"
        )
        await player.succeed(job, {"samples": 3})  # the image was pushed
        await wait_job(cluster, "tiny", "extract")
        after = await eventually(lambda: _succeeded(cluster, "prepare"), what="prepare Succeeded in status")
    blocked = st["stages"]["prepare"]["blockedBy"]
    assert blocked["reason"] == "ImagePullBackOff"
    assert event["message"] == f"stage prepare: {blocked['message']}"
    assert blocked["message"].endswith(f"container prepare: ImagePullBackOff: {pull}")
    assert st["phase"] == "Running" and conditions(st)["Progressing"]["reason"] == "PodNotRunning"
    assert (
        "blockedBy" not in after["stages"]["prepare"] and after["stages"]["prepare"]["phase"] == "Succeeded"
    )


async def test_a_crash_looping_vllm_is_why_the_run_is_not_ready(backend):
    cluster, player = backend.cluster, backend.player
    last_lines = "ValueError: --speculative-config: draft vocabulary 512 does not fit the verifier's 256"
    async with backend.operator():
        await cluster.apply_run("tiny", tiny())
        await complete(cluster, player, "tiny", ORDER)
        deployment = await eventually(lambda: cluster.deployment("tiny"), what="vLLM deployment")
        await player.crash_loop(deployment, 1, last_lines)

        async def reported():
            st = await status(cluster, "tiny")
            return st if "blockedBy" in (st.get("serving") or {}) else None

        st = await eventually(reported, what="the crash loop in status")
        await player.ready(deployment)  # a fixed spec rolled out
        serving = await wait_phase(cluster, "tiny", "Serving")
    assert st["serving"]["blockedBy"]["reason"] == "CrashLoopBackOff"
    assert st["serving"]["blockedBy"]["message"].endswith(
        f"CrashLoopBackOff: back-off 40s restarting failed container; last exit code 1: {last_lines}"
    )
    ready = conditions(st)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "PodNotRunning")
    assert "blockedBy" not in serving["serving"] and conditions(serving)["Ready"]["status"] == "True"


@pytest.mark.parametrize(("reason", "exit_code"), [("OOMKilled", 137), ("Error", OOM_EXIT_CODE)])
async def test_out_of_memory_in_extraction_retries_with_half_the_token_budget(backend, reason, exit_code):
    cluster, player, metrics = backend.cluster, backend.player, OperatorMetrics()
    async with backend.operator(metrics):
        spec = tiny(extraction={"tokenBudget": 1024}, stages={"extract": {"backoffLimit": 0}})
        await cluster.apply_run("tiny", spec)
        await complete(cluster, player, "tiny", ("prepare",))
        first = await wait_job(cluster, "tiny", "extract")
        await player.fail(
            first, "CUDA out of memory", reason=reason, exit_code=exit_code, job_reason="PodFailurePolicy"
        )
        second = await wait_job(cluster, "tiny", "extract")
        st = await eventually(lambda: _attempts(cluster, 2), what="two extract attempts in status")
        await player.succeed(second, {"tokens": 1})
        await wait_job(cluster, "tiny", "vocab")
    assert first["metadata"]["annotations"]["eagle3.dev/token-budget"] == "1024"
    assert second["metadata"]["name"] == first["metadata"]["name"] + "-r1"
    assert second["metadata"]["annotations"]["eagle3.dev/token-budget"] == "512"
    assert second["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["--token-budget", "512"]
    extract = st["stages"]["extract"]
    assert extract["tokenBudget"] == 512
    assert "ran out of memory at a token budget of 1024; retrying with 512" in extract["message"]
    labels = {"namespace": cluster.ns, "run": "tiny", "stage": "extract"}
    sample = metrics.registry.get_sample_value
    assert sample("eagle3_operator_stage_attempts_total", labels) == 2, "two Jobs, each counted once"
    assert sample("eagle3_operator_stage_failures_total", labels | {"reason": "OutOfMemory"}) == 1
    assert sample("eagle3_operator_stage_failures_total", labels | {"reason": "Error"}) == 0


async def test_on_a_server_without_pod_failure_policy_the_first_out_of_memory_exit_retries_at_half(backend):
    """Kubernetes 1.20 drops the Job's podFailurePolicy: its Job controller would start the same attempt again
    (backoffLimit 2: three pods at the same token budget). The operator fails the Job at the first exit 86."""
    if not backend.real:
        pytest.skip("the mock plays no Job controller; the server of the apiserver tier is Kubernetes 1.20")
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("tiny", tiny(extraction={"tokenBudget": 1024}))
        await complete(cluster, player, "tiny", ("prepare",))
        first = await wait_job(cluster, "tiny", "extract")
        assert (
            "podFailurePolicy"
            not in (await cluster.get("batch/v1", "jobs", first["metadata"]["name"]))["spec"]
        )
        await player.fail_pod(first, "CUDA out of memory", 0, exit_code=OOM_EXIT_CODE)

        async def retried() -> dict | None:
            jobs = [j for j in await cluster.jobs("tiny", "extract") if j["metadata"]["name"].endswith("-r1")]
            return jobs[0] if jobs else None

        second = await eventually(retried, what="the next extract attempt")

        async def first_gone() -> bool:
            names = [j["metadata"]["name"] for j in await cluster.jobs("tiny", "extract")]
            return first["metadata"]["name"] not in names

        await eventually(first_gone, what="the first extract Job deleted")
        st = await status(cluster, "tiny")
    assert second["metadata"]["name"] == first["metadata"]["name"] + "-r1"
    assert second["metadata"]["annotations"]["eagle3.dev/token-budget"] == "512"
    assert (
        "ran out of memory at a token budget of 1024; retrying with 512" in st["stages"]["extract"]["message"]
    )


async def test_out_of_memory_at_the_smallest_budget_fails_with_advice(backend):
    cluster, player = backend.cluster, backend.player
    # Already at dataset.maxSequenceLength: nothing to halve. backoffLimit 0: a real Job controller waits
    # 10 s, 20 s, ... between pods, and the pods' reason decides here, not their count.
    spec = tiny(
        dataset={"maxSequenceLength": 256},
        extraction={"tokenBudget": 256},
        stages={"extract": {"backoffLimit": 0}},
    )
    async with backend.operator():
        await cluster.apply_run("tiny", spec)
        await complete(cluster, player, "tiny", ("prepare",))
        job = await wait_job(cluster, "tiny", "extract")
        await player.fail(job, "CUDA out of memory", reason="OOMKilled", exit_code=137)
        st = await wait_phase(cluster, "tiny", "Failed")
    failed = conditions(st)["Failed"]
    assert failed["reason"] == "OutOfMemory"
    assert "lower dataset.maxSequenceLength" in failed["message"]
    assert len(await cluster.jobs("tiny", "extract")) == 1


async def test_suspend_creates_no_jobs_until_resumed_and_the_queue_label_passes_through(backend):
    cluster = backend.cluster
    async with backend.operator():
        await cluster.apply_run("tiny", tiny(suspend=True, queueName="gpu-h200"))
        st = await wait_phase(cluster, "tiny", "Suspended")
        await asyncio.sleep(0.3)
        assert await cluster.jobs("tiny") == []
        await cluster.edit_run("tiny", {"suspend": False})
        job = await wait_job(cluster, "tiny", "prepare")
    assert conditions(st)["Progressing"]["reason"] == "Suspended"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-h200"


async def test_an_invalid_spec_creates_nothing_and_names_the_field(backend):
    cluster = backend.cluster
    async with backend.operator():
        try:
            # a GPU run: in CPU mode (the tiny example's) training.gpus is not bounded by gpusPerNode
            await cluster.apply_run("bad", tiny(training={"gpus": 16}, nodePool={"device": "gpu"}))
        except AssertionError as refused:  # a server with CEL rules (Kubernetes >= 1.25) refuses it outright
            assert "HTTP 422" in str(refused) and "training.gpus" in str(refused)
            return
        st = await wait_phase(cluster, "bad", "Invalid")
        await asyncio.sleep(0.3)
        assert await cluster.jobs("bad") == []
        await cluster.edit_run("bad", {"training": {"gpus": 8}})
        await wait_job(cluster, "bad", "prepare")
    valid = conditions(st)["SpecValid"]
    assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
    assert "spec.training.gpus" in valid["message"]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (tiny(training={"gpus": "two"}), "spec.training.gpus"),
        (tiny(extraction={"backend": "tensorrt"}), "spec.extraction.backend"),
        (tiny(evaluation={"numSpeculativeTokens": 0}), "spec.evaluation.numSpeculativeTokens"),
    ],
)
async def test_the_server_refuses_a_spec_the_generated_schema_forbids(backend, spec, field):
    if not backend.real:
        pytest.skip("the mock validates nothing; the operator's own check is tested above")
    with pytest.raises(AssertionError, match="HTTP 422") as refused:
        await backend.cluster.apply_run("bad", spec)
    assert field in str(refused.value)


async def test_a_pod_monitor_is_created_when_the_cluster_serves_them(backend):
    cluster, player = backend.cluster, backend.player
    if backend.real:
        pytest.skip("PodMonitors need the Prometheus operator's CRD; the mock declares it")
    declare_resources(backend.mock, pod_monitors=True)
    async with backend.operator():
        await cluster.apply_run("tiny", tiny())
        await drive_to_serving(cluster, player, "tiny")
        monitor = await eventually(
            lambda: cluster.get("monitoring.coreos.com/v1", "podmonitors", "tiny-vllm")
        )
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "http"


async def _warning_event(cluster, reason=None):
    events = await cluster.list_objects("v1", "events")
    return next(
        (
            e
            for e in events
            if e.get("type") == "Warning"
            and e["involvedObject"]["name"] == "tiny"
            and reason in (None, e.get("reason"))
        ),
        None,
    )


async def _succeeded(cluster, stage):
    st = await status(cluster, "tiny")
    return st if st.get("stages", {}).get(stage, {}).get("phase") == "Succeeded" else None


async def _attempts(cluster, n):
    st = await status(cluster, "tiny")
    return st if st.get("stages", {}).get("extract", {}).get("attempts") == n else None


async def test_a_volume_too_small_for_offline_extract_never_gets_an_extract_job(backend):
    """Issue 29: the Llama example's volume held a third of what its extract would store, which would fail
    hours in. Once prepare's result gives the exact figure, extract is not started: the run fails
    StorageTooSmall, naming both figures and the fields to change; a bigger volume lets it go on."""
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("small", tiny(storage={"artifacts": {"size": "1Mi"}}))
        await complete(cluster, player, "small", ("prepare",))
        st = await wait_phase(cluster, "small", "Failed")
        failed = conditions(st)["Failed"]
        assert failed["reason"] == "StorageTooSmall", failed
        assert "extract would store" in failed["message"] and "holds 1.0 MB" in failed["message"]
        assert "spec.storage.artifacts.size" in failed["message"]
        assert st["stages"]["extract"]["phase"] == "Pending"
        assert not await cluster.jobs("small", "extract"), "extract never started"
        await cluster.edit_run("small", {"storage": {"artifacts": {"size": "5Gi"}}})
        await wait_job(cluster, "small", "extract")

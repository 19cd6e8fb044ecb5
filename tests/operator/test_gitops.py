"""GitOps through the real kopf operator: it writes only status, and a draft pinned in git rolls only after
the sha256 was verified where the files are; `eagle3 promote` reads a run from the API server; a reviewed
run's new draft waits in status.candidate until its promotion is applied, then vLLM rolls to it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import kmock
import pytest
import yaml

from eagle3_contract.api.base import PLURAL
from eagle3_contract.exit_codes import CHECK_FAILED_EXIT_CODE
from eagle3_operator.k8s import ApiError, Kube
from eagle3_operator.promote import build_promotion
from tests.harness.cluster import eventually
from tests.harness.scenario import ORDER, complete, drive_to_serving, status, tiny, wait_job, wait_phase
from tests.harness.verification import mismatch_message

pytestmark = pytest.mark.operator

GOOD, OTHER, WRONG = "ab" * 32, "cd" * 32, "ef" * 32
DRAFT, NEXT = "export/3f0c2a9d41be", "export/0000aaaa1111"
OPERATOR_AGENTS = ("kopf/", "OpenAPI-Generator/")  # kopf's own client and kubernetes_asyncio's


def pin(path: str = DRAFT, sha256: str = GOOD) -> dict[str, Any]:
    return {"pinnedCheckpoint": {"path": path, "sha256": sha256}}


def draft_of(deployment: dict[str, Any]) -> str:
    value: str = deployment["spec"]["template"]["metadata"]["annotations"]["eagle3.dev/draft"]
    return value


async def serve_verified(backend: Any, run: str, path: str = DRAFT, sha256: str = GOOD) -> dict[str, Any]:
    """Apply a pinned run, let its verify Job pass, and have the Deployment report a ready replica."""
    cluster, player = backend.cluster, backend.player
    await cluster.apply_run(run, tiny(serving=pin(path, sha256)))
    job = await wait_job(cluster, run, "verify")
    assert await cluster.deployment(run) is None, "no Deployment before the draft is verified"
    await player.succeed(job, {"path": path, "sha256": sha256, "bytes": 4096})
    deployment = await eventually(lambda: cluster.deployment(run), what="vLLM deployment")
    await player.ready(deployment)
    await wait_phase(cluster, run, "Serving")
    return deployment


async def test_a_pinned_draft_rolls_only_after_its_sha256_is_verified(backend):
    async with backend.operator():
        deployment = await serve_verified(backend, "pinned")
        st = await status(backend.cluster, "pinned")
    assert draft_of(deployment) == DRAFT
    [check] = deployment["spec"]["template"]["spec"]["initContainers"]
    assert check["command"][-2] == GOOD, "the check is given the verified digest"
    assert st["checkpoint"] == {"path": DRAFT, "sha256": GOOD}
    assert st["stages"]["verify"]["phase"] == "Succeeded"
    assert {s for s, v in st["stages"].items() if v["phase"] == "Skipped"} == {
        "predict", "prepare", "generate", "extract", "vocab", "train", "evaluate", "export",
    }  # fmt: skip
    [job] = await backend.cluster.jobs("pinned")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][:3] == ["eagle3", "stage", "verify"]


async def test_a_checksum_mismatch_is_refused_and_the_previous_draft_keeps_serving(backend):
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        served = await serve_verified(backend, "pinned")
        verified = {j["metadata"]["name"] for j in await cluster.jobs("pinned", "verify")}
        await cluster.edit_run("pinned", {"serving": pin(NEXT, OTHER)})
        job = await eventually(lambda: _new_verify_job(cluster, verified), what="the new pin's verify Job")
        message = mismatch_message(OTHER, WRONG, NEXT)
        await player.fail(job, message, exit_code=CHECK_FAILED_EXIT_CODE, job_reason="PodFailurePolicy")
        st = await wait_phase(cluster, "pinned", "Failed")
        await asyncio.sleep(0.5)  # more reconciles: nothing is retried, nothing rolls
        deployment = await cluster.deployment("pinned")
        jobs = await cluster.jobs("pinned", "verify")
    conditions = {c["type"]: c for c in st["conditions"]}
    failed = conditions["Failed"]
    assert (failed["status"], failed["reason"]) == ("True", "ChecksumMismatch")
    for part in (OTHER, WRONG, f"/artifacts/{NEXT}/model.safetensors", "delete Job"):
        assert part in failed["message"], part
    assert conditions["Ready"]["status"] == "True", "the previous draft still serves"
    assert "not rolled out (ChecksumMismatch" in conditions["Ready"]["message"]
    assert deployment is not None and draft_of(deployment) == DRAFT
    # the Deployment controller adds its own annotations (revision) when it gets to it: the operator's only
    assert own_annotations(deployment) == own_annotations(served), "not patched"
    generation = deployment["metadata"].get("generation")
    assert generation == served["metadata"].get("generation"), "spec not changed"
    assert st["serving"]["draft"] == DRAFT
    assert len(jobs) == 2, "one verify Job per pin: the refused one is not retried"
    backend.assert_content_types()


async def test_the_operator_never_writes_a_run_but_its_status(backend):
    """A GitOps tool compares the run's spec and metadata with git: the operator must not touch them."""
    if backend.real:
        pytest.skip("the real server enforces it: the operator's RBAC grants no write on eagle3runs")
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("tiny", tiny())
        await drive_to_serving(cluster, player, "tiny")
        await cluster.edit_run("tiny", {"serving": {"replicas": 2}})
        await eventually(lambda: _observed(cluster, "tiny", 2), what="the edit reconciled")
        await cluster.apply_run("pinned", tiny(serving=pin()))
        await wait_job(cluster, "pinned", "verify")
    writes = [
        r
        for r in backend.mock
        if r.method in (kmock.method.POST, kmock.method.PUT, kmock.method.PATCH, kmock.method.DELETE)
        and f"/{PLURAL}" in r.url.path
        and r.headers.get("User-Agent", "").startswith(OPERATOR_AGENTS)
    ]
    assert writes, "the operator wrote no status at all: the test would prove nothing"
    for request in writes:
        assert request.method == kmock.method.PATCH, f"{request.method} {request.url.path}"
        assert request.url.path.endswith("/status"), f"the operator wrote {request.url.path}"
        assert set(request.data) <= {"status"}, f"a status patch with {sorted(request.data)}"
    run = await cluster.run("tiny")
    assert set(run["metadata"].get("annotations") or {}) == set(), "no operator bookkeeping on the run"
    assert not run["metadata"].get("finalizers"), "no finalizer: deleting a run never waits for the operator"


async def test_kube_reads_a_run_and_says_when_there_is_none(backend):
    cluster = backend.cluster
    await cluster.apply_run("tiny", tiny())
    kube = _kube(backend)
    try:
        run = await kube.get_run(cluster.ns, "tiny")
        with pytest.raises(ApiError, match="not found: check the run's name and namespace"):
            await kube.get_run(cluster.ns, "absent")
    finally:
        await kube.close()
    assert run["kind"] == "Eagle3Run" and run["spec"]["verifier"]["model"] == tiny()["verifier"]["model"]


async def test_promote_reads_the_run_from_the_api_and_its_manifest_serves_the_verified_draft(
    backend, tmp_path
):
    """Train to Serving, `eagle3 promote tiny -n NS` (a process, through a kubeconfig), apply what it wrote as
    the serving run: its verify Job checks export's digest, then vLLM rolls to that draft."""
    if backend.real:
        pytest.skip("the process reads the mock through a plain kubeconfig; Kube.get_run is tested above")
    cluster, player = backend.cluster, backend.player
    kubeconfig = tmp_path / "kubeconfig"
    server, ns = str(backend.mock.url).rstrip("/"), cluster.ns
    kubeconfig.write_text(
        yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "mock",
            "clusters": [{"name": "mock", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "mock", "context": {"cluster": "mock", "user": "u", "namespace": ns}}],
        })
    )  # fmt: skip
    async with backend.operator():
        await cluster.apply_run("tiny", tiny())
        trained = await drive_to_serving(cluster, player, "tiny")
        out = tmp_path / "tiny.yaml"
        code, stderr = await _eagle3("promote", "tiny", "-o", str(out), kubeconfig=str(kubeconfig))
        assert code == 0, stderr
        manifest = yaml.safe_load(out.read_text())
        await cluster.apply_run("tiny-serving", manifest["spec"])
        job = await wait_job(cluster, "tiny-serving", "verify")
        await player.succeed(job, {"sha256": trained["checkpoint"]["sha256"]})
        deployment = await eventually(lambda: cluster.deployment("tiny-serving"), what="deployment")
    assert manifest["spec"]["serving"]["pinnedCheckpoint"] == {
        "path": trained["checkpoint"]["path"], "sha256": trained["checkpoint"]["sha256"],
    }  # fmt: skip
    assert draft_of(deployment) == trained["checkpoint"]["path"]
    assert "git commit" in stderr and "mean acceptance length 1.600" in stderr


async def test_a_reviewed_run_waits_for_its_promotion_then_vllm_rolls_to_the_candidate(backend):
    """Train a reviewed run: its draft waits in status.candidate with no Deployment; apply the manifest
    `eagle3 promote` builds from the run read from the API (the pin, nothing else changed): verify checks it,
    nothing trains again, vLLM rolls to the candidate; a training edit then trains while it keeps serving."""
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("rev", tiny(serving={"promotion": "reviewed"}))
        await complete(cluster, player, "rev", ORDER)
        waiting = await wait_phase(cluster, "rev", "Succeeded")
        assert await cluster.deployment("rev") is None, "nothing serves before the first promotion"
        manifest = build_promotion(await cluster.run("rev"))
        await cluster.edit_run("rev", {"serving": manifest["spec"]["serving"]})
        job = await wait_job(cluster, "rev", "verify")
        await player.succeed(
            job, {"path": waiting["candidate"]["path"], "sha256": waiting["candidate"]["sha256"]}
        )
        deployment = await eventually(lambda: cluster.deployment("rev"), what="vLLM deployment")
        await player.ready(deployment)
        promoted = await wait_phase(cluster, "rev", "Serving")
        trains = len(await cluster.jobs("rev", "train"))
        await cluster.edit_run("rev", {"training": {"learningRate": 3e-4}})
        await wait_job(cluster, "rev", "train")
        retraining = await eventually(lambda: _candidate_gone(cluster, "rev"), what="the retrain reconciled")
        still = await cluster.deployment("rev")
    ready = {c["type"]: c for c in waiting["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "AwaitingPromotion")
    assert f"eagle3 promote rev -n {cluster.ns}" in ready["message"]
    assert manifest["spec"]["serving"]["pinnedCheckpoint"] == {
        "path": waiting["candidate"]["path"], "sha256": waiting["candidate"]["sha256"],
    }  # fmt: skip
    assert draft_of(deployment) == waiting["candidate"]["path"]
    assert "candidate" not in promoted and promoted["checkpoint"] == waiting["candidate"]
    assert trains == 1, "the promotion trained nothing again"
    assert still is not None and draft_of(still) == waiting["candidate"]["path"]
    assert retraining["serving"]["draft"] == waiting["candidate"]["path"]


async def _candidate_gone(cluster: Any, run: str) -> dict[str, Any] | None:
    st = await status(cluster, run)
    return st if st.get("currentStage") == "train" and "candidate" not in st else None


async def _eagle3(*argv: str, kubeconfig: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"} | {"KUBECONFIG": kubeconfig}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "eagle3_cli", *argv,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    return int(proc.returncode or 0), stderr.decode()


def _kube(backend: Any) -> Kube:
    from kubernetes_asyncio import client as k8s

    config = k8s.Configuration(host=backend.url)
    config.verify_ssl = False
    if backend.token:
        config.api_key = {"BearerToken": backend.token}
        config.api_key_prefix = {"BearerToken": "Bearer"}
    return Kube(k8s.ApiClient(config))


async def _new_verify_job(cluster: Any, known: set[str]) -> dict[str, Any] | None:
    """A verify Job other than `known` (the first pin's): that one may still show no condition, since the
    job controller records its completion a moment after its pod succeeded."""
    jobs = await cluster.jobs("pinned", "verify")
    fresh = [j for j in jobs if j["metadata"]["name"] not in known]
    return fresh[0] if fresh else None


async def _observed(cluster: Any, run: str, generation: int) -> bool:
    return (await status(cluster, run)).get("observedGeneration") == generation


def own_annotations(obj: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in obj["metadata"].get("annotations", {}).items() if k.startswith("eagle3.dev/")}

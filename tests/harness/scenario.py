"""Shared steps of the lifecycle scenarios: a tiny spec, stage results, and driving a run stage by stage."""

from __future__ import annotations

from typing import Any

import kmock

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_operator.builders import names
from eagle3_operator.builders.claim import build_artifacts_claim
from tests import tiny_spec
from tests.harness.cluster import MERGE, WAIT_BOUND_S, Cluster, Player, eventually
from tests.harness.results import fake_result

# The scenarios' run: the tiny example without regeneration (they drive the six stages of ORDER).
TINY: dict[str, Any] = tiny_spec.tiny(regeneration={"enabled": False})
ORDER = ("prepare", "extract", "vocab", "train", "evaluate", "export")


def tiny(**sections: Any) -> dict[str, Any]:
    """TINY with `sections` merge-patched in (see tests.tiny_spec.derive)."""
    return tiny_spec.derive(TINY, **sections)


def artifacts_claim(namespace: str, run: str = "tiny") -> dict[str, Any]:
    """The artifacts PVC the operator creates for a tiny run (not owned by it: it outlives the run)."""
    ref = names.RunRef(run, namespace, f"uid-{run}")
    return build_artifacts_claim(ref, Eagle3RunSpec.model_validate(tiny()))


async def status(cluster: Cluster, run: str) -> dict[str, Any]:
    body = await cluster.run(run)
    result: dict[str, Any] = body.get("status") or {}
    return result


async def deployment(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The Deployment called `name` (a run's serving or canary one), None while there is none."""
    found = [d for d in await cluster.list_objects("apps/v1", "deployments") if d["metadata"]["name"] == name]
    return found[0] if found else None


def draft_of(body: dict[str, Any]) -> str:
    """The draft a serving Deployment's pods serve (its pod template's annotation)."""
    return str(body["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_DRAFT])


# How long a wait for the operator's next step may take before it counts as hung (cluster.WAIT_BOUND_S)
STEP_BOUND_S = WAIT_BOUND_S


async def wait_phase(cluster: Cluster, run: str, phase: str, timeout: float = STEP_BOUND_S) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        st = await status(cluster, run)
        return st if st.get("phase") == phase else None

    result: dict[str, Any] = await eventually(check, timeout, f"{run} phase {phase}")
    return result


async def wait_job(cluster: Cluster, run: str, stage: str, timeout: float = STEP_BOUND_S) -> dict[str, Any]:
    """The Job of `stage` that has not finished yet, once the operator created it."""

    async def check() -> dict[str, Any] | None:
        jobs = await cluster.jobs(run, stage)
        unfinished = [j for j in jobs if not (j.get("status") or {}).get("conditions")]
        return unfinished[0] if unfinished else None

    job: dict[str, Any] = await eventually(check, timeout, f"an unfinished {stage} job of {run}")
    return job


async def complete(
    cluster: Cluster, player: Player, run: str, stages: tuple[str, ...], **results: Any
) -> None:
    """Succeed each stage's Job in order, waiting for the operator to create it; a stage's result is the fake
    one (tests.harness.results) unless `results` names another."""
    for stage in stages:
        job = await wait_job(cluster, run, stage)
        await player.succeed(job, results.get(stage, fake_result(stage)))


async def drive_to_serving(cluster: Cluster, player: Player, run: str) -> dict[str, Any]:
    await complete(cluster, player, run, ORDER)
    deployment = await eventually(lambda: cluster.deployment(run), what="vLLM deployment")
    await player.ready(deployment)
    return await wait_phase(cluster, run, "Serving")


def assert_content_types(mock: Any) -> None:
    """A real server rejects a merge-patch body sent as JSON patch (and vice versa); kmock does not check.

    Every PATCH must declare the type its body has: a list of operations is a JSON patch, an object a merge
    patch. The operator's own writes (kubernetes_asyncio) must all be merge patches.
    """
    for request in mock:
        ctype = request.headers.get("Content-Type", "")
        if request.method == kmock.method.PATCH:
            wanted = "application/json-patch+json" if isinstance(request.data, list) else MERGE
            assert ctype.startswith(wanted), f"PATCH {request.url.path} sent as {ctype!r}"
            if "OpenAPI-Generator" in request.headers.get("User-Agent", ""):
                assert ctype.startswith(MERGE), f"the operator's PATCH {request.url.path} sent as {ctype!r}"
        if request.method == kmock.method.POST:
            assert ctype.startswith("application/json"), f"POST {request.url.path} sent as {ctype!r}"


async def drive_stage(
    cluster: Cluster, player: Player, run: str, stage: str, result: dict[str, Any]
) -> dict[str, Any] | None:
    """Succeed the stage's Job once the operator creates it; None if the operator skips the stage."""

    async def ready() -> dict[str, Any] | None:
        jobs = [j for j in await cluster.jobs(run, stage) if not (j.get("status") or {}).get("conditions")]
        if jobs:
            return jobs[0]
        stage_status = (await status(cluster, run)).get("stages", {}).get(stage, {})
        return {"skipped": True} if stage_status.get("phase") == "Skipped" else None

    found: dict[str, Any] = await eventually(ready, what=f"{stage} of {run} started or skipped")
    if found.get("skipped"):
        return None
    await player.succeed(found, result)
    return found

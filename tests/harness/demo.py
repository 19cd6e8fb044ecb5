"""`make demo`: the operator at work against the API mock, from a manifest to a serving vLLM Deployment.

The real kopf operator runs in-process against kmock; this program applies the manifest and plays the Job
controller (each stage's Job succeeds with a plausible result), printing what the operator creates and the
run's status at each step. The pipeline's own programs (issue 4 and 5) replace the played results later.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import aiohttp
import kmock

from eagle3_contract.api.manifest import ManifestError
from eagle3_contract.api.manifest import load_manifest as read_manifest
from tests.harness.cluster import (
    Cluster,
    Emulator,
    JobPlayer,
    Player,
    declare_resources,
    eventually,
    running_operator,
)
from tests.harness.results import fake_result
from tests.harness.scenario import drive_stage, status, wait_phase

STAGES = ("prepare", "generate", "extract", "vocab", "train", "evaluate", "export")


def load_manifest(path: Path) -> tuple[str, dict[str, Any], bool]:
    """The run's name and spec; exits with a message naming the problem on bad input."""
    try:
        manifest = read_manifest(path)
    except ManifestError as err:
        raise SystemExit(str(err)) from None
    return manifest.name, manifest.document["spec"], manifest.spec.serving.enabled


def show_job(job: dict[str, Any]) -> None:
    container = job["spec"]["template"]["spec"]["containers"][0]
    gpus = {k: v for k, v in (container.get("resources", {}).get("limits") or {}).items() if "gpu" in k}
    print(f"  Job {job['metadata']['name']}  gpus={gpus or 0}")
    print(f"      $ {' '.join(container['command'])}")


def show_status(st: dict[str, Any]) -> None:
    summary = {k: st.get(k) for k in ("phase", "currentStage", "acceptanceLength", "checkpoint", "serving")}
    print("  status: " + json.dumps({k: v for k, v in summary.items() if v is not None}))


async def play_stages(cluster: Cluster, player: Player, name: str) -> None:
    """Succeed each stage's Job as the operator creates it, printing the Job and its command."""
    for stage in STAGES:
        job = await drive_stage(cluster, player, name, stage, fake_result(stage))
        if job is None:
            why = (await status(cluster, name))["stages"][stage].get("message")
            print(f"- {stage}: skipped ({why})")
            continue
        print(f"- {stage}: the operator created")
        show_job(job)
        print(f"  the Job succeeded with {json.dumps(fake_result(stage))}")


async def play_serving(cluster: Cluster, name: str) -> dict[str, Any]:
    """Wait for the vLLM Deployment, print its command, make it ready and return the Serving status."""
    deployment = await eventually(lambda: cluster.deployment(name), what="the vLLM Deployment")
    args = " ".join(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    print(f"- serve: Deployment {deployment['metadata']['name']}: vllm serve {args}")
    ready = {"status": {"readyReplicas": 1}}
    await cluster.patch("apps/v1", "deployments", deployment["metadata"]["name"], ready, "status")
    return await wait_phase(cluster, name, "Serving")


async def demo(path: Path) -> int:
    name, spec, serving = load_manifest(path)
    async with Emulator() as mock, kmock.Server(mock):
        declare_resources(mock)
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session, running_operator(str(mock.url)):
            cluster = Cluster(session, str(mock.url), namespace="default")
            print(f"kubectl apply -f {path}  (Eagle3Run {name})")
            await cluster.apply_run(name, spec)
            await play_stages(cluster, JobPlayer(cluster), name)
            st = (
                await play_serving(cluster, name) if serving else await wait_phase(cluster, name, "Succeeded")
            )
            show_status(st)
    print(f"Eagle3Run {name}: {st['phase']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "manifest", type=Path, help="an Eagle3Run manifest, e.g. examples/tiny/eagle3run.yaml"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return asyncio.run(demo(args.manifest))


if __name__ == "__main__":
    sys.exit(main())

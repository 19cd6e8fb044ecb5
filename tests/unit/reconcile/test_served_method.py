"""vLLM serves a draft with the draft's own method (issue 31): the one evaluate chose among draft.candidates,
as export read it from the checkpoint, or a pinned draft's, as verify read it; never the spec's draft.method
applied to a checkpoint of another method."""

from __future__ import annotations

import json
from typing import Any

from eagle3_contract.api.spec import DraftMethod
from eagle3_contract.api.status import Checkpoint, StagePhase, StageStatus
from eagle3_contract.api.validation import parse_spec
from eagle3_operator.builders.serving import build_deployment
from eagle3_operator.reconcile.serving import pinned_speculation, served_spec
from tests.harness.results import fake_result
from tests.unit.reconcile.planner_world import RUN, World, tiny

PIN = "export/aaaaaaaaaaaa"


def method_served(deployment: dict[str, Any]) -> str:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    config: dict[str, Any] = json.loads(args[args.index("--speculative-config") + 1])
    return str(config["method"])


def test_the_candidate_export_shipped_is_served_with_its_method() -> None:
    world = World(tiny(draft={"candidates": ["eagle3", "dflash"], "blockSize": 4}))
    world.run_to("none", {"export": fake_result("export", method="dflash")})
    plan = world.step()
    assert plan.status.checkpoint is not None and plan.status.checkpoint.method == DraftMethod.DFLASH
    assert world.deployment is not None and method_served(world.deployment) == "dflash"


def test_without_candidates_the_exported_method_is_the_specs() -> None:
    world = World(tiny())
    world.run_to("none")
    assert world.deployment is not None and method_served(world.deployment) == "eagle3"


def test_a_pinned_draft_is_served_with_the_method_verify_read_from_its_config() -> None:
    spec = parse_spec(tiny(serving={"pinnedCheckpoint": {"path": PIN, "sha256": "ab" * 32}}))
    verify = StageStatus(phase=StagePhase.SUCCEEDED, result={"method": "peagle"})
    checkpoint = pinned_speculation(spec, {"verify": verify}, Checkpoint(path=PIN))
    assert checkpoint is not None and checkpoint.method == DraftMethod.PEAGLE
    served = served_spec(spec, checkpoint)
    assert served.draft.method == DraftMethod.PEAGLE and spec.draft.method == DraftMethod.EAGLE3
    assert method_served(build_deployment(RUN, served, PIN)) == "eagle3"  # P-EAGLE: eagle3, parallel
    args = build_deployment(RUN, served, PIN)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert json.loads(args[args.index("--speculative-config") + 1])["parallel_drafting"] is True
    # a method this version does not know, or none, leaves the spec's
    unknown = StageStatus(phase=StagePhase.SUCCEEDED, result={"method": "mtp"})
    kept = pinned_speculation(spec, {"verify": unknown}, Checkpoint(path=PIN))
    assert kept == Checkpoint(path=PIN) and served_spec(spec, kept) is spec

"""`eagle3 promote` with serving.promotion reviewed: it pins status.candidate (the draft that waits while the
pinned one serves), says in the commit what it replaces, and refuses when there is no candidate, saying why.

The runs are the planner's own statuses (tests/unit/reconcile/planner_world), served as the API server
returns them (tests/unit/test_promote.py's `as_served`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_cli.main import main
from eagle3_operator.promote import PromotionError, build_promotion, commit_message, promotion_candidate
from tests.harness.results import fake_result
from tests.unit.reconcile.planner_world import World, tiny
from tests.unit.test_promote import SHA, as_served

OLD = {"path": "export/0000aaaa1111", "sha256": "ee" * 32}


def trained(pin: dict[str, Any] | None = None, evaluate: float = 2.25) -> World:
    """A reviewed tiny run with a gate that trained, evaluated at `evaluate` and (past the gate) exported."""
    serving: dict[str, Any] = {"promotion": "reviewed"} | ({"pinnedCheckpoint": pin} if pin else {})
    world = World(tiny(serving=serving, evaluation={"minAcceptanceLength": 1.5}))
    world.run_to("evaluate")
    world.succeed("evaluate", fake_result("evaluate", acceptance_length=evaluate, acceptance_rate=0.4167))
    plan = world.step()
    if any(a.body["kind"] == "Job" for a in plan.actions):
        world.succeed("export", fake_result("export", sha256=SHA, bytes=3 * (1 << 20)))
        world.step()
    return world


def served(world: World) -> dict[str, Any]:
    return as_served(world, applied=copy.deepcopy(world.spec))


def test_the_candidate_is_pinned_and_the_run_stays_reviewed() -> None:
    world = trained()
    run = served(world)
    candidate = run["status"]["candidate"]
    assert "checkpoint" not in run["status"], "nothing serves before the first promotion"
    manifest = build_promotion(run)
    pin = {"pinnedCheckpoint": {"path": candidate["path"], "sha256": SHA}}
    assert manifest["spec"]["serving"] == world.spec["serving"] | pin
    assert manifest["spec"]["serving"]["promotion"] == "reviewed"
    message = commit_message(promotion_candidate(run))
    assert message.startswith("eagle3: serve the draft of ml/tiny (mean acceptance length 2.250)\n")
    assert candidate["path"] in message and "replaces" not in message


def test_a_run_serving_an_older_pin_promotes_its_candidate_in_its_place() -> None:
    run = served(trained(OLD))
    assert run["status"]["checkpoint"] == OLD
    manifest = build_promotion(run)
    pin = manifest["spec"]["serving"]["pinnedCheckpoint"]
    assert pin == {"path": run["status"]["candidate"]["path"], "sha256": SHA} and pin != OLD
    text = " ".join(commit_message(promotion_candidate(run)).split())
    assert f"It replaces the pinned draft {OLD['path']} (sha256 {OLD['sha256']})" in text
    assert "mean acceptance length 2.250, acceptance rate 0.417" in text


def test_a_promoted_run_has_no_candidate_and_says_so() -> None:
    world = trained()
    candidate = world.status["candidate"] if world.status else {}
    world.edit(serving={"pinnedCheckpoint": {"path": candidate["path"], "sha256": candidate["sha256"]}})
    world.step()
    world.succeed("verify")
    world.step()
    run = served(world)
    assert "candidate" not in run["status"]
    with pytest.raises(PromotionError, match=r"already promoted.*edit the training in git"):
        build_promotion(run)


def test_a_run_still_training_has_no_candidate_yet() -> None:
    world = World(tiny(serving={"promotion": "reviewed", "pinnedCheckpoint": OLD}))
    world.run_to("train")
    with pytest.raises(
        PromotionError, match=r"no candidate to promote \(status.candidate is empty; stage export"
    ):
        build_promotion(served(world))


def test_a_candidate_below_its_gate_is_refused_by_the_gate() -> None:
    run = served(trained(evaluate=1.2))
    assert "candidate" not in run["status"]
    with pytest.raises(PromotionError, match="did not pass its evaluation gate"):
        build_promotion(run)


def test_the_cli_promotes_the_candidate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = served(trained(OLD))
    source = tmp_path / "tiny.yaml"
    source.write_text(yaml.safe_dump(run))
    assert main(["promote", "tiny", "--from-file", str(source)]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out) == build_promotion(run)
    assert "It replaces the pinned draft" in err

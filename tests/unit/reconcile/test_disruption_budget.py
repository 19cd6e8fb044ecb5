"""The serving PodDisruptionBudget: created with the vLLM Deployment, patched when its budget changes,
deleted when disabled or with serving, and never planned where the cluster does not serve policy/v1."""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.validation import parse_spec
from eagle3_operator.builders import names
from eagle3_operator.builders.disruption import build_pod_disruption_budget
from eagle3_operator.reconcile.serving import plan_disruption_budget
from tests.tiny_spec import tiny
from tests.unit.reconcile.planner_world import RUN, World, keys

PDB = "PodDisruptionBudget"
VLLM = names.serving_name(RUN.name)


def serving_world(**sections: Any) -> World:
    world = World(tiny(**sections), disruption_budgets_served=True)
    world.run_to("none")
    return world


def test_the_budget_is_created_with_the_deployment() -> None:
    world = World(tiny(), disruption_budgets_served=True)
    world.run_to("none")
    assert world.deployment is not None
    pdb = world.objects[(PDB, VLLM)]
    assert pdb == build_pod_disruption_budget(RUN, parse_spec(world.spec))
    assert pdb["spec"]["maxUnavailable"] == 1
    assert world.step().actions == ()


def test_no_budget_where_the_cluster_does_not_serve_policy_v1() -> None:
    world = World(tiny(), disruption_budgets_served=False)
    world.run_to("none")
    assert world.deployment is not None
    assert (PDB, VLLM) not in world.objects
    assert plan_disruption_budget(RUN, parse_spec(world.spec), world.observed()) == []


def test_a_changed_budget_is_patched_and_nothing_else() -> None:
    world = serving_world()
    world.edit(serving={"disruptionBudget": {"maxUnavailable": "50%"}})
    plan = world.step()
    assert keys(plan) == [("patch", PDB, VLLM)]
    assert world.objects[(PDB, VLLM)]["spec"]["maxUnavailable"] == "50%"
    assert world.step().actions == ()


def test_a_disabled_budget_is_deleted() -> None:
    world = serving_world()
    world.edit(serving={"disruptionBudget": {"enabled": False}})
    plan = world.step()
    assert keys(plan) == [("delete", PDB, VLLM)]
    [delete] = plan.actions
    assert delete.body["apiVersion"] == "policy/v1"
    assert (PDB, VLLM) not in world.objects
    assert world.step().actions == ()


def test_a_disabled_budget_is_never_created() -> None:
    world = serving_world(serving={"disruptionBudget": {"enabled": False}})
    assert world.deployment is not None
    assert (PDB, VLLM) not in world.objects


def test_disabling_serving_deletes_the_budget_with_the_deployment() -> None:
    world = serving_world()
    world.edit(serving={"enabled": False})
    plan = world.step()
    assert ("delete", PDB, VLLM) in keys(plan)
    assert ("delete", "Deployment", VLLM) in keys(plan)
    assert (PDB, VLLM) not in world.objects


def test_a_budget_of_an_older_operator_is_patched_once() -> None:
    world = serving_world()
    world.objects[(PDB, VLLM)]["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH] = "stale"
    assert keys(world.step()) == [("patch", PDB, VLLM)]
    assert keys(world.step()) == []

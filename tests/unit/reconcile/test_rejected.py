"""A write the API server refuses as invalid (HTTP 422) as the run's SpecValid condition, reason Rejected:
the Status's causes and message read from the server's answer, and the plan the executor writes instead.
The whole path through kopf and the API mock: tests/operator/test_rejected_child.py."""

from __future__ import annotations

import json

from eagle3_contract.api.status import ConditionType, Eagle3RunStatus, RunPhase
from eagle3_contract.reasons import REJECTED
from eagle3_operator.k8s import ApiError
from eagle3_operator.reconcile.actions import Action
from eagle3_operator.reconcile.executor import REJECTED_MESSAGE_MAX, plan_rejected, rejection
from eagle3_operator.reconcile.planner import Plan

STATUS = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'PodDisruptionBudget.policy "tiny-vllm" is invalid: spec.maxUnavailable: Invalid value: '
    '"150%": must not be greater than 100%',
    "reason": "Invalid",
    "details": {
        "name": "tiny-vllm",
        "group": "policy",
        "kind": "PodDisruptionBudget",
        "causes": [
            {"reason": "FieldValueInvalid", "message": "Invalid value", "field": "spec.maxUnavailable"},
            {"reason": "FieldValueInvalid", "message": "Invalid value", "field": "spec.selector"},
            {"reason": "FieldValueInvalid", "message": "Invalid value", "field": "spec.maxUnavailable"},
        ],
    },
    "code": 422,
}
PDB = {
    "apiVersion": "policy/v1",
    "kind": "PodDisruptionBudget",
    "metadata": {"name": "tiny-vllm", "namespace": "e3"},
}


def _error(detail: str, status: int = 422) -> ApiError:
    return ApiError(status, "create", "PodDisruptionBudget e3/tiny-vllm", detail)


def test_the_causes_and_message_of_the_servers_status_are_read() -> None:
    err = _error(json.dumps(STATUS))
    assert err.invalid and not err.transient
    assert err.fields() == ["spec.maxUnavailable", "spec.selector"]
    assert err.server_message() == STATUS["message"]
    assert rejection(Action("create", PDB), err) == (
        "the API server refused to create PodDisruptionBudget tiny-vllm (the fields spec.maxUnavailable, "
        f"spec.selector): {STATUS['message']}"
    )


def test_an_answer_that_is_no_status_is_quoted_as_it_came() -> None:
    err = _error("upstream said\n  no")
    assert err.fields() == [] and err.server_message() == "upstream said no"
    assert rejection(Action("patch", PDB), err) == (
        "the API server refused to patch PodDisruptionBudget tiny-vllm: upstream said no"
    )
    assert not _error(json.dumps(STATUS), status=409).invalid


def test_a_long_message_is_cut() -> None:
    err = _error(json.dumps({**STATUS, "message": "x" * (REJECTED_MESSAGE_MAX * 2)}))
    said = rejection(Action("create", PDB), err)
    assert said.endswith("x ...") and len(said) < REJECTED_MESSAGE_MAX + 200


def test_the_rejected_plan_keeps_the_status_as_last_written_but_spec_valid_and_phase() -> None:
    previous = Eagle3RunStatus.model_validate(
        {
            "phase": "Serving",
            "observedGeneration": 2,
            "conditions": [
                {"type": "SpecValid", "status": "True", "reason": "Valid", "message": "ok",
                 "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2},
                {"type": "Ready", "status": "True", "reason": "DeploymentReady", "message": "1 replica(s)",
                 "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2},
            ],
        }
    )  # fmt: skip
    planned = Eagle3RunStatus.model_validate({"phase": "Serving", "observedGeneration": 3})
    plan = Plan(actions=(Action("create", PDB),), status=planned, phase=RunPhase.SERVING, previous=previous)
    rejected = plan_rejected(plan, Action("create", PDB), _error(json.dumps(STATUS)), "2026-01-02T00:00:00Z")
    assert rejected.phase == RunPhase.INVALID and rejected.actions == ()
    valid = next(c for c in rejected.status.conditions if c.type == ConditionType.SPEC_VALID)
    assert (valid.status, valid.reason, valid.observed_generation) == ("False", REJECTED, 3)
    assert valid.last_transition_time == "2026-01-02T00:00:00Z"
    assert valid.message.startswith("the API server refused to create PodDisruptionBudget tiny-vllm")
    assert valid.message.endswith(". Fix the spec and apply it again.")
    ready = next(c for c in rejected.status.conditions if c.type == ConditionType.READY)
    assert ready.status == "True", "what was serving still serves: only SpecValid and the phase change"
    assert rejected.problems == (valid.message.removesuffix(". Fix the spec and apply it again."),)
    # refused again at the next reconcile: the condition keeps its transition time
    again = plan_rejected(
        Plan(actions=plan.actions, status=planned, phase=RunPhase.SERVING, previous=rejected.status),
        Action("create", PDB),
        _error(json.dumps(STATUS)),
        "2026-01-03T00:00:00Z",
    )
    assert again.status == rejected.status

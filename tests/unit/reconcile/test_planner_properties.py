"""plan_run over generated specs and generated children: it always plans, and what it plans is well-formed.

Specs come from the API tests' strategies (derived from the CRD schema); children are the builders' own Jobs
for the spec's stages (some of an older hash) in random phases with random pod terminations, plus random
ConfigMaps, Services and a Deployment, all observed through observe.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from eagle3_contract.api.status import Eagle3RunStatus, RunPhase
from eagle3_contract.api.validation import parse_spec, spec_document
from eagle3_contract.exit_codes import CHECK_FAILED_EXIT_CODE, OOM_EXIT_CODE
from eagle3_contract.stages import content_hash, plan_stages
from eagle3_operator.builders import names
from eagle3_operator.builders.job import build_job
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.pod_security import pod_security
from eagle3_operator.builders.serving import build_deployment
from eagle3_operator.reconcile.planner import Plan, plan_run
from tests.contract.api.api_support import valid_specs
from tests.contract.api.test_spec_validation import JSON, field_mutations
from tests.harness.results import fake_result
from tests.unit.reconcile.planner_world import World, job_status, pod_of, terminated, ts

PROPERTIES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
RUN_NAMES = st.from_regex(rf"{DNS_LABEL}(\.{DNS_LABEL}){{0,3}}", fullmatch=True).filter(
    lambda n: len(n) <= 253
)
STALE_HASH = "0" * 12
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # every kind's name, Services' included
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")

TERMINATIONS = st.sampled_from(
    [
        None,
        (
            0,
            "Completed",
            json.dumps({"samples": 3, "acceptanceLength": 2.5, "sha256": "ab" * 32, "bytes": 9}),
        ),
        (0, "Completed", json.dumps({"acceptanceLength": 1.01})),
        (0, "Completed", "plain text"),
        (0, "Completed", "[1, 2]"),
        (0, "Completed", None),
        (1, "Error", "Traceback: boom"),
        (137, "OOMKilled", None),
        (OOM_EXIT_CODE, "Error", "CUDA out of memory"),
        (
            CHECK_FAILED_EXIT_CODE,
            "Error",
            json.dumps({"error": "wrong digest", "reason": "ChecksumMismatch"}),
        ),
        (CHECK_FAILED_EXIT_CODE, "Error", json.dumps({"error": "no file", "reason": "not camel case"})),
    ]
)
JOB_PHASES = st.sampled_from(
    ["pending", "running", "complete", "complete-no-pod", "failed", "failure-target"]
)


def startable(spec: Any) -> bool:
    """Whether the spec's pods can start at all (the planner refuses the others, whatever the Pod Security
    floor: tests/unit/reconcile/test_planner.py). These properties run under the lowest floor, "privileged":
    the floor's refusal is tested on its own."""
    return not pod_security(RunRef("r", "ns", "u"), spec, plan_stages(spec)[0]).never_start


@st.composite
def situations(draw: st.DrawFn) -> World:
    """A valid spec and children of it in any state."""
    doc = draw(valid_specs())
    spec = parse_spec(doc)
    assume(startable(spec))
    ref = RunRef(draw(RUN_NAMES), "ns", "uid-1")
    world = World(doc, ref=ref, generation=draw(st.integers(1, 5)), pod_security_floor="privileged")
    spec_cm = names.spec_configmap_name(ref.name, content_hash(spec_document(spec)))
    plans = plan_stages(spec)
    done = draw(st.integers(0, len(plans)))  # the first `done` stages succeeded for this spec
    for plan in plans[:done]:
        job = build_job(ref, spec, plan, 0, plan.token_budget, spec_cm)
        job["status"] = job_status("complete", ts(0))
        result = json.dumps(fake_result(plan.stage))
        done_state = {"terminated": terminated(0, "Completed", result, ts(0))}
        world.jobs[job["metadata"]["name"]] = job
        world.pods[job["metadata"]["name"]] = pod_of(job, "x", done_state, "Succeeded")
    for plan in plans:
        for _ in range(draw(st.integers(0, 2))):
            of = plan
            if draw(st.integers(0, 3)) == 0:  # a Job of an older spec
                of = dataclasses.replace(plan, hash=STALE_HASH, output_dir=f"{plan.stage.value}/{STALE_HASH}")
            attempt = draw(st.integers(0, 3))
            budget = None if of.token_budget is None else max(of.token_budget >> attempt, 1)
            cm = spec_cm if draw(st.booleans()) else names.spec_configmap_name(ref.name, STALE_HASH)
            job = build_job(ref, spec, of, attempt, budget, cm)
            phase = draw(JOB_PHASES)
            at = ts(draw(st.integers(0, 10**6)))
            job["status"] = job_status(phase, at)
            world.jobs[job["metadata"]["name"]] = job
            term = draw(TERMINATIONS)
            if phase == "pending" or phase == "complete-no-pod":
                continue
            if term is None or phase == "running":
                state: dict[str, Any] = {"running": {"startedAt": at}}
            else:
                state = {"terminated": terminated(term[0], term[1], term[2], at)}
            world.pods[job["metadata"]["name"]] = pod_of(job, "x", state, "Running")
    claim = names.artifacts_claim_name(ref.name)
    vllm = names.serving_name(ref.name)
    for kind, name in (
        ("PersistentVolumeClaim", claim),
        ("ConfigMap", spec_cm),
        ("ConfigMap", names.spec_configmap_name(ref.name, STALE_HASH)),
        ("ConfigMap", names.spec_configmap_name(ref.name, "1" * 12)),
        ("Service", vllm),
        ("PodMonitor", vllm),
    ):
        if draw(st.booleans()):
            world.objects[(kind, name)] = {"kind": kind, "metadata": {"name": name}}
    if draw(st.booleans()):
        deployment = build_deployment(ref, spec, draw(st.sampled_from(["export/abc", "/pinned/draft"])))
        if draw(st.booleans()):
            deployment["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH] = STALE_HASH
        deployment["status"] = {"readyReplicas": draw(st.integers(0, 3))}
        world.deployment = deployment
    world.pod_monitors_served = draw(st.booleans())
    return world


def check_plan(plan: Plan) -> None:
    """What every plan of a valid spec must be."""
    assert plan.phase != RunPhase.INVALID and plan.problems == ()
    status = plan.status
    assert Eagle3RunStatus.model_validate(status.document()) == status, "the patch reads back as written"
    assert status.document()["phase"] == plan.phase
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert (failed.status == "True") == (plan.phase == RunPhase.FAILED)
    targets = Counter((a.body["kind"], a.body["metadata"]["name"]) for a in plan.actions)
    assert all(n == 1 for n in targets.values()), f"an object is written twice: {targets}"
    for action in plan.actions:
        meta = action.body["metadata"]
        assert len(meta["name"]) <= names.MAX_NAME and DNS_1035.fullmatch(meta["name"]), meta["name"]
        assert all(len(v) <= 63 and LABEL_VALUE.fullmatch(v) for v in meta.get("labels", {}).values())
        if action.verb == "create" and action.body["kind"] == "Job":
            assert meta["labels"][names.LABEL_HASH] != STALE_HASH


@PROPERTIES
@given(valid_specs(), RUN_NAMES)
def test_a_fresh_run_plans_its_first_stage(doc: dict[str, Any], run: str) -> None:
    assume(startable(parse_spec(doc)))
    world = World(doc, ref=RunRef(run, "ns", "uid"), pod_security_floor="privileged")
    plan = world.plan()
    check_plan(plan)
    spec = parse_spec(doc)
    kinds = [a.body["kind"] for a in plan.actions]
    pinned = spec.serving.pinned_checkpoint
    checked = pinned is not None and pinned.sha256 is not None  # verify runs before the Deployment
    trains = pinned is None or spec.serving.promotion == "reviewed"  # reviewed: a pin does not skip training
    stages = [
        a.body["metadata"]["labels"][names.LABEL_STAGE] for a in plan.actions if a.body["kind"] == "Job"
    ]
    if spec.suspend and (pinned is None or checked):
        assert plan.actions == () and plan.phase == RunPhase.SUSPENDED
    else:
        first = "predict" if spec.evaluation.predict else "prepare"  # the prediction comes before training
        assert stages == [first] * (trains and not spec.suspend) + ["verify"] * checked
        assert ("Deployment" in kinds) == (pinned is not None and not checked)  # unchecked: served at once
    assert all(a.verb == "create" for a in plan.actions)


@PROPERTIES
@given(situations())
def test_any_children_plan_without_error(world: World) -> None:
    plan = world.plan()
    check_plan(plan)
    world.status = plan.status.document()
    check_plan(world.plan(ts(10**7)))  # and once more, remembering the status


@PROPERTIES
@given(situations())
def test_applying_a_plan_settles(world: World) -> None:
    """Once its creates exist (Jobs still Pending) a plan is not made again: no create or patch repeats."""
    first = world.step()
    second = world.plan()
    check_plan(second)
    repeated = {a.key for a in first.actions} & {a.key for a in second.actions}
    assert not repeated, repeated
    assert [a.key for a in second.actions if a.verb != "delete"] == []


@PROPERTIES
@given(field_mutations(), situations())
def test_an_invalid_spec_plans_nothing_and_names_the_field(
    case: tuple[dict[str, Any], str, str], world: World
) -> None:
    doc, path, what = case
    previous = world.plan().status.document()
    plan = plan_run(world.ref, 7, doc, previous, world.observed(), ts(1))
    assert plan.actions == (), what
    assert plan.phase == plan.status.document()["phase"] == RunPhase.INVALID
    assert plan.problems and all(p.startswith(f"{path}: ") for p in plan.problems), (what, plan.problems)
    valid = next(c for c in plan.status.document()["conditions"] if c["type"] == "SpecValid")
    assert valid["status"] == "False" and path in valid["message"]
    assert plan.status.document()["observedGeneration"] == 7
    assert plan.status.document()["stages"] == previous["stages"]  # what the run did stays on record


@PROPERTIES
@given(JSON, st.none() | JSON)
def test_nothing_but_a_plan_comes_out_of_arbitrary_documents(spec: Any, status: Any) -> None:
    plan = plan_run(
        RunRef("r", "ns", "u"),
        None,
        spec,
        status if isinstance(status, dict) else None,
        World({}).observed(),
        ts(0),
    )
    assert plan.phase == RunPhase.INVALID and plan.actions == ()
    assert all(p.startswith("spec") for p in plan.problems)

"""serving.canary: the pure decision (plan_canary) and the planner around it (plan_run with pinned drafts).

A pinned draft without a sha256 serves at once (no stage runs), so changing the pin is the quickest way to a
new draft while another one serves: the same path a reviewed promotion or a new export takes to `rollout`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import pytest

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.speculation import SCHEDULE_KEY
from eagle3_contract.api.status import (
    CanaryPhase,
    CanaryStatus,
    Checkpoint,
    Eagle3RunStatus,
    StagePhase,
    StageStatus,
    TrackFigures,
)
from eagle3_contract.api.validation import parse_spec
from eagle3_operator.builders import names
from eagle3_operator.builders.serving import build_canary_deployment
from eagle3_operator.reconcile.canary import INCONCLUSIVE, canary_news, plan_canary
from eagle3_operator.reconcile.observe import CanaryFigures, DeploymentView, Observed
from eagle3_operator.reconcile.serving import pinned_speculation, schedule_of, tuned_note
from tests.unit.reconcile.planner_world import RUN, World, condition_of, keys, tiny, ts

OLD, NEW = "/artifacts/export/old", "/artifacts/export/new"
URL = "http://prometheus.monitoring.svc:9090"
CANARY = {"replicas": 1, "duration": "10m", "minRequests": 100, "tolerance": 0.05, "timeout": "1h"}
CANARY_NAME = names.canary_name(RUN.name)
GOOD = TrackFigures(acceptance_length=1.5, output_tokens_per_second=40.0, requests=500)


def spec(canary: dict[str, Any] | None = CANARY, url: str | None = URL) -> Eagle3RunSpec:
    serving: dict[str, Any] = {"speculationLength": "fixed"}
    if canary is not None:
        serving["canary"] = canary | ({"prometheusUrl": url} if url else {})
    return parse_spec(tiny(serving=serving))


def incumbent(draft: str = OLD) -> DeploymentView:
    return DeploymentView(
        name=names.serving_name(RUN.name), spec_hash="x", draft=draft, replicas=1, ready_replicas=1
    )


def canary_view(ready: int = 1) -> DeploymentView:
    built = build_canary_deployment(RUN, spec(), NEW)["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH]
    return DeploymentView(
        name=CANARY_NAME,
        spec_hash=built,
        draft=NEW,
        replicas=1,
        ready_replicas=ready,
        track=names.TRACK_CANARY,
    )


def observing(started: str | None = ts(0), since: str = ts(0)) -> Eagle3RunStatus:
    """A status whose canary of NEW has been observed since `since` (its window started at `started`)."""
    status = CanaryStatus(
        phase=CanaryPhase.OBSERVING, deployment=CANARY_NAME, draft=NEW, incumbent_draft=OLD, started=started
    )
    cond = {
        "type": "Canary",
        "status": "Unknown",
        "reason": "Observing",
        "message": "observing",
        "lastTransitionTime": since,
    }
    return Eagle3RunStatus.model_validate({"conditions": [cond]}).model_copy(update={"canary": status})


def figures(canary: TrackFigures = GOOD, incumbent_figures: TrackFigures = GOOD) -> CanaryFigures:
    return CanaryFigures(incumbent=incumbent_figures, canary=canary)


def decide(
    observed_figures: CanaryFigures | None,
    now: float = 700,
    previous: Eagle3RunStatus | None = None,
    **spec_args: Any,
) -> Any:
    observed = Observed(deployment=incumbent(), canary=canary_view(), canary_figures=observed_figures)
    return plan_canary(
        RUN, spec(**spec_args), observed, Checkpoint(path=NEW), previous or observing(), ts(now)
    )


# --- when a canary is made ----------------------------------------------------------------------------------


def test_a_new_draft_next_to_an_incumbent_starts_a_canary_and_keeps_the_incumbent() -> None:
    plan = plan_canary(
        RUN, spec(), Observed(deployment=incumbent()), Checkpoint(path=NEW), Eagle3RunStatus(), ts(0)
    )
    assert plan.serve is None  # the serving Deployment keeps OLD
    assert [a.key for a in plan.actions] == [("create", "Deployment", CANARY_NAME)]
    assert plan.status is not None and plan.status.phase == CanaryPhase.OBSERVING
    assert plan.status.started is None and plan.status.incumbent_draft == OLD
    assert plan.condition is not None and plan.condition.status == "Unknown"
    assert "a ready canary replica (0/1 ready)" in plan.condition.message


def test_the_first_rollout_and_a_run_without_canary_replace_at_once() -> None:
    first = plan_canary(RUN, spec(), Observed(), Checkpoint(path=NEW), Eagle3RunStatus(), ts(0))
    assert first.serve == Checkpoint(path=NEW) and first.actions == () and first.status is None
    plain = plan_canary(
        RUN, spec(None), Observed(deployment=incumbent()), Checkpoint(path=NEW), Eagle3RunStatus(), ts(0)
    )
    assert plain.serve == Checkpoint(path=NEW) and plain.actions == () and plain.condition is None


def test_a_canary_removed_from_the_spec_mid_way_is_deleted_and_the_draft_rolls_out() -> None:
    observed = Observed(deployment=incumbent(), canary=canary_view())
    plan = plan_canary(RUN, spec(None), observed, Checkpoint(path=NEW), observing(), ts(100))
    assert plan.serve == Checkpoint(path=NEW)
    assert [a.key for a in plan.actions] == [("delete", "Deployment", CANARY_NAME)]
    assert plan.status is None and plan.condition is None


def test_the_window_starts_at_the_first_ready_replica() -> None:
    previous = observing(started=None, since=ts(0))
    plan = plan_canary(
        RUN,
        spec(),
        Observed(deployment=incumbent(), canary=canary_view()),
        Checkpoint(path=NEW),
        previous,
        ts(90),
    )
    assert plan.status is not None and plan.status.started == ts(90)
    assert plan.condition is not None and plan.condition.last_transition_time == ts(0)  # the timeout's origin


# --- the decision --------------------------------------------------------------------------------


def test_a_canary_as_good_as_the_incumbent_is_promoted() -> None:
    plan = decide(figures())
    assert plan.serve == Checkpoint(path=NEW)
    assert [a.key for a in plan.actions] == [("delete", "Deployment", CANARY_NAME)]
    assert plan.status.phase == CanaryPhase.PROMOTED and plan.status.decided == ts(700)
    assert plan.status.seconds_to_decision == 700
    assert (plan.condition.status, plan.condition.reason) == ("True", "Promoted")


def test_a_canary_with_a_lower_acceptance_length_is_rolled_back_with_both_figures() -> None:
    bad = TrackFigures(acceptance_length=1.0, output_tokens_per_second=41.2, requests=300)
    plan = decide(
        figures(
            canary=bad,
            incumbent_figures=TrackFigures(
                acceptance_length=1.52, output_tokens_per_second=40.8, requests=600
            ),
        )
    )
    assert plan.serve is None
    assert [a.key for a in plan.actions] == [("delete", "Deployment", CANARY_NAME)]
    assert plan.status.phase == CanaryPhase.ROLLED_BACK
    assert (plan.condition.status, plan.condition.reason) == ("False", "RolledBack")
    assert (
        f"canary draft {NEW}: mean acceptance length 1.00 vs incumbent 1.52, 41.2 vs 40.8 output "
        "tokens/s per request" in plan.condition.message
    )
    assert "(tolerance 5%): rolled back" in plan.condition.message
    assert plan.status.canary == bad and plan.status.incumbent is not None


def test_a_slower_canary_is_rolled_back() -> None:
    slow = GOOD.model_copy(update={"output_tokens_per_second": 30.0})
    plan = decide(figures(canary=slow))
    assert plan.serve is None and plan.status.phase == CanaryPhase.ROLLED_BACK


@pytest.mark.parametrize(
    ("length", "speed", "promoted"), [(1.43, 38.1, True), (1.42, 40.0, False), (1.5, 37.9, False)]
)
def test_the_tolerance_is_a_fraction_of_the_incumbents_figures(
    length: float, speed: float, promoted: bool
) -> None:
    """5% of 1.5 is 0.075 (>= 1.425 passes), 5% of 40 is 2 (>= 38 passes)."""
    plan = decide(
        figures(canary=TrackFigures(acceptance_length=length, output_tokens_per_second=speed, requests=500))
    )
    assert (plan.status.phase == CanaryPhase.PROMOTED) is promoted


def test_the_decision_waits_for_the_duration() -> None:
    plan = decide(figures(), now=300)
    assert plan.serve is None and plan.actions == ()
    assert plan.status.phase == CanaryPhase.OBSERVING
    assert "5m00s left of serving.canary.duration 10m" in plan.condition.message
    assert plan.status.canary == GOOD  # the figures so far are in status


def test_the_decision_waits_for_min_requests() -> None:
    few = GOOD.model_copy(update={"requests": 37})
    plan = decide(figures(canary=few))
    assert plan.status.phase == CanaryPhase.OBSERVING
    assert "37/100 canary requests" in plan.condition.message


def test_no_figures_from_prometheus_waits_and_says_why() -> None:
    plan = decide(CanaryFigures(problem="Prometheus at http://x does not answer (no answer in time)"))
    assert plan.status.phase == CanaryPhase.OBSERVING and plan.status.canary is None
    assert "does not answer" in plan.condition.message


def test_no_prometheus_url_waits_with_what_to_set_and_rolls_back_at_the_timeout() -> None:
    plan = decide(None, url=None)
    assert plan.status.phase == CanaryPhase.OBSERVING
    assert "set serving.canary.prometheusUrl or the operator's --prometheus-url" in plan.condition.message
    late = decide(None, now=3600, url=None)
    assert late.status.phase == CanaryPhase.ROLLED_BACK and late.serve is None
    assert (late.condition.status, late.condition.reason) == ("False", INCONCLUSIVE)
    assert "no decision within serving.canary.timeout 1h" in late.condition.message


def test_too_little_traffic_rolls_back_at_the_timeout() -> None:
    few = GOOD.model_copy(update={"requests": 3})
    plan = decide(figures(canary=few), now=3600)
    assert plan.status.phase == CanaryPhase.ROLLED_BACK and plan.condition.reason == INCONCLUSIVE
    assert [a.key for a in plan.actions] == [("delete", "Deployment", CANARY_NAME)]


def test_a_decided_canary_is_kept_and_a_rolled_back_draft_is_not_canaried_again() -> None:
    rolled = decide(figures(canary=GOOD.model_copy(update={"acceptance_length": 1.0})))
    previous = Eagle3RunStatus(conditions=[rolled.condition], canary=rolled.status)
    again = plan_canary(
        RUN, spec(), Observed(deployment=incumbent()), Checkpoint(path=NEW), previous, ts(800)
    )
    assert again.actions == () and again.serve is None
    assert again.status == rolled.status and again.condition == rolled.condition
    newer = plan_canary(
        RUN,
        spec(),
        Observed(deployment=incumbent()),
        Checkpoint(path="/artifacts/export/newer"),
        previous,
        ts(900),
    )
    assert newer.status is not None and newer.status.phase == CanaryPhase.OBSERVING
    assert newer.condition is not None and newer.condition.last_transition_time == ts(900)


def test_events_once_per_transition() -> None:
    def status(phase: CanaryPhase, **fields: Any) -> Eagle3RunStatus:
        canary = CanaryStatus(phase=phase, draft=NEW, deployment=CANARY_NAME, **fields)
        return Eagle3RunStatus(canary=canary)

    started = status(CanaryPhase.OBSERVING, replicas=1)
    assert [(w, r) for w, r, _ in canary_news(Eagle3RunStatus(), started)] == [(False, "CanaryStarted")]
    assert canary_news(started, started) == []
    promoted = status(CanaryPhase.PROMOTED, message="figures")
    assert canary_news(started, promoted) == [(False, "CanaryPromoted", "figures")]
    rolled = status(CanaryPhase.ROLLED_BACK, message="figures")
    assert canary_news(started, rolled) == [(True, "CanaryRolledBack", "figures")]


# --- the planner around it ----------------------------------------------------------------------


@dataclass
class CanaryWorld(World):
    """World with the figures the executor would read from Prometheus."""

    figures: CanaryFigures | None = None

    def observed(self) -> Observed:
        return replace(super().observed(), canary_figures=self.figures)


def serving_with(draft: str) -> CanaryWorld:
    world = CanaryWorld(
        tiny(serving={"pinnedCheckpoint": {"path": draft}, "canary": CANARY | {"prometheusUrl": URL}})
    )
    world.step()
    world.ready()
    world.step()
    return world


def draft_of(body: dict[str, Any] | None) -> str:
    assert body is not None
    return str(body["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_DRAFT])


def test_plan_run_canaries_a_new_pin_and_promotes_it() -> None:
    world = serving_with(OLD)
    world.edit(serving={"pinnedCheckpoint": {"path": NEW}})
    plan = world.step()
    assert ("create", "Deployment", CANARY_NAME) in keys(plan)
    assert not any(k[1] == "Deployment" and k[2] == names.serving_name(RUN.name) for k in keys(plan))
    canary = world.workloads[CANARY_NAME]
    assert draft_of(canary) == NEW and draft_of(world.deployment) == OLD
    assert canary["spec"]["template"]["metadata"]["labels"][names.LABEL_TRACK] == names.TRACK_CANARY
    assert condition_of(plan.status.document(), "Ready")["status"] == "True"  # the incumbent serves on
    assert condition_of(plan.status.document(), "Canary")["status"] == "Unknown"
    canary["status"] = {"readyReplicas": 1}
    world.clock = 60
    assert world.step().status.document()["canary"]["started"] == ts(60)
    world.figures = figures()
    world.clock = 60 + 600
    plan = world.step()
    assert plan.status.document()["canary"]["phase"] == "Promoted"
    assert keys(plan)[-2:] == [
        ("patch", "Deployment", names.serving_name(RUN.name)),
        ("delete", "Deployment", CANARY_NAME),
    ]
    assert draft_of(world.deployment) == NEW and CANARY_NAME not in world.workloads
    assert condition_of(plan.status.document(), "Canary")["reason"] == "Promoted"
    world.clock += 30
    after = world.step()  # the incumbent now serves NEW: nothing more to do, the decision stays in status
    assert after.actions == () and after.status.document()["canary"]["phase"] == "Promoted"


def test_plan_run_rolls_a_bad_canary_back_and_keeps_the_incumbent() -> None:
    world = serving_with(OLD)
    world.edit(serving={"pinnedCheckpoint": {"path": NEW}})
    world.step()
    world.workloads[CANARY_NAME]["status"] = {"readyReplicas": 1}
    world.step()
    world.figures = figures(canary=GOOD.model_copy(update={"acceptance_length": 1.0}))
    world.clock = 601
    plan = world.step()
    assert plan.status.document()["canary"]["phase"] == "RolledBack"
    assert keys(plan) == [("delete", "Deployment", CANARY_NAME)]
    assert draft_of(world.deployment) == OLD
    assert plan.status.document()["serving"]["draft"] == OLD
    assert condition_of(plan.status.document(), "Ready")["status"] == "True"
    world.clock += 600
    assert world.step().actions == ()  # not canaried again while NEW stays the pin


# --- serving.speculationLength tuned ------------------------------------------------------------------------


def test_tuned_without_a_schedule_serves_num_speculative_tokens_and_ready_says_so() -> None:
    world = World(tiny(serving={"pinnedCheckpoint": {"path": OLD}, "speculationLength": "tuned"}))
    world.step()
    world.ready()
    ready = condition_of(world.step().status.document(), "Ready")
    assert ready["status"] == "True"
    assert f"serving.speculationLength is tuned but draft {OLD} has no measured schedule" in ready["message"]
    assert SCHEDULE_KEY not in json.dumps(world.deployment)


def test_a_pinned_drafts_schedule_comes_from_the_verify_result_and_is_served() -> None:
    table = {"schedule": [{"minBatchSize": 1, "maxBatchSize": 4, "numSpeculativeTokens": 2}]}
    pinned = parse_spec(tiny(serving={"pinnedCheckpoint": {"path": OLD}, "speculationLength": "tuned"}))
    verify = StageStatus(phase=StagePhase.SUCCEEDED, result={"speculation": table})
    checkpoint = pinned_speculation(pinned, {"verify": verify}, Checkpoint(path=OLD))
    assert checkpoint is not None and checkpoint.speculation is not None
    schedule = schedule_of(pinned, checkpoint)
    assert [(r.min_batch_size, r.max_batch_size, r.num_speculative_tokens) for r in schedule] == [(1, 4, 2)]
    assert tuned_note(pinned, checkpoint) == ""
    fixed = parse_spec(tiny(serving={"pinnedCheckpoint": {"path": OLD}, "speculationLength": "fixed"}))
    assert schedule_of(fixed, checkpoint) == []  # fixed ignores the table
    unreadable = StageStatus(phase=StagePhase.SUCCEEDED, result={"speculation": {"schedule": "x"}})
    assert pinned_speculation(pinned, {"verify": unreadable}, Checkpoint(path=OLD)) == Checkpoint(path=OLD)

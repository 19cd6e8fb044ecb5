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
from eagle3_operator.reconcile.canary import INCONCLUSIVE, NOT_DISTINGUISHABLE, canary_news, plan_canary
from eagle3_operator.reconcile.canary_verdict import MIN_WINDOW_REQUESTS
from eagle3_operator.reconcile.observe import CanaryFigures, DeploymentView, Observed, TrackWindows
from eagle3_operator.reconcile.serving import pinned_speculation, schedule_of, tuned_note
from tests.unit.reconcile.planner_world import RUN, World, condition_of, keys, tiny, ts

OLD, NEW = "/artifacts/export/old", "/artifacts/export/new"
URL = "http://prometheus.monitoring.svc:9090"
CANARY = {"replicas": 1, "duration": "10m", "minRequests": 100, "tolerance": 0.05, "timeout": "1h"}
SHORT = CANARY | {"timeout": "20m"}  # shorter than the duration and its extension
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


WINDOW_REQUESTS = 70  # requests a track finishes in a 100 s sub-window


def steady(fig: TrackFigures, count: int = 7) -> TrackWindows:
    """A track whose every sub-window shows its totals (7: the complete 100 s sub-windows at 700 s)."""
    return TrackWindows(
        (fig.acceptance_length,) * count, (fig.output_tokens_per_second,) * count, (WINDOW_REQUESTS,) * count
    )


def figures(
    canary: TrackFigures = GOOD,
    incumbent_figures: TrackFigures = GOOD,
    canary_windows: TrackWindows | None = None,
    incumbent_windows: TrackWindows | None = None,
) -> CanaryFigures:
    return CanaryFigures(
        incumbent=incumbent_figures,
        canary=canary,
        incumbent_windows=incumbent_windows or steady(incumbent_figures),
        canary_windows=canary_windows or steady(canary),
    )


def speeds(ratios: list[float | None], length: float = 1.5) -> CanaryFigures:
    """The canary's output tokens/s at `ratios` x the incumbent's 40, sub-window by sub-window (None: the
    canary finished no request there), its acceptance length as the incumbent's."""
    count = len(ratios)
    canary = TrackWindows(
        (length,) * count,
        tuple(None if r is None else 40.0 * r for r in ratios),
        tuple(0 if r is None else WINDOW_REQUESTS for r in ratios),
    )
    return figures(canary_windows=canary, incumbent_windows=steady(GOOD, count))


def after(plan: Any) -> Eagle3RunStatus:
    """The status a plan wrote, as the next reconcile reads it."""
    return Eagle3RunStatus(conditions=[plan.condition], canary=plan.status)


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
    assert plan.status.window_seconds == 100 and not plan.status.extended  # 10m / 6 sub-windows
    acceptance, speed = plan.status.acceptance_ratio, plan.status.speed_ratio
    assert acceptance is not None and speed is not None and (acceptance.rounds, speed.rounds) == (7, 7)
    assert speed.ratio == 1.0 and acceptance.low == acceptance.high == round(1.5 / 1.5, 4)
    assert f"output tokens/s per request {speed.text()} above it" in plan.condition.message


def test_promoted_when_both_intervals_clear_the_threshold() -> None:
    plan = decide(speeds([0.97, 1.02, 0.99, 1.04, 0.98, 1.01]))
    assert plan.status.phase == CanaryPhase.PROMOTED and plan.serve == Checkpoint(path=NEW)
    speed = plan.status.speed_ratio
    assert speed is not None and (speed.low, speed.high, speed.rounds) == (0.97, 1.04, 6)
    assert "against 0.95 (1 - tolerance 5%)" in plan.condition.message
    assert "0.97, 1.04] (96.9% interval, 6 rounds) above it" in plan.condition.message


def test_a_canary_with_a_lower_acceptance_length_is_rolled_back_with_both_intervals() -> None:
    bad = TrackFigures(acceptance_length=1.0, output_tokens_per_second=41.2, requests=300)
    incumbent_figures = TrackFigures(acceptance_length=1.52, output_tokens_per_second=40.8, requests=600)
    plan = decide(figures(canary=bad, incumbent_figures=incumbent_figures))
    assert plan.serve is None
    assert [a.key for a in plan.actions] == [("delete", "Deployment", CANARY_NAME)]
    assert plan.status.phase == CanaryPhase.ROLLED_BACK
    assert (plan.condition.status, plan.condition.reason) == ("False", "RolledBack")
    assert (
        f"canary draft {NEW}: mean acceptance length 1.00 vs incumbent 1.52, 41.2 vs 40.8 output "
        "tokens/s per request" in plan.condition.message
    )
    assert (
        "acceptance length 0.66x [0.66, 0.66] (98.4% interval, 7 rounds) below it" in plan.condition.message
    )
    assert (
        "output tokens/s per request 1.01x" in plan.condition.message and "above it" in plan.condition.message
    )
    assert plan.condition.message.endswith(": rolled back")
    assert plan.status.canary == bad and plan.status.incumbent is not None


def test_a_slower_canary_is_rolled_back_when_its_whole_interval_lies_below() -> None:
    plan = decide(speeds([0.80, 0.78, 0.83, 0.75, 0.81, 0.79]))
    assert plan.serve is None and plan.status.phase == CanaryPhase.ROLLED_BACK
    assert plan.condition.reason == "RolledBack"


@pytest.mark.parametrize(
    ("ratios", "phase"),
    [
        ([0.951, 1.0, 1.01, 0.99, 1.02, 1.0], CanaryPhase.PROMOTED),  # the lowest above 0.95
        ([0.95, 1.0, 1.01, 0.99, 1.02, 1.0], CanaryPhase.OBSERVING),  # touching it: cannot tell, extended
        ([0.949, 1.0, 1.01, 0.99, 1.02, 1.0], CanaryPhase.OBSERVING),
        ([0.949, 0.9, 0.91, 0.93, 0.92, 0.90], CanaryPhase.ROLLED_BACK),  # the highest below 0.95
    ],
)
def test_the_interval_is_compared_with_one_minus_the_tolerance(
    ratios: list[float], phase: CanaryPhase
) -> None:
    """6 rounds give the interval [lowest, highest] (96.9 %); the threshold is 1 - 0.05."""
    plan = decide(speeds(ratios))
    assert plan.status.phase == phase
    assert plan.status.extended is (phase == CanaryPhase.OBSERVING)


def test_intervals_that_hold_the_threshold_extend_once_then_keep_the_incumbent() -> None:
    straddling = [0.90, 1.00, 0.93, 0.98, 0.96, 1.01]
    first = decide(speeds(straddling))
    assert first.serve is None and first.actions == ()  # the canary Deployment stays for the extension
    assert first.status.phase == CanaryPhase.OBSERVING and first.status.extended
    assert first.status.extended_at == ts(700)
    assert (first.condition.status, first.condition.reason) == ("Unknown", "Extended")
    assert "is not distinguishable from incumbent" in first.condition.message
    assert "observing it for another serving.canary.duration 10m" in first.condition.message
    assert first.condition.last_transition_time == ts(0)  # the timeout still counts from the creation
    news = canary_news(observing(), Eagle3RunStatus(canary=first.status))
    assert [(w, r) for w, r, _ in news] == [(False, "CanaryExtended")]
    assert canary_news(after(first), after(first)) == []  # once
    waiting = decide(speeds(straddling * 2), now=1000, previous=after(first))
    assert waiting.status.phase == CanaryPhase.OBSERVING and waiting.status.extended_at == ts(700)
    assert "5m00s left of the extension (another serving.canary.duration 10m)" in waiting.condition.message
    kept = decide(speeds(straddling * 2), now=1300, previous=after(waiting))
    assert kept.serve is None and kept.status.phase == CanaryPhase.ROLLED_BACK
    assert [a.key for a in kept.actions] == [("delete", "Deployment", CANARY_NAME)]
    assert (kept.condition.status, kept.condition.reason) == ("False", NOT_DISTINGUISHABLE)
    acceptance, speed = kept.status.acceptance_ratio, kept.status.speed_ratio
    assert acceptance is not None and speed is not None and speed.rounds == 12
    assert acceptance.text() in kept.condition.message and speed.text() in kept.condition.message
    assert "holding it" in kept.condition.message
    assert "rolled back, the incumbent keeps serving" in kept.condition.message
    assert kept.status.extended and kept.status.seconds_to_decision == 1300


def test_one_slow_window_among_good_ones_does_not_roll_a_good_canary_back() -> None:
    """The tier's failure (5.7 against 8.7 output tokens/s per request in one window, the others even): one
    window alone decided it before; now its interval holds the threshold, the canary is extended, and the
    sub-windows of the extension promote it."""
    good = [1.0, 0.98, 1.02, 0.99, 1.01]
    first = decide(speeds([good[0], 5.7 / 8.7, *good[1:]]))
    assert first.status.phase == CanaryPhase.OBSERVING and first.status.extended
    promoted = decide(speeds([good[0], 5.7 / 8.7, *good[1:], *good, 1.0]), now=1300, previous=after(first))
    assert promoted.status.phase == CanaryPhase.PROMOTED and promoted.serve == Checkpoint(path=NEW)
    speed = promoted.status.speed_ratio
    assert speed is not None and speed.rounds == 12 and speed.low > 0.95 and not speed.noisy


@pytest.mark.parametrize(
    ("ratios", "phase", "reason"),
    [
        # every ratio above the threshold, but they disagree: extended, then promoted on the interval
        ([1.0, 2.5, 1.1, 3.0, 1.2, 2.8], CanaryPhase.PROMOTED, "Promoted"),
        # every ratio below it, as widely: extended, then rolled back on the interval
        ([0.1, 0.9, 0.2, 0.8, 0.15, 0.85], CanaryPhase.ROLLED_BACK, "RolledBack"),
        # around it, as widely: extended, then the incumbent is kept
        ([0.5, 1.6, 0.6, 1.5, 0.7, 1.4], CanaryPhase.ROLLED_BACK, NOT_DISTINGUISHABLE),
    ],
)
def test_noisy_windows_extend_once_then_decide_only_on_their_interval(
    ratios: list[float], phase: CanaryPhase, reason: str
) -> None:
    """Noisy sub-windows (their ratios' coefficient of variation beyond 25 %) never decide at once, whatever
    their interval says: the canary is observed once more, as the pipeline's noisy rounds are doubled once.
    Then all its sub-windows decide through their interval, which widens with the noise; the message flags
    the noise."""
    first = decide(speeds(ratios))
    assert first.status.phase == CanaryPhase.OBSERVING and first.status.extended and first.serve is None
    assert first.status.speed_ratio is not None and first.status.speed_ratio.noisy
    why = (
        "is not distinguishable from incumbent"  # its interval holds the threshold as well
        if reason == NOT_DISTINGUISHABLE
        else "is too noisy to decide on yet (its sub-windows' ratios vary beyond 25%)"
    )
    assert why in first.condition.message and "noisy: rounds vary" in first.condition.message
    last = decide(speeds(ratios * 2), now=1300, previous=after(first))
    assert last.status.phase == phase and last.condition.reason == reason, last.condition.message
    assert last.serve == (Checkpoint(path=NEW) if phase == CanaryPhase.PROMOTED else None)
    speed = last.status.speed_ratio
    assert speed is not None and speed.noisy and speed.rounds == 12
    assert f"output tokens/s per request {speed.text()}" in last.condition.message
    assert "noisy: rounds vary" in last.condition.message


def test_a_worse_comparison_whose_windows_agree_rolls_back_at_once_beside_a_noisy_one() -> None:
    """The Prometheus tier's bad canary: its acceptance length 0.65x the incumbent's in every sub-window,
    its speeds all over the place: rolled back on the acceptance at the first decision, no extension."""
    noisy = speeds([0.1, 2.0, 0.3, 1.5, 0.5, 3.0], length=1.0)
    plan = decide(noisy)
    assert plan.status.phase == CanaryPhase.ROLLED_BACK and not plan.status.extended
    assert plan.status.speed_ratio is not None and plan.status.speed_ratio.noisy
    assert plan.condition.reason == "RolledBack"


def test_a_sub_window_with_too_few_requests_on_a_track_has_no_speed_ratio() -> None:
    """A sub-window's speed is a ratio only where both tracks finished MIN_WINDOW_REQUESTS requests: below
    that it is missing, not one request's scheduling taken for the draft's speed."""
    assert MIN_WINDOW_REQUESTS == 4
    incumbent = steady(GOOD)
    few = TrackWindows((1.5,) * 7, (40.0, 400.0, 40.0, 4.0, 40.0, 40.0, 40.0), (70, 3, 70, 1, 70, 70, 70))
    plan = decide(figures(canary_windows=few, incumbent_windows=incumbent))
    speed = plan.status.speed_ratio
    assert speed is not None and speed.rounds == 5 and (speed.low, speed.high) == (1.0, 1.0)
    assert plan.status.acceptance_ratio is not None and plan.status.acceptance_ratio.rounds == 7
    assert plan.status.phase == CanaryPhase.OBSERVING  # 5 of the 6 sub-windows the speed needs
    assert "output tokens/s 5/6: at least 4 finished requests on each track" in plan.condition.message
    sparse_incumbent = replace(incumbent, requests=(70, 70, 70, 70, 70, 70, 3))
    fewer = decide(figures(canary_windows=few, incumbent_windows=sparse_incumbent))
    assert fewer.status.speed_ratio is not None and fewer.status.speed_ratio.rounds == 4


def test_windows_without_a_figure_are_left_out_and_fewer_than_six_wait() -> None:
    plan = decide(speeds([1.0, None, 1.01, None, 0.99, 1.02, 1.0]))
    assert plan.status.phase == CanaryPhase.OBSERVING and not plan.status.extended
    assert plan.status.speed_ratio is not None and plan.status.speed_ratio.rounds == 5
    assert (
        "6 sub-windows of 100s where both tracks have figures (acceptance length 7/6, output tokens/s 5/6: "
        "at least 4 finished requests on each track)" in plan.condition.message
    )
    assert "so far the canary over the incumbent" in plan.condition.message
    done = decide(speeds([1.0, None, 1.01, None, 0.99, 1.02, 1.0, 0.98]), now=800)
    assert done.status.phase == CanaryPhase.PROMOTED


def test_the_timeout_bounds_the_extension() -> None:
    first = decide(speeds([0.90, 1.00, 0.93, 0.98, 0.96, 1.01]))
    late = decide(speeds([0.90, 1.00, 0.93, 0.98, 0.96, 1.01]), now=1200, previous=after(first), canary=SHORT)
    assert late.status.phase == CanaryPhase.ROLLED_BACK and late.condition.reason == NOT_DISTINGUISHABLE
    assert "no decision within serving.canary.timeout 20m" in late.condition.message


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

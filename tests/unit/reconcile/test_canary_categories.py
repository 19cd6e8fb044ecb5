"""serving.canary's refusal by category (canary_categories): a new draft that wins on the mean but regresses
one category beyond the tolerance is rolled back (CategoryRegressed) before any live traffic; a category of
too few prompts, or an incumbent without per-category figures (a pinned draft), refuses nothing."""

from __future__ import annotations

import pytest

from eagle3_contract.api.categories import CategoryFigures
from eagle3_contract.api.status import CanaryPhase, Checkpoint, Eagle3RunStatus, TrackFigures
from eagle3_operator.reconcile.canary import (
    CATEGORY_REGRESSED,
    PROMOTED,
    CanaryPlan,
    canary_news,
    plan_canary,
)
from eagle3_operator.reconcile.canary_categories import MIN_CATEGORY_PROMPTS, check_categories
from eagle3_operator.reconcile.observe import Observed
from tests.unit.reconcile.planner_world import RUN, ts
from tests.unit.reconcile.test_canary import (
    CANARY_NAME,
    GOOD,
    NEW,
    OLD,
    after,
    canary_view,
    figures,
    incumbent,
    observing,
    spec,
)


def rows(**lengths: tuple[float, int]) -> list[CategoryFigures]:
    """Category -> (acceptance length, prompts)."""
    return [
        CategoryFigures(category=name, prompts=prompts, acceptance_length=length)
        for name, (length, prompts) in lengths.items()
    ]


OLD_ROWS = rows(add=(1.6, 6), count=(1.5, 6), reverse=(1.4, 3))
# better on the mean (2.0 against 1.5), but `add` at 1.2 / 1.6 = 0.75x, below 0.95 (tolerance 0.05)
LOSES_ADD = rows(add=(1.2, 6), count=(2.4, 6), reverse=(2.4, 3))
# `reverse` at 1.0 / 1.4 = 0.71x, but with 3 prompts on the incumbent's side: left out
LOSES_REVERSE = rows(add=(1.7, 6), count=(1.6, 6), reverse=(1.0, 5))


def start(new_rows: list[CategoryFigures] | None, old: Checkpoint | None) -> object:
    """The reconcile that starts a canary of NEW (mean 2.0) while OLD serves; `old`: the incumbent's record
    (status.checkpoint until this reconcile)."""
    rollout = Checkpoint(path=NEW, acceptance_length=2.0, categories=new_rows)
    previous = Eagle3RunStatus(checkpoint=old)
    return plan_canary(RUN, spec(), Observed(deployment=incumbent()), rollout, previous, ts(0))


def test_one_regressed_category_with_enough_prompts_is_found() -> None:
    found = check_categories(LOSES_ADD, OLD_ROWS, 0.05)
    assert found.regressed == ("add 1.20 vs 1.60 (0.75x, 6 and 6 prompts)",)
    assert "2 compared (add, count)" in found.note and "fewer than 4 prompts on a side: reverse" in found.note


def test_a_category_of_too_few_prompts_is_left_out() -> None:
    assert MIN_CATEGORY_PROMPTS == 4
    found = check_categories(LOSES_REVERSE, OLD_ROWS, 0.05)
    assert found.regressed == () and "none below 0.95x" in found.note and "reverse" in found.note


def test_within_the_tolerance_is_no_regression() -> None:
    slightly = rows(add=(1.55, 6), count=(1.5, 6))  # 0.97x: within 5 %
    assert check_categories(slightly, OLD_ROWS, 0.05).regressed == ()
    assert check_categories(rows(add=(1.2, 6)), OLD_ROWS, 0.3).regressed == ()  # 0.75x: within 30 %


def test_unknown_figures_compare_nothing_and_say_so() -> None:
    for new, old in ((LOSES_ADD, None), (None, OLD_ROWS), (LOSES_ADD, [])):
        found = check_categories(new, old, 0.05)
        assert found.regressed == () and "not compared" in found.note


def test_a_draft_better_on_the_mean_but_worse_in_one_category_is_refused_at_once() -> None:
    plan = start(LOSES_ADD, Checkpoint(path=OLD, acceptance_length=1.5, categories=OLD_ROWS))
    assert plan.serve is None and plan.actions == ()  # no canary Deployment: the incumbent keeps serving
    assert plan.status is not None and plan.status.phase == CanaryPhase.ROLLED_BACK
    assert plan.status.decided == ts(0) and plan.status.incumbent_categories == OLD_ROWS
    assert plan.condition is not None
    assert (plan.condition.status, plan.condition.reason) == ("False", CATEGORY_REGRESSED)
    message = plan.condition.message
    assert "add 1.20 vs 1.60 (0.75x" in message and "mean acceptance length 2.00 vs incumbent 1.50" in message
    assert canary_news(Eagle3RunStatus(), after(plan)) == [(True, "CanaryRolledBack", message)]
    # the decision is kept: the refused draft is not tried again while it is the rollout
    again = plan_canary(
        RUN, spec(), Observed(deployment=incumbent()), Checkpoint(path=NEW), after(plan), ts(30)
    )
    assert again.serve is None and again.actions == () and again.status == plan.status


def test_a_draft_that_wins_on_the_live_mean_too_but_loses_one_category_is_refused() -> None:
    """The issue's case, against a control: the same observed canary, its live mean acceptance length 1.2x
    the incumbent's and its speed 1.1x in every sub-window past the duration, is promoted when no category
    regressed, and refused (CategoryRegressed, the incumbent kept) when `add` regressed."""
    better = TrackFigures(acceptance_length=1.8, output_tokens_per_second=44.0, requests=500)
    live = figures(canary=better, incumbent_figures=GOOD)

    def decide_with(new_rows: list[CategoryFigures]) -> CanaryPlan:
        rollout = Checkpoint(path=NEW, acceptance_length=2.0, categories=new_rows)
        previous = observing().model_copy(update={"checkpoint": rollout})
        kept = previous.canary.model_copy(update={"incumbent_categories": OLD_ROWS})  # type: ignore[union-attr]
        observed = Observed(deployment=incumbent(), canary=canary_view(), canary_figures=live)
        return plan_canary(
            RUN, spec(), observed, rollout, previous.model_copy(update={"canary": kept}), ts(700)
        )

    control = decide_with(LOSES_REVERSE)  # `reverse` is left out (3 prompts): nothing regressed
    assert control.status is not None and control.status.phase == CanaryPhase.PROMOTED
    assert control.serve is not None and control.serve.path == NEW
    acceptance = control.status.acceptance_ratio
    assert acceptance is not None and acceptance.low == pytest.approx(1.2) and acceptance.rounds == 7

    refused = decide_with(LOSES_ADD)
    assert refused.status is not None and refused.status.phase == CanaryPhase.ROLLED_BACK
    assert refused.serve is None, "the incumbent keeps serving"
    assert [a.key for a in refused.actions] == [("delete", "Deployment", CANARY_NAME)]
    assert refused.condition is not None
    assert (refused.condition.status, refused.condition.reason) == ("False", CATEGORY_REGRESSED)
    assert "regresses a category" in refused.condition.message
    assert "add 1.20 vs 1.60 (0.75x, 6 and 6 prompts)" in refused.condition.message


def test_a_refusal_deletes_a_canary_already_running() -> None:
    rollout = Checkpoint(path=NEW, categories=LOSES_ADD)
    previous = observing().model_copy(update={"checkpoint": rollout})
    kept = previous.canary.model_copy(update={"incumbent_categories": OLD_ROWS})  # type: ignore[union-attr]
    previous = previous.model_copy(update={"canary": kept})
    observed = Observed(deployment=incumbent(), canary=canary_view(), canary_figures=figures())
    plan = plan_canary(RUN, spec(), observed, rollout, previous, ts(60))
    assert [a.key for a in plan.actions] == [("delete", "Deployment", CANARY_NAME)]
    assert plan.condition is not None and plan.condition.reason == CATEGORY_REGRESSED


def test_a_regression_in_a_category_of_too_few_prompts_starts_the_canary() -> None:
    plan = start(LOSES_REVERSE, Checkpoint(path=OLD, categories=OLD_ROWS))
    assert [a.key for a in plan.actions] == [("create", "Deployment", CANARY_NAME)]
    assert plan.status is not None and plan.status.phase == CanaryPhase.OBSERVING
    assert plan.status.categories is not None and "reverse" in plan.status.categories


def test_a_pinned_incumbent_has_no_categories_and_the_canary_decides_live() -> None:
    plan = start(LOSES_ADD, Checkpoint(path=OLD))  # a pin: no evaluated figures
    assert plan.status is not None and plan.status.phase == CanaryPhase.OBSERVING
    assert (
        plan.status.categories is not None and "the incumbent's evaluated figures" in plan.status.categories
    )
    other = start(LOSES_ADD, Checkpoint(path="/artifacts/export/another", categories=OLD_ROWS))
    assert other.status is not None and other.status.incumbent_categories is None  # not the serving draft


def test_the_incumbents_figures_are_kept_through_the_canary_and_named_at_the_promotion() -> None:
    first = start(LOSES_REVERSE, Checkpoint(path=OLD, categories=OLD_ROWS))
    assert first.status is not None and first.condition is not None
    # from now on status.checkpoint is the new draft's record: the incumbent's rows live in status.canary
    started = first.status.model_copy(update={"started": ts(0)})
    previous = Eagle3RunStatus(
        conditions=[first.condition],
        canary=started,
        checkpoint=Checkpoint(path=NEW, categories=LOSES_REVERSE),
    )
    observed = Observed(deployment=incumbent(), canary=canary_view(), canary_figures=figures())
    rollout = Checkpoint(path=NEW, categories=LOSES_REVERSE)
    plan = plan_canary(RUN, spec(), observed, rollout, previous, ts(700))
    assert plan.status is not None and plan.status.incumbent_categories == OLD_ROWS
    assert plan.condition is not None and plan.condition.reason == PROMOTED
    assert "evaluated acceptance length per category, 2 compared" in plan.condition.message

"""serving.canary's sub-windows and verdict (canary_verdict): their length, how many have ended, the pairing
of the tracks and the verdict against 1 - tolerance."""

from __future__ import annotations

import pytest

from eagle3_contract.api.comparison import Verdict, compare_ratios
from eagle3_contract.api.spec import Canary
from eagle3_contract.api.status import CanaryPhase, CanaryStatus
from eagle3_operator.reconcile.canary_verdict import (
    MIN_WINDOW_REQUESTS,
    complete_windows,
    ratios,
    ratios_text,
    rounds_wait,
    settled,
    unsettled_text,
    verdict,
    window_seconds,
)
from eagle3_operator.reconcile.observe import CanaryFigures, TrackWindows
from tests.unit.reconcile.planner_world import ts


@pytest.mark.parametrize(
    ("duration", "windows", "seconds"),
    [("10m", 6, 100.0), ("20s", 6, 3.333), ("5s", 6, 1.0), ("1h", 60, 60.0)],
)
def test_a_sub_window_is_the_duration_over_windows_in_whole_ms_and_a_second_at_the_least(
    duration: str, windows: int, seconds: float
) -> None:
    assert window_seconds(Canary(duration=duration, windows=windows)) == seconds


def test_only_the_sub_windows_that_have_ended_count() -> None:
    canary = Canary(duration="20s")  # 3.333 s each
    assert [complete_windows(canary, ts(0), ts(t)) for t in (0, 3, 4, 20, 40)] == [0, 0, 1, 6, 12]


def test_the_tracks_are_paired_window_by_window_and_a_window_without_a_figure_is_left_out() -> None:
    incumbent = TrackWindows((1.5, 1.5, None, 1.5), (40.0, 40.0, 40.0, None), (9, 9, 9, 0))
    # one more sub-window: not paired
    canary = TrackWindows((1.2, None, 1.2, 1.5, 1.5), (44.0, 40.0, 20.0, 40.0, 40.0), (9, 9, 9, 9, 9))
    found = ratios(CanaryFigures(incumbent_windows=incumbent, canary_windows=canary))
    assert found.acceptance is not None and found.acceptance.rounds == 2  # windows 0 and 3
    assert found.acceptance.ratio == pytest.approx(0.9)
    assert found.speed is not None and found.speed.rounds == 3 and found.speed.ratio == 1.0
    assert ratios(CanaryFigures()).acceptance is None


def test_a_speed_needs_a_few_requests_on_both_tracks_and_known_counts() -> None:
    assert MIN_WINDOW_REQUESTS == 4
    incumbent = TrackWindows((1.5,) * 4, (40.0,) * 4, (4, 3, 9, None))
    canary = TrackWindows((1.5,) * 4, (48.0, 4.0, 40.0, 40.0), (4, 9, 3, 9))
    found = ratios(CanaryFigures(incumbent_windows=incumbent, canary_windows=canary))
    assert found.speed is not None and found.speed.rounds == 1 and found.speed.ratio == 1.2  # window 0 only
    assert found.acceptance is not None and found.acceptance.rounds == 4  # the acceptance needs drafts only
    unknown = TrackWindows((1.5,) * 4, (40.0,) * 4)  # no request counts: no speed taken on trust
    assert ratios(CanaryFigures(incumbent_windows=unknown, canary_windows=canary)).speed is None


def status(acceptance: list[float], speed: list[float]) -> CanaryStatus:
    return CanaryStatus(
        phase=CanaryPhase.OBSERVING,
        deployment="tiny-canary",
        draft="new",
        window_seconds=100.0,
        acceptance_ratio=compare_ratios(acceptance),
        speed_ratio=compare_ratios(speed),
    )


GOOD, HOLDING, BELOW = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0], [0.9, 1.0, 0.97, 1.02, 0.99, 1.0], [0.8] * 6


@pytest.mark.parametrize(
    ("acceptance", "speed", "expected"),
    [
        (GOOD, GOOD, Verdict.BETTER),
        (GOOD, HOLDING, Verdict.NOT_DISTINGUISHABLE),
        (HOLDING, BELOW, Verdict.WORSE),  # either below rolls back
        (BELOW, GOOD, Verdict.WORSE),
    ],
)
def test_both_above_promote_either_below_rolls_back(
    acceptance: list[float], speed: list[float], expected: Verdict
) -> None:
    assert verdict(0.05, status(acceptance, speed)) == expected


NOISY_ABOVE = [1.0, 2.5, 1.1, 3.0, 1.2, 2.8]  # every ratio above 0.95, coefficient of variation 0.42
NOISY_BELOW = [0.1, 0.9, 0.2, 0.8, 0.15, 0.85]


@pytest.mark.parametrize(
    ("acceptance", "speed", "expected"),
    [
        (GOOD, GOOD, True),  # both above, their sub-windows agree: promoted at once
        (BELOW, NOISY_ABOVE, True),  # below on sub-windows that agree: rolled back at once
        (GOOD, HOLDING, False),  # not distinguishable: extended
        (GOOD, NOISY_ABOVE, False),  # above only on noisy sub-windows: extended
        (GOOD, NOISY_BELOW, False),  # below only on noisy sub-windows: extended
    ],
)
def test_the_first_decision_needs_a_verdict_on_sub_windows_that_agree(
    acceptance: list[float], speed: list[float], expected: bool
) -> None:
    assert settled(0.05, status(acceptance, speed)) is expected


def test_the_text_flags_a_noisy_comparison() -> None:
    text = ratios_text(0.05, status(GOOD, NOISY_ABOVE))
    assert (
        "output tokens/s per request 1.85x [1.00, 3.00] (96.9% interval, 6 rounds, noisy: rounds vary" in text
    )
    assert text.endswith("above it")
    assert unsettled_text(0.05, status(GOOD, NOISY_ABOVE)).startswith("is too noisy to decide on yet")
    assert unsettled_text(0.05, status(GOOD, HOLDING)) == "is not distinguishable from incumbent"


def test_the_text_names_each_interval_and_where_it_lies() -> None:
    text = ratios_text(0.05, status(GOOD, HOLDING))
    assert text.startswith("the canary over the incumbent, sub-window by sub-window, against 0.95")
    assert "acceptance length 1.00x [0.98, 1.02] (96.9% interval, 6 rounds) above it" in text
    assert "output tokens/s per request 0.99x [0.90, 1.02] (96.9% interval, 6 rounds) holding it" in text


def test_fewer_than_six_paired_windows_wait() -> None:
    few = status(GOOD[:5], GOOD).model_copy(update={"acceptance_ratio": compare_ratios(GOOD[:5])})
    assert rounds_wait(few) == (
        "6 sub-windows of 100s where both tracks have figures (acceptance length 5/6, output tokens/s 6/6: "
        "at least 4 finished requests on each track)"
    )
    assert rounds_wait(status(GOOD, GOOD)) is None

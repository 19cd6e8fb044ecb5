"""The paired comparison's statistics: the order-statistic interval of the median and the verdicts."""

from __future__ import annotations

import random

import pytest

from eagle3_contract.api.comparison import (
    MIN_ROUNDS,
    Verdict,
    compare_ratios,
    compare_rounds,
    coverage,
    median_interval,
)


def test_the_interval_of_six_rounds_is_lowest_to_highest_at_96_9_percent() -> None:
    low, high, covered = median_interval([1.3, 1.1, 1.6, 1.2, 1.5, 1.4])
    assert (low, high) == (1.1, 1.6)
    assert covered == pytest.approx(1 - 2 / 64)


def test_fewer_than_min_rounds_cannot_reach_95_percent() -> None:
    assert coverage(MIN_ROUNDS - 1, 1) < 0.95 <= coverage(MIN_ROUNDS, 1)


def test_more_rounds_narrow_the_interval_inward_keeping_95_percent() -> None:
    values = [float(v) for v in range(1, 21)]  # 20 rounds
    low, high, covered = median_interval(values)
    assert covered >= 0.95
    assert 1.0 < low <= statistics_median(values) <= high < 20.0


def statistics_median(values: list[float]) -> float:
    ordered = sorted(values)
    return (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2


def test_the_interval_covers_the_true_median_at_least_95_percent_of_the_time() -> None:
    rng = random.Random(7)
    trials, covered = 4000, 0
    for _ in range(trials):
        low, high, _ = median_interval([rng.lognormvariate(0.0, 0.3) for _ in range(MIN_ROUNDS)])
        covered += low <= 1.0 <= high  # the log-normal's median is 1
    assert covered / trials >= 0.95


def test_an_interval_above_the_threshold_is_better_one_below_worse_one_across_it_a_tie() -> None:
    assert compare_ratios([1.5, 1.6, 1.55, 1.62, 1.58, 1.57]).verdict() is Verdict.BETTER
    assert compare_ratios([0.7, 0.72, 0.69, 0.75, 0.71, 0.73]).verdict() is Verdict.WORSE
    assert compare_ratios([0.95, 1.05, 0.99, 1.02, 0.98, 1.01]).verdict() is Verdict.NOT_DISTINGUISHABLE


def test_the_canary_threshold_is_read_the_same_way() -> None:
    comparison = compare_ratios([0.85, 0.9, 0.88, 0.92, 0.87, 0.89])
    assert comparison.verdict(0.7) is Verdict.BETTER  # within a 30 % tolerance
    assert comparison.verdict(1.0) is Verdict.WORSE


def test_rounds_that_disagree_are_flagged_noisy_and_decide_only_through_their_wide_interval() -> None:
    faster = compare_ratios([1.2, 3.0, 1.1, 2.8, 1.3, 3.1])
    assert faster.noisy and "noisy" in faster.text()  # flagged wherever it is shown
    assert faster.verdict() is Verdict.BETTER  # even its slowest round was faster
    straddles = compare_ratios([0.6, 3.0, 1.1, 2.8, 1.3, 3.1])
    assert straddles.noisy and straddles.verdict() is Verdict.NOT_DISTINGUISHABLE


def test_paired_rounds_leave_out_rounds_an_arm_did_not_measure() -> None:
    comparison = compare_rounds(
        [100.0, None, 100.0, 0.0, 100.0, 100.0], [150.0, 150.0, 160.0, 1.0, 140.0, 150.0]
    )
    assert comparison is not None and comparison.rounds == 4
    assert compare_rounds([None], [1.0]) is None
    with pytest.raises(ValueError, match="differ in number"):
        compare_rounds([1.0], [1.0, 2.0])


def test_the_text_names_the_ratio_the_interval_and_the_rounds() -> None:
    text = compare_ratios([1.5, 1.6, 1.55, 1.62, 1.58, 1.57]).text()
    assert text.startswith("1.57x [1.50, 1.62] (96.9% interval, 6 rounds")

"""The speculation-length table (eagle3_contract.api.speculation): the best k at a concurrency, the schedule
of batch-size ranges it justifies, and vLLM's num_speculative_tokens_per_batch_size argument."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_contract.api.speculation import (
    SCHEDULE_KEY,
    SpeculationRange,
    SweepCell,
    best_k,
    plan_schedule,
    schedule_argument,
    tuned_speculative_config,
)


def cell(k: int, concurrency: int, speedup: float, baseline: float = 100.0) -> SweepCell:
    """A measured cell `speedup` times as fast as a `baseline` tokens/s verifier."""
    return SweepCell(
        num_speculative_tokens=k,
        concurrency=concurrency,
        acceptance_length=1.5,
        output_tokens_per_second=baseline * speedup,
        speedup=speedup,
    )


def ranges(cells: list[SweepCell]) -> list[tuple[int, int, int]]:
    return [(r.min_batch_size, r.max_batch_size, r.num_speculative_tokens) for r in plan_schedule(cells)]


# --- best_k -------------------------------------------------------------------------------------------------


def test_the_best_k_is_the_fastest_one_that_beats_the_baseline() -> None:
    cells = [cell(1, 1, 1.3), cell(2, 1, 1.6), cell(3, 1, 1.5), cell(3, 8, 2.0)]
    best = best_k(cells, 1)
    assert best is not None and best.num_speculative_tokens == 2  # the other concurrency's 2.0 is not 1's


def test_no_k_beats_the_baseline_none() -> None:
    assert best_k([cell(1, 8, 0.9), cell(2, 8, 1.0)], 8) is None  # as fast is not faster
    assert best_k([cell(1, 8, 1.2)], 1) is None  # not measured there
    unmeasured = SweepCell(num_speculative_tokens=1, concurrency=1, speedup=1.5)  # no tokens/s
    assert best_k([unmeasured], 1) is None


def test_a_tie_takes_the_smaller_k() -> None:
    best = best_k([cell(3, 4, 1.4), cell(2, 4, 1.4), cell(5, 4, 1.4)], 4)
    assert best is not None and best.num_speculative_tokens == 2


# --- plan_schedule ------------------------------------------------------------------------------------------


def test_a_range_reaches_the_geometric_mean_of_two_concurrencies() -> None:
    cells = [cell(3, 1, 2.0), cell(2, 8, 1.5), cell(1, 32, 1.1)]
    assert ranges(cells) == [(1, 2, 3), (3, 16, 2), (17, 32, 1)]
    first = plan_schedule(cells)[0]
    assert first.concurrency == 1 and first.speedup == 2.0


def test_adjacent_ranges_of_the_same_k_are_merged() -> None:
    cells = [cell(3, 1, 2.0), cell(3, 4, 1.8), cell(3, 16, 1.2), cell(1, 64, 1.05)]
    assert ranges(cells) == [(1, 32, 3), (33, 64, 1)]
    merged = plan_schedule(cells)[0]
    assert (
        merged.concurrency == 1 and merged.speedup == 2.0
    )  # the range keeps its first concurrency's figures


def test_where_no_k_beats_the_baseline_speculation_is_off() -> None:
    cells = [cell(2, 1, 1.6), cell(2, 8, 0.95), cell(1, 8, 0.9), cell(2, 32, 0.8), cell(2, 64, 1.01)]
    assert ranges(cells) == [(1, 2, 2), (3, 45, 0), (46, 64, 2)]
    off = plan_schedule(cells)[1]
    # the range shows the closest k, and why it is off: every k is slower there
    assert (off.concurrency, off.measured_k, off.speedup, off.verdict) == (8, 2, 0.95, "worse")


def test_nothing_pays_off_anywhere_one_range_of_k_0() -> None:
    assert ranges([cell(1, 1, 0.9), cell(1, 8, 0.7)]) == [(1, 8, 0)]


def test_a_single_concurrency_covers_1_to_it() -> None:
    assert ranges([cell(1, 4, 1.2), cell(4, 4, 1.7)]) == [(1, 4, 4)]
    assert ranges([cell(1, 1, 1.2)]) == [(1, 1, 1)]


def test_consecutive_concurrencies_get_one_batch_size_each() -> None:
    assert ranges([cell(3, 1, 1.5), cell(1, 2, 1.5), cell(2, 3, 1.5)]) == [(1, 1, 3), (2, 2, 1), (3, 3, 2)]


def test_no_cells_no_schedule() -> None:
    assert plan_schedule([]) == []


# --- vLLM's argument ----------------------------------------------------------------------------------------

BASE = {"method": "eagle3", "model": "/artifacts/export/abc", "num_speculative_tokens": 3}


def test_the_tuned_config_carries_the_schedule_and_its_largest_k() -> None:
    schedule = plan_schedule([cell(5, 1, 2.0), cell(2, 8, 1.5), cell(1, 32, 0.9)])
    config = tuned_speculative_config(BASE, schedule)
    assert config[SCHEDULE_KEY] == [[1, 2, 5], [3, 16, 2], [17, 32, 0]]
    assert config["num_speculative_tokens"] == 5  # vLLM caps each range's k at it
    assert config["method"] == "eagle3" and config["model"] == BASE["model"]
    assert BASE["num_speculative_tokens"] == 3  # the base is not changed


def test_a_schedule_of_k_0_only_still_asks_vllm_for_one_token() -> None:
    config = tuned_speculative_config(BASE, plan_schedule([cell(2, 1, 0.9)]))
    assert config[SCHEDULE_KEY] == [[1, 1, 0]] and config["num_speculative_tokens"] == 1


def test_without_a_schedule_the_config_is_the_fixed_one() -> None:
    assert tuned_speculative_config(BASE, []) == BASE


# --- properties ---------------------------------------------------------------------------------------------

CONCURRENCIES = st.lists(st.integers(1, 4096), min_size=1, max_size=8, unique=True)
KS = st.lists(st.integers(1, 16), min_size=1, max_size=7, unique=True)
SPEEDUPS = st.floats(0.2, 3.0, allow_nan=False).map(lambda s: round(s, 1))  # rounded: ties happen


@st.composite
def sweeps(draw: st.DrawFn) -> list[SweepCell]:
    concurrencies, ks = draw(CONCURRENCIES), draw(KS)
    return [cell(k, c, draw(SPEEDUPS)) for c in concurrencies for k in ks]


@settings(max_examples=300, deadline=None)
@given(sweeps())
def test_the_schedule_is_what_vllm_accepts_and_what_the_cells_justify(cells: list[SweepCell]) -> None:
    schedule = plan_schedule(cells)
    concurrencies = sorted({c.concurrency for c in cells})
    # vLLM's rules (vllm.v1.spec_decode.dynamic.utils): sorted, non-overlapping, the first starting at 1
    assert schedule[0].min_batch_size == 1
    assert schedule[-1].max_batch_size == concurrencies[-1]
    for before, after in itertools.pairwise(schedule):
        assert after.min_batch_size == before.max_batch_size + 1  # contiguous: no gap, no overlap
        assert after.num_speculative_tokens != before.num_speculative_tokens  # merged otherwise
    assert all(r.min_batch_size <= r.max_batch_size for r in schedule)
    # every measured concurrency lies in a range of its best k (0 where none beats the baseline)
    for concurrency in concurrencies:
        best = best_k(cells, concurrency)
        (covering,) = [r for r in schedule if r.min_batch_size <= concurrency <= r.max_batch_size]
        assert covering.num_speculative_tokens == (best.num_speculative_tokens if best else 0)
    assert schedule_argument(schedule) == [
        [r.min_batch_size, r.max_batch_size, r.num_speculative_tokens] for r in schedule
    ]


@settings(max_examples=300, deadline=None)
@given(sweeps(), st.integers(1, 4096))
def test_the_best_k_is_never_beaten(cells: list[SweepCell], concurrency: int) -> None:
    concurrency = cells[concurrency % len(cells)].concurrency
    here = [c for c in cells if c.concurrency == concurrency]
    best = best_k(cells, concurrency)
    if best is None:
        assert all((c.speedup or 0) <= 1.0 for c in here)
        return
    assert best.concurrency == concurrency and best.speedup is not None and best.speedup > 1.0
    for other in here:
        assert (other.output_tokens_per_second or 0) <= (best.output_tokens_per_second or 0)
        if other.output_tokens_per_second == best.output_tokens_per_second:
            assert other.num_speculative_tokens >= best.num_speculative_tokens


def test_a_range_model_refuses_batch_size_0() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        SpeculationRange(min_batch_size=0, max_batch_size=4, num_speculative_tokens=1)

"""serving.canary's sub-windows from counters at their edges (canary_figures.track_windows): each sub-window
is the difference of its two edges, so every increase counts once; an unknown edge or a counter that went
down leaves the sub-window without figures."""

from __future__ import annotations

from eagle3_operator.observability.canary_queries import TPOT_COUNT, TPOT_SUM
from eagle3_operator.observability.queries import ACCEPTED, DRAFTS
from eagle3_operator.reconcile.canary_figures import track_windows


def edges(
    drafts: list[float | None],
    accepted: list[float | None],
    finished: list[float | None],
    seconds: list[float | None],
) -> dict[str, tuple[float | None, ...]]:
    return {
        DRAFTS: tuple(drafts),
        ACCEPTED: tuple(accepted),
        TPOT_COUNT: tuple(finished),
        TPOT_SUM: tuple(seconds),
    }


def test_a_sub_window_is_the_difference_of_its_edges() -> None:
    # three sub-windows: 100 drafts with 50 accepted and 4 requests at 0.02 s a token; then 60 drafts, 60
    # accepted and 5 requests at 0.01 s; then nothing at all
    found = track_windows(
        edges([10, 110, 170, 170], [5, 55, 115, 115], [2, 6, 11, 11], [1, 1.08, 1.13, 1.13]), 3
    )
    assert found.acceptance_length == (1.5, 2.0, None)
    assert found.output_tokens_per_second == (50.0, 100.0, None)
    assert found.requests == (4, 5, 0)


def test_the_sub_windows_tile_the_observation_whatever_the_scrapes() -> None:
    """Every finished request counts in exactly one sub-window: the sub-windows' requests add up to the
    counter's increase over them all (increase() over each would drop what came between two scrapes)."""
    finished = [3.0, 3.0, 7.0, 9.0, 9.0, 16.0]
    found = track_windows(edges([0.0] * 6, [0.0] * 6, finished, [0.0, 0.0, 0.4, 0.5, 0.5, 0.9]), 5)
    assert sum(n or 0 for n in found.requests) == finished[-1] - finished[0]
    assert found.requests == (0, 4, 2, 0, 7)


def test_an_unknown_edge_or_a_reset_leaves_the_sub_window_out() -> None:
    # edge 1 unknown (no sample yet): sub-windows 0 and 1 unknown; the counters drop at edge 3 (a pod
    # restarted): sub-window 2 unknown, sub-window 3 counts again from the new values
    found = track_windows(
        edges([0, None, 100, 10, 60], [0, None, 50, 0, 30], [0, None, 4, 0, 4], [0, None, 0.2, 0, 0.1]), 4
    )
    assert found.acceptance_length == (None, None, None, 1.6)
    assert found.output_tokens_per_second == (None, None, None, 40.0)
    assert found.requests == (None, None, None, 4)


def test_missing_counters_and_short_edges_are_unknown() -> None:
    found = track_windows({DRAFTS: (0.0, 10.0)}, 2)  # the others never scraped, the second edge not yet
    assert found.acceptance_length == (None, None)
    assert found.requests == (None, None) and found.output_tokens_per_second == (None, None)

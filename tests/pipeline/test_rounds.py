"""Interleaved rounds (eagle3_pipeline.stages.evaluate.rounds) without vLLM: the arms' order rotates from
round to round, undecided rounds are doubled once, and an arm's figures come from its rounds."""

from __future__ import annotations

from typing import Any, cast

import pytest

from eagle3_pipeline.serving.spec_metrics import SpecDecodeCounters
from eagle3_pipeline.serving.vllm_server import VllmServer
from eagle3_pipeline.stages.evaluate import rounds
from eagle3_pipeline.stages.evaluate.rounds import Arm, interleave, interleave_settled

SERVER = cast(VllmServer, None)


@pytest.fixture
def order(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every round measured, as (arm, concurrency), in order; each round's speed is 100 + its index."""
    seen: list[tuple[str, int]] = []

    def fake(arm: Arm, prompts: Any, concurrency: int, max_tokens: int, progress: Any) -> None:
        seen.append((arm.name, concurrency))
        arm.speeds.setdefault(concurrency, []).append(100.0 + len(seen))

    monkeypatch.setattr(rounds, "one_round", fake)
    return seen


def test_two_arms_alternate_and_three_rotate(order: list[tuple[str, int]]) -> None:
    a, b = Arm("a", SERVER, False), Arm("b", SERVER, True)
    interleave([a, b], {1: [], 4: []}, 3, 8, warmed=True)
    # an arm's concurrencies back to back, the arms' order rotating: AB, BA, AB
    assert order == [("a", 1), ("a", 4), ("b", 1), ("b", 4), ("b", 1), ("b", 4), ("a", 1), ("a", 4),
                     ("a", 1), ("a", 4), ("b", 1), ("b", 4)]  # fmt: skip
    order.clear()
    arms = [Arm(n, SERVER, False) for n in "xyz"]
    interleave(arms, {1: []}, 3, 8, warmed=True)
    assert [name for name, _ in order] == list("xyzyzxzxy")  # each arm first once


def test_the_rounds_pause_only_where_they_move_to_another_server(
    order: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's worker spins for a second after its last step: a pause before a round on another server than
    the previous round's, none between rounds on the same one (two arms, three rounds: A B | B A | A B), and
    none after a server whose worker is no process of its own (V1 multiprocessing off)."""
    paused: list[int] = []
    monkeypatch.setattr(
        rounds.time, "sleep", lambda s: paused.append(len(order)) if s == rounds.SETTLE_S else None
    )

    class Server:
        def __init__(self, spins: bool) -> None:
            self.worker_spins = spins

    one, two = cast(VllmServer, Server(True)), cast(VllmServer, Server(True))
    interleave([Arm("a", one, False), Arm("b", two, False)], {1: [], 4: []}, 3, 8, warmed=True)
    assert paused == [2, 6, 10] and rounds.SETTLE_S > 1.0  # before b, a, b: the rounds' three moves
    paused.clear()
    order.clear()
    interleave([Arm("alone", one, False)], {1: [], 4: []}, 6, 8, warmed=True)  # servers in turn: one arm
    assert paused == [] and len(order) == 12
    quiet = [Arm(n, cast(VllmServer, Server(False)), False) for n in "ab"]  # V1 multiprocessing off
    interleave(quiet, {1: [], 4: []}, 3, 8, warmed=True)
    assert paused == []  # nothing spins after its last step: no pause


def test_undecided_rounds_are_doubled_once(order: list[tuple[str, int]]) -> None:
    a, b = Arm("a", SERVER, False), Arm("b", SERVER, True)
    assert not interleave_settled([a, b], {1: []}, 6, 8, None, lambda: True, warmed=True)
    assert len(order) == 12
    calls = []

    def never() -> bool:
        calls.append(1)
        return False

    order.clear()
    assert interleave_settled([a, b], {1: []}, 6, 8, None, never, warmed=True)
    assert len(order) == 24 and len(calls) == 1  # once, not until it settles


def test_an_arms_speed_is_the_median_of_its_rounds_and_its_counters_add_up() -> None:
    arm = Arm("k=3", SERVER, True)
    arm.speeds[4] = [100.0, None, 300.0, 200.0]  # a round that measured nothing is left out
    assert arm.speed(4) == 200.0 and arm.speed(1) is None
    arm.counters = {1: SpecDecodeCounters(10, 30, 20, (10, 6, 4)), 4: SpecDecodeCounters(5, 15, 5, (5,))}
    total = arm.counted_total()
    assert total == SpecDecodeCounters(15, 45, 25, (15, 6, 4))
    assert Arm("alone", SERVER, False).counted_total() is None

"""Degenerate answers (eagle3_pipeline.serving.degenerate): empty ones and repetition loops, and normal
answers that repeat a word or a list marker legitimately."""

from __future__ import annotations

import pytest

from eagle3_pipeline.serving.degenerate import (
    LOOP_MIN_TOKENS,
    Degeneracy,
    Screening,
    classify,
    looping_tail,
    repeated_share,
    screen,
)

NORMAL = [
    "Sure! 3 plus 4 is 7.",
    "cat cat cat cat cat",  # "Repeat cat 5 times." asked for it
    "That is very, very, very good news.",
    "Here is the plan:\n- buy milk\n- buy eggs\n- buy bread\n- call the bank\n- book the train",
    "1. Preheat the oven.\n2. Mix the flour and the eggs.\n3. Bake for 20 minutes.\n4. Let it cool.",
    "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |",
    "The quick brown fox jumps over the lazy dog. The dog sleeps. The fox runs into the woods, and the "
    "woods are quiet again after the fox and the dog have gone home for the night.",
    "ha ha ha, that is a good one!",
    "def f(x):\n    return x\n\ndef g(x):\n    return f(x)\n",
    "5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30",
]


@pytest.mark.parametrize("answer", NORMAL)
def test_normal_answers_are_not_degenerate(answer: str) -> None:
    assert classify(answer) is None


LOOPS = [
    # the tiny verifier's answer to a spam-like prompt, cut by max_tokens mid-word
    " lemon" * 47 + " l",
    "I think that I think that I think that I think that I think that I think that",
    "The answer is 7. " * 6 + "The answer",
    "Sure! Here it is: " + "\n\n" + "!" * 40,
    "The capital of France is Paris. It is a city. It is a city. It is a city. It is a city. It is a city.",
    # a loop that ended (rule 2: most 4-grams are repeats, the tail is not periodic)
    "Step: add one. " * 8 + "Done.",
    # a loop that drifts: the same sentence with the number changing now and then
    " ".join(f"the cat sat on the mat {n}." for n in [1, 1, 1, 2, 2, 2, 3, 3, 3, 3]),
]


@pytest.mark.parametrize("answer", LOOPS)
def test_loops_are_repetition(answer: str) -> None:
    assert classify(answer) == Degeneracy.REPETITION


@pytest.mark.parametrize("answer", ["", "   ", "\n\n\t", "\u200b\u200b", None, "<|eot_id|>", " <|eot_id|> "])
def test_nothing_visible_is_empty(answer: str | None) -> None:
    assert classify(answer, special_tokens=["<|eot_id|>"]) == Degeneracy.EMPTY


def test_tokens_decide_over_the_text_when_given() -> None:
    loop = [433] * (LOOP_MIN_TOKENS - 1)
    assert classify("cat " * 15, loop) is None  # 15 tokens of one loop: short of LOOP_MIN_TOKENS
    assert classify("cat " * 16, [*loop, 433]) == Degeneracy.REPETITION
    assert classify("", [4]) == Degeneracy.EMPTY  # only the end-of-turn token: nothing visible
    # a period of 3 tokens cut short at the end, preceded by a normal start
    tokens = [9, 8, 7, 6, 5] + [1, 2, 3] * 6 + [1, 2]
    assert looping_tail(tokens) == 20 and classify("x", tokens) == Degeneracy.REPETITION


def test_a_period_must_repeat_enough_times() -> None:
    sentence = list(range(12))
    assert looping_tail(sentence * 3) == 0  # a 12-token sentence three times: fewer than 4 repeats
    assert looping_tail(sentence * 4) == 48
    assert looping_tail(list(range(40))) == 0


def test_repeated_share_is_seq_rep_4() -> None:
    assert repeated_share(list(range(30))) == 0.0
    assert repeated_share([1, 2, 3, 4] * 5) == pytest.approx(1 - 4 / 17)
    assert repeated_share([1, 1, 1, 1] * 3) == 0.0  # too short to judge


def test_a_screening_counts_by_reason_and_keeps_failed_requests() -> None:
    screening = screen(["Hello! How can I help?", "", " lemon" * 30, None], [[1, 2], [], None, None])
    assert screening == Screening((None, Degeneracy.EMPTY, Degeneracy.REPETITION, None))
    assert screening.kept == [0, 3] and screening.degenerate == [1, 2]
    assert screening.counts() == {"empty": 1, "repetition": 1}

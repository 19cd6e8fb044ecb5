"""Degenerate answers: empty ones and repetition loops, which would inflate a draft's measured acceptance.

A draft predicts a loop almost perfectly, so a held-out prompt the verifier answers with one makes the
acceptance look better than the draft is (tokenspeed #1305: raw completion prompts measured 74.6% from a
degenerate loop against 48.5% on chat prompts). evaluate classifies the verifier's own greedy answers and
leaves the degenerate prompts out of its figures. An answer is

- `empty` when nothing visible is left once the special tokens given are removed: only whitespace, control
  or format characters (Unicode categories Z* and C*, zero-width spaces included), or no text at all;
- `repetition` when it is a repetition loop, by either of two rules over its tokens (the token ids vLLM
  returns; the words and punctuation of the text without them):
  1. its tail is periodic: the last tokens are one n-gram of at most LOOP_MAX_PERIOD tokens repeated at
     least LOOP_MIN_REPEATS times in a row, LOOP_MIN_TOKENS tokens or more in all. This is the rule vLLM's
     own `repetition_detection` stop criterion applies to the tail of an output
     (vllm/v1/core/sched/utils.py `check_sequence_repetition`); here the last repeat may be cut short (an
     answer stopped by max_tokens mid-loop), and the minimum length keeps short legitimate repeats ("cat cat
     cat cat cat" asked for, "very very", list markers) out. It catches the greedy loop that runs until the
     token limit;
  2. most of its n-grams are repeats: seq-rep-4 (Welleck et al. 2019, "Neural Text Degeneration with
     Unlikelihood Training": the share of an answer's 4-grams that occur earlier in it, 1 - unique / all) is
     at least REPEATED_SHARE over MIN_NGRAMS or more 4-grams. Human text scores about 0.006 there and greedy
     decoding of a plain language model 0.44, so half the 4-grams being repeats is far past anything a
     normal answer does; it catches the loop that ended (an end-of-turn after it breaks rule 1's periodic
     tail) or that drifts slightly between repeats.
- otherwise it is not degenerate (None).

No maintained library in this environment measures this: vLLM's function lives inside its scheduler (and in
the server's environment, not the pipeline's), and stops a request rather than classifying an answer;
nltk-style n-gram utilities would only replace the one-line n-gram count. So the rules are written here,
pure and small.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

LOOP_MAX_PERIOD = 16  # tokens in the repeated n-gram
LOOP_MIN_REPEATS = 4  # times it occurs in a row at the tail (the last one may be cut short)
LOOP_MIN_TOKENS = 16  # the loop's length in tokens, so a short legitimate repeat is not one
REPEATED_NGRAM = 4
REPEATED_SHARE = 0.5
MIN_NGRAMS = 16

WORDS = re.compile(r"\w+|[^\w\s]")


class Degeneracy(StrEnum):
    EMPTY = "empty"
    REPETITION = "repetition"


def classify(
    text: str | None, tokens: Sequence[Hashable] | None = None, special_tokens: Iterable[str] = ()
) -> Degeneracy | None:
    """Why the answer `text` (with its generated `tokens`, when known) is degenerate, or None if it is not."""
    visible = text or ""
    for special in special_tokens:
        visible = visible.replace(special, "")
    if not any(not unicodedata.category(c).startswith(("Z", "C")) for c in visible):
        return Degeneracy.EMPTY
    units = list(tokens) if tokens else WORDS.findall(visible)
    if looping_tail(units) >= LOOP_MIN_TOKENS or repeated_share(units) >= REPEATED_SHARE:
        return Degeneracy.REPETITION
    return None


def looping_tail(units: Sequence[Hashable]) -> int:
    """The length of the longest periodic tail with a period of at most LOOP_MAX_PERIOD that repeats at
    least LOOP_MIN_REPEATS times; 0 when there is none."""
    longest = 0
    for period in range(1, min(LOOP_MAX_PERIOD, len(units) // LOOP_MIN_REPEATS) + 1):
        # the tail has this period while each unit equals the one a period before it
        run = 0
        while run + period < len(units) and units[-1 - run] == units[-1 - run - period]:
            run += 1
        span = run + period
        if span >= LOOP_MIN_REPEATS * period:
            longest = max(longest, span)
    return longest


def repeated_share(units: Sequence[Hashable], n: int = REPEATED_NGRAM) -> float:
    """seq-rep-n: the share of the n-grams that occur earlier in `units`; 0.0 below MIN_NGRAMS n-grams."""
    ngrams = [tuple(units[i : i + n]) for i in range(len(units) - n + 1)]
    if len(ngrams) < MIN_NGRAMS:
        return 0.0
    return 1.0 - len(set(ngrams)) / len(ngrams)


@dataclass(frozen=True)
class Screening:
    """The classification of every prompt's answer (None: kept; a failed request is kept, not judged)."""

    reasons: tuple[Degeneracy | None, ...]

    @property
    def kept(self) -> list[int]:
        return [i for i, reason in enumerate(self.reasons) if reason is None]

    @property
    def degenerate(self) -> list[int]:
        return [i for i, reason in enumerate(self.reasons) if reason is not None]

    def counts(self) -> dict[str, int]:
        """Degenerate answers by reason (every reason, zeros included)."""
        return {str(r): sum(1 for x in self.reasons if x == r) for r in Degeneracy}


def screen(
    answers: Sequence[str | None], tokens: Sequence[Sequence[Hashable] | None] | None = None
) -> Screening:
    """Every answer classified; a None answer (its request failed) is not judged."""
    token_lists = tokens if tokens is not None else [None] * len(answers)
    return Screening(
        tuple(
            classify(text, ids) if text is not None else None
            for text, ids in zip(answers, token_lists, strict=True)
        )
    )

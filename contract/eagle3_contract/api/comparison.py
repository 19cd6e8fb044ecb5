"""Decisions from repeated, paired measurements: the median ratio of two arms with a 95 % interval.

A speed measured once on a shared machine says little: a neighbour's build, a thermal throttle or another
tenant's traffic can move one run by 2x. Everything that decides from a speed (the sweep's schedule, which
of draft.candidates ships, the canary's verdict, the headline speedup) measures two arms A and B in ROUNDS:
short runs of the same prompts, A and B alternating with both servers warm, so that a disturbance lands on
both arms of a round. Each round gives a ratio A/B; the comparison is

  ratio     the median of the per-round ratios;
  interval  the distribution-free interval of that median from the ratios' order statistics: with n rounds
            sorted, [r(j), r(n+1-j)] covers the median with probability 1 - 2 P(Binomial(n, 1/2) < j); j is
            the largest whose coverage is at least CONFIDENCE (6 rounds: the lowest and highest ratio,
            96.9 %; 5 rounds could give no more than 93.8 %, hence MIN_ROUNDS);
  spread    the coefficient of variation of the per-round ratios (standard deviation / mean).

A decision against a threshold t (1.0: "B is faster than A"; 1 - tolerance for the canary) is taken only
where the interval excludes t: `better` when it lies above, `worse` below, else `notDistinguishable`. A
comparison whose rounds disagree beyond NOISY_SPREAD (their coefficient of variation; docs/serving.md says
how it was chosen) is `noisy`: the measurement extends its rounds once when it can (the pipeline's rounds,
the canary's observation), and a comparison still noisy after that is flagged wherever it is shown, never
silently used. The interval itself already widens with the noise (it is distribution-free), so a noisy
comparison decides only where even its widest rounds agree.

Pure: the pipeline measures rounds, the operator reads live windows; both compare here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from enum import StrEnum

from pydantic import ConfigDict, Field

from eagle3_contract.api.base import ApiModel

CONFIDENCE = 0.95
MIN_ROUNDS = 6  # the fewest rounds whose order-statistic interval of the median reaches CONFIDENCE
DEFAULT_ROUNDS = 6
NOISY_SPREAD = 0.25  # coefficient of variation of the per-round ratios beyond which a comparison is noisy


class Verdict(StrEnum):
    """What a comparison says against a threshold."""

    BETTER = "better"  # the whole interval above the threshold
    WORSE = "worse"  # the whole interval below it
    NOT_DISTINGUISHABLE = "notDistinguishable"  # the interval holds the threshold


class Comparison(ApiModel):
    """The median per-round ratio of two arms (B over A) with its interval; unknown fields tolerated (it
    lives in results, status and manifests)."""

    model_config = ConfigDict(extra="ignore")

    ratio: float = Field(description="Median of the per-round ratios (B / A).")
    low: float = Field(description="Lower end of the median's interval.")
    high: float = Field(description="Upper end of the median's interval.")
    confidence: float = Field(description="Coverage of the interval (order statistics), e.g. 0.969.")
    rounds: int = Field(description="Paired rounds measured.")
    spread: float = Field(description="Coefficient of variation of the per-round ratios.")
    noisy: bool = Field(False, description="The rounds disagree beyond the noise bound (flagged).")

    def verdict(self, threshold: float = 1.0) -> Verdict:
        """BETTER or WORSE only where the interval excludes `threshold`."""
        if self.low > threshold:
            return Verdict.BETTER
        if self.high < threshold:
            return Verdict.WORSE
        return Verdict.NOT_DISTINGUISHABLE

    def text(self) -> str:
        """`1.62x [1.48, 1.75] (96.9 % interval, 6 rounds)`, with `noisy` when it is."""
        noisy = f", noisy: rounds vary {self.spread:.0%}" if self.noisy else ""
        return (
            f"{self.ratio:.2f}x [{self.low:.2f}, {self.high:.2f}] "
            f"({self.confidence:.1%} interval, {self.rounds} rounds{noisy})"
        )


def coverage(n: int, j: int) -> float:
    """P(r(j) <= median <= r(n+1-j)) for n values sorted: 1 - 2 P(Binomial(n, 1/2) <= j - 1)."""
    below = sum(math.comb(n, i) for i in range(j)) / float(2**n)
    return max(0.0, 1.0 - 2.0 * below)


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """The order-statistic interval of the median of `values` and its coverage: the narrowest whose
    coverage is at least `confidence`, else the widest there is (lowest to highest)."""
    if not values:
        raise ValueError("no values to take an interval of")
    ordered = sorted(values)
    n = len(ordered)
    j = 1
    while j + 1 <= (n + 1) // 2 and coverage(n, j + 1) >= confidence:
        j += 1
    return ordered[j - 1], ordered[n - j], coverage(n, j)


def spread(values: Sequence[float]) -> float:
    """Coefficient of variation (population standard deviation over the mean); 0 for one value."""
    mean = statistics.fmean(values)
    return float(statistics.pstdev(values) / mean) if len(values) > 1 and mean > 0 else 0.0


def compare_ratios(ratios: Sequence[float], noisy_spread: float = NOISY_SPREAD) -> Comparison:
    """The comparison of per-round ratios already taken (B / A per round)."""
    if not ratios:
        raise ValueError("no paired rounds to compare")
    low, high, covered = median_interval(ratios)
    cv = spread(ratios)
    return Comparison(
        ratio=round(statistics.median(ratios), 4),
        low=round(low, 4),
        high=round(high, 4),
        confidence=round(covered, 4),
        rounds=len(ratios),
        spread=round(cv, 4),
        noisy=cv > noisy_spread,
    )


def compare_rounds(
    a: Sequence[float | None], b: Sequence[float | None], noisy_spread: float = NOISY_SPREAD
) -> Comparison | None:
    """B against A, round by round (a[i] and b[i] measured together); rounds where either arm measured
    nothing (None or 0) are left out; None when no round has both."""
    if len(a) != len(b):
        raise ValueError(f"paired rounds differ in number: {len(a)} and {len(b)}")
    ratios = [y / x for x, y in zip(a, b, strict=True) if x and y]
    return compare_ratios(ratios, noisy_spread) if ratios else None

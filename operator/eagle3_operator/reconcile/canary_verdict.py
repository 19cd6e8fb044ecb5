"""serving.canary's comparison: both tracks paired sub-window by sub-window, the canary over the incumbent as
a median ratio with a 95 % interval (eagle3_contract.api.comparison), and the verdict against 1 - tolerance.

The observation since the canary's start is cut into sub-windows of serving.canary.duration / windows (whole
milliseconds, 1 s at the least): sub-window k is [started + k w, started + (k + 1) w], and every complete
one up to the reconcile counts (a decision that waits for minRequests past the duration has more of them).
In each, each track has a mean acceptance length and an output tokens/s per request (canary_queries, over
that sub-window), or none (no drafts, no finished request). Sub-windows where either track has none are
left out; the rest are the paired rounds of two comparisons, one per figure. Both tracks serve the same
traffic at the same time, so a disturbance (a busy node, a burst of long prompts) lands on both sides of a
round and mostly cancels in its ratio.

  better    both intervals lie above 1 - tolerance: promote;
  worse     either lies below: roll back;
  otherwise (an interval holds the threshold, or its rounds are noisy): not distinguishable.

Pure; plan_canary (canary.py) decides what to do with the verdict (promote, roll back, extend once).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from eagle3_contract.api.comparison import MIN_ROUNDS, Comparison, Verdict, compare_rounds
from eagle3_contract.api.fields import duration_seconds
from eagle3_contract.api.spec import Canary
from eagle3_contract.api.status import CanaryStatus
from eagle3_operator.reconcile.observe import CanaryFigures


@dataclass(frozen=True)
class Ratios:
    """The canary over the incumbent, sub-window by sub-window (None: no sub-window has both tracks)."""

    acceptance: Comparison | None = None
    speed: Comparison | None = None


def window_seconds(canary: Canary) -> float:
    """One sub-window: serving.canary.duration / windows, in whole milliseconds, 1 s at the least."""
    return max(1000, round(duration_seconds(canary.duration) * 1000 / canary.windows)) / 1000


def complete_windows(canary: Canary, started: str, now: str) -> int:
    """Sub-windows of the observation that have ended by `now` (the executor reads each of them)."""
    elapsed_ms = (datetime.fromisoformat(now) - datetime.fromisoformat(started)).total_seconds() * 1000
    return max(0, int(elapsed_ms // round(window_seconds(canary) * 1000)))


def ratios(figures: CanaryFigures) -> Ratios:
    """Both comparisons from the tracks' sub-windows (those where a track has no figure left out)."""
    inc, can = figures.incumbent_windows, figures.canary_windows
    count = min(len(inc.acceptance_length), len(can.acceptance_length))
    speeds = min(len(inc.output_tokens_per_second), len(can.output_tokens_per_second))
    return Ratios(
        acceptance=compare_rounds(inc.acceptance_length[:count], can.acceptance_length[:count]),
        speed=compare_rounds(inc.output_tokens_per_second[:speeds], can.output_tokens_per_second[:speeds]),
    )


def rounds_wait(status: CanaryStatus) -> str | None:
    """What the comparison still waits for: MIN_ROUNDS paired sub-windows of each figure (None: it has)."""
    acceptance, speed = _rounds(status.acceptance_ratio), _rounds(status.speed_ratio)
    if min(acceptance, speed) >= MIN_ROUNDS:
        return None
    length = f" of {status.window_seconds:g}s" if status.window_seconds else ""
    return (
        f"{MIN_ROUNDS} sub-windows{length} where both tracks have figures (acceptance length "
        f"{acceptance}/{MIN_ROUNDS}, output tokens/s {speed}/{MIN_ROUNDS})"
    )


def _rounds(comparison: Comparison | None) -> int:
    return comparison.rounds if comparison is not None else 0


def verdict(tolerance: float, status: CanaryStatus) -> Verdict:
    """BETTER when both intervals lie above 1 - tolerance, WORSE when either lies below, else (an interval
    holding the threshold, noisy rounds, a comparison missing) NOT_DISTINGUISHABLE."""
    threshold = 1.0 - tolerance
    found = [c.verdict(threshold) if c is not None else Verdict.NOT_DISTINGUISHABLE for c in _both(status)]
    if Verdict.WORSE in found:
        return Verdict.WORSE
    if all(v == Verdict.BETTER for v in found):
        return Verdict.BETTER
    return Verdict.NOT_DISTINGUISHABLE


def _both(status: CanaryStatus) -> tuple[Comparison | None, Comparison | None]:
    return status.acceptance_ratio, status.speed_ratio


WHERE = {Verdict.BETTER: "above it", Verdict.WORSE: "below it", Verdict.NOT_DISTINGUISHABLE: "holding it"}


def ratios_text(tolerance: float, status: CanaryStatus) -> str:
    """`the canary over the incumbent, sub-window by sub-window, against 0.95 (1 - tolerance 5%): acceptance
    length 1.60x [1.52, 1.66] (96.9% interval, 6 rounds) above it; output tokens/s per request 0.98x [0.90,
    1.03] (96.9% interval, 6 rounds) holding it`."""
    threshold = 1.0 - tolerance
    parts = []
    named = zip(("acceptance length", "output tokens/s per request"), _both(status), strict=True)
    for name, comparison in named:
        if comparison is None:
            parts.append(f"{name} n/a (no sub-window where both tracks have it)")
        elif comparison.noisy:
            parts.append(f"{name} {comparison.text()}: too noisy to decide")
        else:
            parts.append(f"{name} {comparison.text()} {WHERE[comparison.verdict(threshold)]}")
    return (
        f"the canary over the incumbent, sub-window by sub-window, against {threshold:.2f} (1 - tolerance "
        f"{tolerance:.0%}): {'; '.join(parts)}"
    )

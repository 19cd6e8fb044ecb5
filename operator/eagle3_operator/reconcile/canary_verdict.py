"""serving.canary's comparison: both tracks paired sub-window by sub-window, the canary over the incumbent as
a median ratio with a 95 % interval (eagle3_contract.api.comparison), and the verdict against 1 - tolerance.

The observation since the canary's start is cut into sub-windows of serving.canary.duration / windows (whole
milliseconds, 1 s at the least): sub-window k is [started + k w, started + (k + 1) w], and every complete
one up to the reconcile counts (a decision that waits for minRequests past the duration has more of them).
In each, each track has a mean acceptance length and an output tokens/s per request, the differences of its
counters at the sub-window's edges (canary_figures), or none (no drafts, no finished request). Sub-windows
where either track has no acceptance length are left out of that comparison; those where either finished
fewer than MIN_WINDOW_REQUESTS requests are left out of the speed's, rather than taken as a ratio: a
request's time per output token is one scheduling accident away from any figure (the Prometheus tier, one
server, the same four prompts a wave: 1 to 187 output tokens/s per request from one sub-window to the next
on a loaded machine, docs/benchmarks.md). The rest are the paired rounds of two comparisons, one per figure.
Both tracks serve the same traffic at the same time, so a disturbance (a busy node, a burst of long prompts)
lands on both sides of a round and mostly cancels in its ratio.

  better    both intervals lie above 1 - tolerance: promote;
  worse     either lies below: roll back;
  otherwise (an interval holds the threshold): not distinguishable.

The first decision is taken only where it is `settled`: a worse comparison whose sub-windows agree, or two
better ones that both agree. Otherwise (not distinguishable, or decided on noisy sub-windows: their ratios
vary beyond comparison.NOISY_SPREAD) the canary is observed once more, as the pipeline's rounds are doubled
once, and then decided on the intervals of all its sub-windows: a noisy comparison is flagged in the message
and decides only where even its widest interval clears the threshold (distribution-free, it widens with the
noise).

Pure; plan_canary (canary.py) decides what to do with the verdict (promote, roll back, extend once).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from eagle3_contract.api.comparison import MIN_ROUNDS, NOISY_SPREAD, Comparison, Verdict, compare_rounds
from eagle3_contract.api.fields import duration_seconds
from eagle3_contract.api.spec import Canary
from eagle3_contract.api.status import CanaryStatus
from eagle3_operator.reconcile.observe import CanaryFigures

MIN_WINDOW_REQUESTS = 4  # finished requests each track needs in a sub-window for its speed to count


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
    """Both comparisons from the tracks' sub-windows: those where a track has no figure left out, and those
    where a track finished fewer than MIN_WINDOW_REQUESTS requests left out of the speed's."""
    inc, can = figures.incumbent_windows, figures.canary_windows
    count = min(len(inc.acceptance_length), len(can.acceptance_length))
    timed = [
        (incumbent, canary)
        for incumbent, canary, finished, new_finished in zip(
            inc.output_tokens_per_second,
            can.output_tokens_per_second,
            inc.requests,
            can.requests,
            strict=False,  # a track with fewer sub-windows pairs as far as it goes
        )
        if min(finished or 0, new_finished or 0) >= MIN_WINDOW_REQUESTS
    ]
    return Ratios(
        acceptance=compare_rounds(inc.acceptance_length[:count], can.acceptance_length[:count]),
        speed=compare_rounds([i for i, _ in timed], [c for _, c in timed]) if timed else None,
    )


def rounds_wait(status: CanaryStatus) -> str | None:
    """What the comparison still waits for: MIN_ROUNDS paired sub-windows of each figure (None: it has)."""
    acceptance, speed = _rounds(status.acceptance_ratio), _rounds(status.speed_ratio)
    if min(acceptance, speed) >= MIN_ROUNDS:
        return None
    length = f" of {status.window_seconds:g}s" if status.window_seconds else ""
    return (
        f"{MIN_ROUNDS} sub-windows{length} where both tracks have figures (acceptance length "
        f"{acceptance}/{MIN_ROUNDS}, output tokens/s {speed}/{MIN_ROUNDS}: at least {MIN_WINDOW_REQUESTS} "
        "finished requests on each track)"
    )


def _rounds(comparison: Comparison | None) -> int:
    return comparison.rounds if comparison is not None else 0


def verdict(tolerance: float, status: CanaryStatus) -> Verdict:
    """BETTER when both intervals lie above 1 - tolerance, WORSE when either lies below, else (an interval
    holding the threshold, a comparison missing) NOT_DISTINGUISHABLE."""
    threshold = 1.0 - tolerance
    found = [c.verdict(threshold) if c is not None else Verdict.NOT_DISTINGUISHABLE for c in _both(status)]
    if Verdict.WORSE in found:
        return Verdict.WORSE
    if all(v == Verdict.BETTER for v in found):
        return Verdict.BETTER
    return Verdict.NOT_DISTINGUISHABLE


def settled(tolerance: float, status: CanaryStatus) -> bool:
    """Whether the verdict may be taken before an extension: a comparison below the threshold whose
    sub-windows agree (not noisy), or both above it and neither noisy."""
    threshold = 1.0 - tolerance
    both = [c for c in _both(status) if c is not None]
    if any(c.verdict(threshold) == Verdict.WORSE and not c.noisy for c in both):
        return True
    return verdict(tolerance, status) == Verdict.BETTER and not any(c.noisy for c in both)


def unsettled_text(tolerance: float, status: CanaryStatus) -> str:
    """Why the first decision waits for the extension: `not distinguishable from ...` or `too noisy`."""
    if verdict(tolerance, status) == Verdict.NOT_DISTINGUISHABLE:
        return "is not distinguishable from incumbent"
    return (
        f"is too noisy to decide on yet (its sub-windows' ratios vary beyond {NOISY_SPREAD:.0%}) next to "
        "incumbent"
    )


def _both(status: CanaryStatus) -> tuple[Comparison | None, Comparison | None]:
    return status.acceptance_ratio, status.speed_ratio


WHERE = {Verdict.BETTER: "above it", Verdict.WORSE: "below it", Verdict.NOT_DISTINGUISHABLE: "holding it"}


def ratios_text(tolerance: float, status: CanaryStatus) -> str:
    """`the canary over the incumbent, sub-window by sub-window, against 0.95 (1 - tolerance 5%): acceptance
    length 1.60x [1.52, 1.66] (96.9% interval, 6 rounds) above it; output tokens/s per request 0.98x [0.90,
    1.03] (96.9% interval, 6 rounds) holding it` (a noisy comparison's text says so: `..., noisy: rounds vary
    31%)`)."""
    threshold = 1.0 - tolerance
    parts = []
    named = zip(("acceptance length", "output tokens/s per request"), _both(status), strict=True)
    for name, comparison in named:
        if comparison is None:
            parts.append(f"{name} n/a (no sub-window where both tracks have it)")
        else:
            parts.append(f"{name} {comparison.text()} {WHERE[comparison.verdict(threshold)]}")
    return (
        f"the canary over the incumbent, sub-window by sub-window, against {threshold:.2f} (1 - tolerance "
        f"{tolerance:.0%}): {'; '.join(parts)}"
    )

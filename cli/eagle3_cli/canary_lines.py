"""`eagle3 status`'s lines about serving.canary: the canary's draft and phase, whether it was extended, and
the two comparisons it is decided on (the canary over the incumbent, sub-window by sub-window, each a median
ratio with its 95 % interval), so "not distinguishable" reads with the intervals that made it so; and what
the comparison of the drafts' evaluated acceptance per category found."""

from __future__ import annotations

from eagle3_contract.api.comparison import Comparison
from eagle3_contract.api.status import CanaryPhase, ConditionType, Eagle3RunStatus


def canary_lines(status: Eagle3RunStatus) -> list[str]:
    """`canary draft X next to Y: RolledBack (NotDistinguishable), extended once` and a line per comparison;
    none without a canary."""
    canary = status.canary
    if canary is None:
        return []
    cond = next((c for c in status.conditions if c.type == ConditionType.CANARY.value), None)
    reason = f" ({cond.reason})" if cond is not None and cond.reason != canary.phase.value else ""
    extended = ", extended once" if canary.extended else ""
    lines = [
        f"canary draft {canary.draft} next to {canary.incumbent_draft or 'the incumbent'}: "
        f"{canary.phase.value}{reason}{extended}"
    ]
    if canary.window_seconds is not None:
        lines[0] += f" (sub-windows of {canary.window_seconds:g}s, canary / incumbent)"
    lines += [
        f"  {name}: {_text(comparison)}"
        for name, comparison in (
            ("acceptance length", canary.acceptance_ratio),
            ("output tokens/s per request", canary.speed_ratio),
        )
        if comparison is not None or (canary.phase != CanaryPhase.OBSERVING and canary.started)
    ]
    lines += [f"  per category: {canary.categories}"] if canary.categories else []
    return lines


def _text(comparison: Comparison | None) -> str:
    return comparison.text() if comparison is not None else "n/a (no sub-window where both tracks have it)"

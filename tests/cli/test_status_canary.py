"""`eagle3 status`'s canary lines (eagle3_cli.canary_lines): the phase with the reason that decided it, the
extension, and both comparisons with their intervals."""

from __future__ import annotations

from typing import Any

from eagle3_cli import status as table
from eagle3_cli.canary_lines import canary_lines
from eagle3_contract.api.comparison import compare_ratios
from eagle3_contract.api.status import Eagle3RunStatus

ACCEPTANCE = compare_ratios([1.0, 1.01, 0.99, 1.02, 0.98, 1.0])
SPEED = compare_ratios([0.9, 1.0, 0.97, 1.02, 0.99, 1.0])


def status_of(canary: dict[str, Any], reason: str, value: str) -> Eagle3RunStatus:
    cond = {
        "type": "Canary",
        "status": value,
        "reason": reason,
        "message": "m",
        "lastTransitionTime": "2026-12-03T11:50:00Z",
    }
    base = {
        "phase": "RolledBack",
        "deployment": "tiny-vllm-canary",
        "draft": "export/b",
        "incumbentDraft": "export/a",
    }
    return Eagle3RunStatus.model_validate({"phase": "Serving", "conditions": [cond], "canary": base | canary})


def test_a_canary_kept_out_as_not_distinguishable_shows_both_intervals() -> None:
    ratios = {
        "acceptanceRatio": ACCEPTANCE.model_dump(by_alias=True),
        "speedRatio": SPEED.model_dump(by_alias=True),
    }
    status = status_of({"windowSeconds": 100.0, "extended": True, **ratios}, "NotDistinguishable", "False")
    assert canary_lines(status) == [
        "canary draft export/b next to export/a: RolledBack (NotDistinguishable), extended once "
        "(sub-windows of 100s, canary / incumbent)",
        f"  acceptance length: {ACCEPTANCE.text()}",
        f"  output tokens/s per request: {SPEED.text()}",
    ]
    assert (
        "  output tokens/s per request: 0.99x [0.90, 1.02] (96.9% interval, 6 rounds)"
        in table.plain_table("x", status)
    )


def test_an_observed_canary_without_figures_yet_is_one_line_and_no_canary_none() -> None:
    observing = status_of({"phase": "Observing"}, "Observing", "Unknown")
    assert canary_lines(observing) == ["canary draft export/b next to export/a: Observing"]
    assert canary_lines(Eagle3RunStatus()) == []


def test_a_canary_refused_on_a_category_shows_what_was_compared_and_no_live_comparison() -> None:
    note = (
        "evaluated acceptance length per category, 2 compared (add, count): below 0.95x the incumbent's: add"
    )
    refused = status_of({"categories": note}, "CategoryRegressed", "False")
    assert canary_lines(refused) == [
        "canary draft export/b next to export/a: RolledBack (CategoryRegressed)",
        f"  per category: {note}",
    ]

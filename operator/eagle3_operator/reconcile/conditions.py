"""Standard conditions: a transition time that moves only when the status does."""

from __future__ import annotations

from eagle3_contract.api.status import Condition, ConditionType


def set_condition(
    previous: list[Condition],
    kind: ConditionType,
    status: bool,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
) -> Condition:
    """The new condition of `kind`, keeping the old lastTransitionTime if its status did not change."""
    value = "True" if status else "False"
    old = next((c for c in previous if c.type == kind.value), None)
    since = old.last_transition_time if old is not None and old.status == value else now
    return Condition(
        type=kind.value,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )

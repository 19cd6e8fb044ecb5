"""serving.canary: a new draft served as a canary next to the incumbent, promoted or rolled back on live
figures. Pure: the executor reads the figures from Prometheus before planning (Observed.canary_figures).

While a canary is observed the serving Deployment keeps the incumbent's draft (plan_serving gets no draft);
the canary Deployment serves the new one behind the same Service. Once serving.canary.duration has passed
since its first ready replica, it finished serving.canary.minRequests requests and at least MIN_ROUNDS
sub-windows have both tracks' figures, the tracks are compared sub-window by sub-window (canary_verdict):
promoted when the intervals of the canary's mean acceptance length and output tokens/s per request over the
incumbent's both lie above 1 - tolerance, rolled back when either lies below. Otherwise (an interval holds the
threshold), or where the sub-windows of the deciding comparison are noisy, the canary is extended once:
observed for another duration, all its sub-windows compared again, and decided on their intervals (noisy ones
flagged); still undecided, it is rolled back as NotDistinguishable and the incumbent kept. Before all that,
the new draft's evaluated acceptance length per category is compared with the incumbent's (canary_categories):
a category regressed beyond the tolerance refuses the canary at once (CategoryRegressed), whatever its mean.
With no decision by serving.canary.timeout (counted from the canary's creation, the Canary condition's
transition) it is rolled back as inconclusive (NotDistinguishable once extended). A rolled-back draft is not
tried again while it stays the rollout: a new draft path in the spec is a new canary.

No requeue of its own: the operator's resync (--resync-seconds, 60 s by default) reconciles every run, so
a decision comes at most one resync after its conditions hold, far within a duration of minutes; a canary
pod's events reconcile the run sooner.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from eagle3_contract.api.categories import CategoryFigures
from eagle3_contract.api.comparison import Verdict
from eagle3_contract.api.fields import duration_seconds
from eagle3_contract.api.spec import Canary, Eagle3RunSpec
from eagle3_contract.api.status import (
    CanaryPhase,
    CanaryStatus,
    Checkpoint,
    Condition,
    ConditionType,
    Eagle3RunStatus,
    TrackFigures,
)
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.serving import build_canary_deployment
from eagle3_operator.reconcile import canary_verdict
from eagle3_operator.reconcile.actions import Action, object_ref
from eagle3_operator.reconcile.canary_categories import check_categories
from eagle3_operator.reconcile.observe import CanaryFigures, Observed
from eagle3_operator.reconcile.serving import served_spec

PROMOTED = "Promoted"
ROLLED_BACK = "RolledBack"
INCONCLUSIVE = "CanaryInconclusive"
NOT_DISTINGUISHABLE = "NotDistinguishable"
OBSERVING = "Observing"
EXTENDED = "Extended"
CATEGORY_REGRESSED = "CategoryRegressed"


@dataclass(frozen=True)
class CanaryPlan:
    """The canary's writes, the draft the serving Deployment may roll out now (None: keep the incumbent),
    status.canary and the Canary condition."""

    actions: tuple[Action, ...] = ()
    serve: Checkpoint | None = None
    status: CanaryStatus | None = None
    condition: Condition | None = None


@dataclass(frozen=True)
class _Window:
    """The canary being observed: its status so far and when its Canary condition went Unknown."""

    status: CanaryStatus
    since: str  # the canary's creation (timeout counts from here)
    now: str


def plan_canary(
    ref: RunRef,
    spec: Eagle3RunSpec,
    observed: Observed,
    rollout: Checkpoint | None,
    previous: Eagle3RunStatus,
    now: str,
    generation: int | None = None,
) -> CanaryPlan:
    """What to do with a new draft that may serve (`rollout`): roll it out at once (no canary configured, no
    incumbent serving another draft), or canary it, or keep the decision already taken."""
    last = previous.canary
    history = _history(previous)
    deletes = _delete(ref, observed)
    if not spec.serving.enabled or rollout is None or spec.serving.canary is None:
        return CanaryPlan(deletes, rollout, *history)  # canary removed mid-way: roll out directly
    if last is not None and last.draft == rollout.path and last.phase != CanaryPhase.OBSERVING:
        serve = rollout if last.phase == CanaryPhase.PROMOTED else None
        return CanaryPlan(deletes, serve, *history)
    incumbent = observed.deployment
    if incumbent is None or incumbent.draft in (None, rollout.path):
        return CanaryPlan(deletes, rollout, *history)  # the first rollout, or the draft already serves
    return _observe(ref, spec, spec.serving.canary, observed, rollout, previous, now, generation)


def _history(previous: Eagle3RunStatus) -> tuple[CanaryStatus | None, Condition | None]:
    """A decided canary's status and condition, kept as they are; an observed one's dropped (its draft
    no longer is the rollout, or the canary left the spec)."""
    last = previous.canary
    if last is None or last.phase == CanaryPhase.OBSERVING:
        return None, None
    return last, next((c for c in previous.conditions if c.type == ConditionType.CANARY.value), None)


def _delete(ref: RunRef, observed: Observed) -> tuple[Action, ...]:
    if observed.canary is None:
        return ()
    return (Action("delete", object_ref("apps/v1", "Deployment", observed.canary.name, ref)),)


def _observe(
    ref: RunRef,
    spec: Eagle3RunSpec,
    canary: Canary,
    observed: Observed,
    rollout: Checkpoint,
    previous: Eagle3RunStatus,
    now: str,
    generation: int | None,
) -> CanaryPlan:
    """Create (or update) the canary Deployment, then observe it, promote it or roll it back."""
    last = previous.canary
    same = last is not None and last.phase == CanaryPhase.OBSERVING and last.draft == rollout.path
    before = next((c for c in previous.conditions if c.type == ConditionType.CANARY.value), None)
    since = before.last_transition_time if same and before is not None and before.status == "Unknown" else now
    incumbent = _incumbent_record(previous, observed)
    kept = last.incumbent_categories if same and last is not None else _categories(incumbent)
    check = check_categories(rollout.categories, kept, canary.tolerance)
    schedule = rollout.speculation.schedule if rollout.speculation is not None else []
    desired = build_canary_deployment(ref, served_spec(spec, rollout), rollout.path, rollout.sha256, schedule)
    view = observed.canary
    actions: tuple[Action, ...] = ()
    if view is None:
        actions = (Action("create", desired),)
    elif view.spec_hash != desired["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH]:
        actions = (Action("patch", desired),)
    ready = view.ready_replicas if view is not None else 0
    started = last.started if same and last is not None and last.started else (now if ready else None)
    figures = (observed.canary_figures or CanaryFigures()) if started else CanaryFigures()
    ratios = canary_verdict.ratios(figures)
    extended_at = last.extended_at if same and last is not None else None
    status = CanaryStatus(
        phase=CanaryPhase.OBSERVING,
        deployment=names.canary_name(ref.name),
        draft=rollout.path,
        sha256=rollout.sha256,
        incumbent_draft=observed.deployment.draft if observed.deployment is not None else None,
        replicas=canary.replicas,
        ready_replicas=ready,
        started=started,
        incumbent=figures.incumbent,
        canary=figures.canary,
        window_seconds=canary_verdict.window_seconds(canary),
        acceptance_ratio=ratios.acceptance,
        speed_ratio=ratios.speed,
        extended=extended_at is not None,
        extended_at=extended_at,
        incumbent_categories=kept,
        categories=check.note,
    )
    if check.regressed:
        return _refuse(ref, observed, _Window(status, since, now), rollout, incumbent, generation)
    return _decide(canary, _Window(status, since, now), figures, rollout, actions, ref, observed, generation)


def _incumbent_record(previous: Eagle3RunStatus, observed: Observed) -> Checkpoint | None:
    """The serving draft's record with its evaluated figures: status.checkpoint while it names that draft
    (until the reconcile that starts the canary, which names the new one)."""
    serving = observed.deployment.draft if observed.deployment is not None else None
    found = previous.checkpoint
    return found if found is not None and serving is not None and found.path == serving else None


def _categories(record: Checkpoint | None) -> list[CategoryFigures] | None:
    return record.categories if record is not None else None


def _refuse(
    ref: RunRef,
    observed: Observed,
    window: _Window,
    rollout: Checkpoint,
    incumbent: Checkpoint | None,
    generation: int | None,
) -> CanaryPlan:
    """A category regressed (evaluated figures, known before any live traffic): rolled back at once."""
    status, now = window.status, window.now

    def mean(record: Checkpoint | None) -> str:
        known = record is not None and record.acceptance_length is not None
        return f"{record.acceptance_length:.2f}" if known and record is not None else "n/a"

    message = (
        f"canary draft {status.draft} regresses a category: {status.categories}; its evaluated mean "
        f"acceptance length {mean(rollout)} vs incumbent {mean(incumbent)}: rolled back before any live "
        f"traffic, the incumbent {status.incumbent_draft} keeps serving (a draft is refused on one "
        "category's regression beyond serving.canary.tolerance, whatever its mean)"
    )
    update = {"phase": CanaryPhase.ROLLED_BACK, "replicas": 0, "decided": now, "message": message}
    cond = canary_condition("False", CATEGORY_REGRESSED, message, now, generation)
    return CanaryPlan(_delete(ref, observed), None, status.model_copy(update=update), cond)


def _decide(
    canary: Canary,
    window: _Window,
    figures: CanaryFigures,
    rollout: Checkpoint,
    actions: tuple[Action, ...],
    ref: RunRef,
    observed: Observed,
    generation: int | None,
) -> CanaryPlan:
    """Promote or roll back on the intervals once nothing is waited for; extend once where they cannot
    tell; roll back at the timeout; else keep observing."""
    status, now = window.status, window.now
    waits = waiting_for(canary, status, figures, now)
    if not waits:
        found = canary_verdict.verdict(canary.tolerance, status)
        if not status.extended and not canary_verdict.settled(canary.tolerance, status):
            return _extend(canary, window, actions, generation)
        promote, reason, message = _verdict_message(canary, status, found)
    elif _seconds(window.since, now) >= duration_seconds(canary.timeout):
        promote, reason = False, NOT_DISTINGUISHABLE if status.extended else INCONCLUSIVE
        message = (
            f"canary draft {status.draft}: no decision within serving.canary.timeout {canary.timeout} "
            f"({'; '.join(waits)}); {figures_text(status)}; "
            f"{canary_verdict.ratios_text(canary.tolerance, status)}: rolled back"
        )
    else:
        so_far = status.acceptance_ratio is not None or status.speed_ratio is not None
        message = (
            f"observing canary draft {status.draft} next to incumbent {status.incumbent_draft}: "
            f"waiting for {'; '.join(waits)} (rolled back if undecided by {canary.timeout} after its start)"
            + (f"; so far {canary_verdict.ratios_text(canary.tolerance, status)}" if so_far else "")
        )
        observing = status.model_copy(update={"message": message})
        reason = EXTENDED if status.extended else OBSERVING
        cond = canary_condition("Unknown", reason, message, window.since, generation)
        return CanaryPlan(actions, None, observing, cond)
    decided = status.model_copy(
        update={
            "phase": CanaryPhase.PROMOTED if promote else CanaryPhase.ROLLED_BACK,
            "replicas": 0,
            "decided": now,
            "seconds_to_decision": _seconds(status.started, now) if status.started else None,
            "message": message,
        }
    )
    cond = canary_condition("True" if promote else "False", reason, message, now, generation)
    return CanaryPlan(_delete(ref, observed), rollout if promote else None, decided, cond)


def _extend(
    canary: Canary, window: _Window, actions: tuple[Action, ...], generation: int | None
) -> CanaryPlan:
    """The first decision could not tell the tracks apart, or only on noisy sub-windows: observe once more
    for serving.canary.duration."""
    status, now = window.status, window.now
    message = (
        f"canary draft {status.draft} {canary_verdict.unsettled_text(canary.tolerance, status)} "
        f"{status.incumbent_draft} yet: {canary_verdict.ratios_text(canary.tolerance, status)}; observing it "
        f"for another serving.canary.duration {canary.duration}, then it is decided on all its sub-windows' "
        f"intervals, the incumbent kept unless both lie above the threshold ({figures_text(status)})"
    )
    extended = status.model_copy(update={"extended": True, "extended_at": now, "message": message})
    cond = canary_condition("Unknown", EXTENDED, message, window.since, generation)
    return CanaryPlan(actions, None, extended, cond)


def _verdict_message(canary: Canary, status: CanaryStatus, found: Verdict) -> tuple[bool, str, str]:
    """(promote, the condition's reason, the message naming both intervals and both tracks' figures)."""
    ratios = canary_verdict.ratios_text(canary.tolerance, status)
    categories = f"; {status.categories}" if status.categories else ""
    head = f"canary draft {status.draft}: {figures_text(status)}; {ratios}{categories}"
    if found == Verdict.BETTER:
        return True, PROMOTED, f"{head}: promoted"
    if found == Verdict.WORSE:
        return False, ROLLED_BACK, f"{head}: rolled back"
    return (
        False,
        NOT_DISTINGUISHABLE,
        f"{head}: not distinguishable from incumbent {status.incumbent_draft} after observing twice "
        f"serving.canary.duration {canary.duration}: rolled back, the incumbent keeps serving (more traffic, "
        "a longer duration or a larger tolerance lets the intervals clear the threshold)",
    )


def waiting_for(canary: Canary, status: CanaryStatus, figures: CanaryFigures, now: str) -> list[str]:
    """What the decision still waits for (empty: it can be taken)."""
    waits = []
    if canary.prometheus_url is None:
        waits.append(
            "a Prometheus to read the figures from: set serving.canary.prometheusUrl or the operator's "
            "--prometheus-url (the chart's prometheusUrl)"
        )
    if status.started is None:
        return [*waits, f"a ready canary replica (0/{canary.replicas} ready)"]
    if status.extended_at is not None:
        left = duration_seconds(canary.duration) - _seconds(status.extended_at, now)
        if left > 0:
            extension = f"another serving.canary.duration {canary.duration}"
            waits.append(f"{_clock(left)} of the extension ({extension})")
    else:
        left = duration_seconds(canary.duration) - _seconds(status.started, now)
        if left > 0:
            waits.append(f"{_clock(left)} of serving.canary.duration {canary.duration}")
    requests = status.canary.requests if status.canary is not None else None
    if requests is None or requests < canary.min_requests:
        waits.append(f"{requests or 0}/{canary.min_requests} canary requests")
    missing = [
        track
        for track, fig in (("incumbent", status.incumbent), ("canary", status.canary))
        if not _complete(fig)
    ]
    rounds = canary_verdict.rounds_wait(status)
    if figures.problem:
        waits.append(f"figures: {figures.problem}")
    elif missing and canary.prometheus_url is not None:
        waits.append(f"live figures of the {' and the '.join(missing)} (none in Prometheus yet)")
    elif rounds is not None and canary.prometheus_url is not None:
        waits.append(rounds)
    return waits


def _complete(fig: TrackFigures | None) -> bool:
    return fig is not None and fig.acceptance_length is not None and fig.output_tokens_per_second is not None


def figures_text(status: CanaryStatus) -> str:
    """`mean acceptance length 1.00 vs incumbent 1.52, 41.2 vs 40.8 output tokens/s per request`."""
    inc, can = status.incumbent or TrackFigures(), status.canary or TrackFigures()

    def num(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    return (
        f"mean acceptance length {num(can.acceptance_length, 2)} vs incumbent "
        f"{num(inc.acceptance_length, 2)}, {num(can.output_tokens_per_second, 1)} vs "
        f"{num(inc.output_tokens_per_second, 1)} output tokens/s per request, {can.requests or 0} canary "
        f"and {inc.requests or 0} incumbent requests"
    )


def canary_condition(value: str, reason: str, message: str, since: str, generation: int | None) -> Condition:
    return Condition(
        type=ConditionType.CANARY.value,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.999), 60)
    return f"{minutes}m{secs:02d}s left" if minutes else f"{secs}s left"


def canary_news(known: Eagle3RunStatus, status: Eagle3RunStatus) -> list[tuple[bool, str, str]]:
    """The Events of a canary's transitions between the last written status and the new one: (warning,
    reason, message) once when a canary starts, is extended, is promoted or is rolled back; none while it is
    observed."""
    old, new = known.canary, status.canary
    if new is None:
        return []
    if old is not None and (old.phase, old.draft) == (new.phase, new.draft):
        extended = new.phase == CanaryPhase.OBSERVING and new.extended and not old.extended
        return [(False, "CanaryExtended", new.message or "")] if extended else []
    if new.phase == CanaryPhase.OBSERVING:
        message = (
            f"canary {new.deployment} serves draft {new.draft} with {new.replicas} "
            f"replica(s) next to incumbent draft {new.incumbent_draft}"
        )
        return [(False, "CanaryStarted", message)]
    if new.phase == CanaryPhase.PROMOTED:
        return [(False, "CanaryPromoted", new.message or "")]
    return [(True, "CanaryRolledBack", new.message or "")]

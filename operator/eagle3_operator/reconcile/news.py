"""What a reconcile has to tell people: the Normal Events of a run's progress (`kubectl describe e3r`).

Pure: the status as last written and the new one in, (reason, message) pairs out. One Event per stage that
finished and, while train runs, one per epoch it completed (epochs completed between two readings of its
progress make one Event that names them all); with serving.promotion reviewed, one when a new candidate draft
waits for promotion; and the one Warning of the pods going below the Pod Security "restricted" level
(`pod_security_news`).
"""

from __future__ import annotations

from collections.abc import Mapping

from eagle3_contract.api.status import (
    Condition,
    ConditionType,
    Eagle3RunStatus,
    StagePhase,
    StageProgress,
    StageStatus,
)
from eagle3_contract.results import EvaluateResult
from eagle3_contract.stage_metrics import eta_text

STAGE_SUCCEEDED = "StageSucceeded"
EPOCH_COMPLETED = "EpochCompleted"
CANDIDATE_READY = "CandidateReady"
BELOW_RESTRICTED = "PodSecurityBelowRestricted"


def _figures(progress: StageProgress | None) -> str:
    """The train figures a person looks at after an epoch."""
    if progress is None:
        return ""
    parts = []
    if progress.val_loss is not None:
        parts.append(f"val loss {progress.val_loss:.4g}")
    if progress.train_loss is not None:
        parts.append(f"train loss {progress.train_loss:.4g}")
    if progress.estimated_acceptance_length is not None:
        parts.append(f"est. acceptance length {progress.estimated_acceptance_length:.3g}")
    if progress.step is not None:
        parts.append(f"step {progress.step}")
    return ", ".join(parts)


def _succeeded(stage: str, status: StageStatus, seconds: float | None) -> str:
    took = f" in {eta_text(seconds)}" if seconds is not None else ""
    retry = f" (attempt {status.attempts})" if status.attempts > 1 else ""
    figures = _figures(status.progress) if stage == "train" else _choice(stage, status)
    return f"stage {stage} succeeded{took}{retry}" + (f": {figures}" if figures else "")


def _choice(stage: str, status: StageStatus) -> str:
    """evaluate's checkpoint choice (training.checkpointSelection acceptance): each epoch's measured
    acceptance next to its validation loss, and the epoch that ships."""
    if stage != "evaluate":
        return ""
    result = EvaluateResult.parse(status.result)
    choice = result.checkpoint_selection if result is not None else None
    return choice.line() if choice is not None else ""


def _epochs(before: StageProgress | None, after: StageProgress) -> str | None:
    done, total = after.epochs_done, after.epochs
    previous = (before.epochs_done if before is not None else None) or 0
    if done is None or done <= previous:
        return None
    which = f"{done}" if done == previous + 1 else f"{previous + 1}-{done}"
    figures = _figures(after)
    return f"train epoch {which}/{total} completed" + (f": {figures}" if figures else "")


def _candidate(known: Eagle3RunStatus, status: Eagle3RunStatus) -> str | None:
    """A candidate draft that the last written status did not name yet."""
    new, old = status.candidate, known.candidate
    if new is None or not new.path:
        return None
    if old is not None and (new.path, new.sha256) == (old.path, old.sha256):
        return None
    length = new.acceptance_length
    figure = f"mean acceptance length {length:.3f}" if length is not None else "no acceptance"
    return (
        f"candidate draft {new.path} ({figure}) passed the gate and waits for promotion "
        "(serving.promotion reviewed): `eagle3 promote` writes the pinned manifest to commit"
    )


def progress_news(
    known: Eagle3RunStatus, status: Eagle3RunStatus, durations: Mapping[str, float | None]
) -> list[tuple[str, str]]:
    """Events for what moved between `known` (last written) and `status` (the new one): stages that
    succeeded (`durations` from the walk) and train epochs completed while train still runs."""
    news: list[tuple[str, str]] = []
    for stage, now in status.stages.items():
        then = known.stages.get(stage)
        same_attempt = (then.hash if then is not None else None) == now.hash
        if now.phase == StagePhase.SUCCEEDED:
            if then is None or then.phase != StagePhase.SUCCEEDED or not same_attempt:
                news.append((STAGE_SUCCEEDED, _succeeded(stage, now, durations.get(stage))))
        elif now.phase == StagePhase.RUNNING and now.progress is not None:
            earlier = then.progress if then is not None and same_attempt else None
            if (epochs := _epochs(earlier, now.progress)) is not None:
                news.append((EPOCH_COMPLETED, epochs))
    if (waiting := _candidate(known, status)) is not None:
        news.append((CANDIDATE_READY, waiting))
    return news


def pod_security_news(known: Eagle3RunStatus, status: Eagle3RunStatus) -> str | None:
    """The Warning Event's message when the run's pods went below the "restricted" level (or what takes them
    below it changed) since the last written status; None otherwise."""
    new = _condition(status, ConditionType.POD_SECURITY)
    if new is None or new.status != "False":
        return None
    old = _condition(known, ConditionType.POD_SECURITY)
    if old is not None and (old.status, old.message) == (new.status, new.message):
        return None
    return new.message


def _condition(status: Eagle3RunStatus, kind: ConditionType) -> Condition | None:
    return next((c for c in status.conditions if c.type == kind.value), None)

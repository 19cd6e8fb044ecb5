"""What a reconcile has to tell people: the Normal Events of a run's progress (`kubectl describe e3r`).

Pure: the status as last written and the new one in, (reason, message) pairs out. One Event per stage that
finished and, while train runs, one per epoch it completed (epochs completed between two readings of its
progress make one Event that names them all); with serving.promotion reviewed, one when a new candidate draft
waits for promotion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eagle3_contract.api.status import StagePhase
from eagle3_contract.stage_metrics import eta_text

STAGE_SUCCEEDED = "StageSucceeded"
EPOCH_COMPLETED = "EpochCompleted"
CANDIDATE_READY = "CandidateReady"


def _figures(progress: Mapping[str, Any]) -> str:
    """The train figures a person looks at after an epoch."""
    parts = []
    if isinstance(progress.get("valLoss"), int | float):
        parts.append(f"val loss {progress['valLoss']:.4g}")
    if isinstance(progress.get("trainLoss"), int | float):
        parts.append(f"train loss {progress['trainLoss']:.4g}")
    if isinstance(progress.get("estimatedAcceptanceLength"), int | float):
        parts.append(f"est. acceptance length {progress['estimatedAcceptanceLength']:.3g}")
    if isinstance(progress.get("step"), int):
        parts.append(f"step {progress['step']}")
    return ", ".join(parts)


def _succeeded(stage: str, status: Mapping[str, Any], seconds: float | None) -> str:
    took = f" in {eta_text(seconds)}" if seconds is not None else ""
    attempts = status.get("attempts") or 0
    retry = f" (attempt {attempts})" if attempts > 1 else ""
    figures = _figures(status.get("progress") or {}) if stage == "train" else ""
    return f"stage {stage} succeeded{took}{retry}" + (f": {figures}" if figures else "")


def _epochs(before: Mapping[str, Any], after: Mapping[str, Any]) -> str | None:
    done, total = after.get("epochsDone"), after.get("epochs")
    previous = before.get("epochsDone") or 0
    if not isinstance(done, int) or done <= previous:
        return None
    which = f"{done}" if done == previous + 1 else f"{previous + 1}-{done}"
    figures = _figures(after)
    return f"train epoch {which}/{total} completed" + (f": {figures}" if figures else "")


def _candidate(known: Mapping[str, Any], status: Mapping[str, Any]) -> str | None:
    """A candidate draft that the last written status did not name yet."""
    new, old = status.get("candidate") or {}, known.get("candidate") or {}
    if not new.get("path") or (new.get("path"), new.get("sha256")) == (old.get("path"), old.get("sha256")):
        return None
    length = new.get("acceptanceLength")
    figure = f"mean acceptance length {length:.3f}" if isinstance(length, int | float) else "no acceptance"
    return (
        f"candidate draft {new['path']} ({figure}) passed the gate and waits for promotion "
        "(serving.promotion reviewed): `eagle3 promote` writes the pinned manifest to commit"
    )


def progress_news(
    known: Mapping[str, Any], status: Mapping[str, Any], durations: Mapping[str, float | None]
) -> list[tuple[str, str]]:
    """Events for what moved between `known` (last written) and `status` (the new one): stages that
    succeeded (`durations` from the walk) and train epochs completed while train still runs."""
    news: list[tuple[str, str]] = []
    before: Mapping[str, Any] = known.get("stages") or {}
    for stage, now in (status.get("stages") or {}).items():
        then = before.get(stage) or {}
        same_attempt = then.get("hash") == now.get("hash")
        if now.get("phase") == StagePhase.SUCCEEDED.value:
            if then.get("phase") != StagePhase.SUCCEEDED.value or not same_attempt:
                news.append((STAGE_SUCCEEDED, _succeeded(stage, now, durations.get(stage))))
        elif now.get("phase") == StagePhase.RUNNING.value and now.get("progress"):
            earlier = (then.get("progress") or {}) if same_attempt else {}
            if (epochs := _epochs(earlier, now["progress"])) is not None:
                news.append((EPOCH_COMPLETED, epochs))
    if (waiting := _candidate(known, status)) is not None:
        news.append((CANDIDATE_READY, waiting))
    return news

"""serving.promotion reviewed: the run trains, its new draft waits in status.candidate, the pin serves.

In reviewed mode a pinned checkpoint does not skip training (eagle3_contract.stages): it names what production
serves. The training stages and the verify stage (which checks the pin) are walked apart, so the pin serves as
soon as verify passed, while a training edit trains and evaluates a new draft. That draft, once exported past
the gate, is the candidate until `eagle3 promote RUN` pins it in git (the pin then equals it: promoted).

Pure: plain data in, plain data out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from eagle3_contract.api.spec import Eagle3RunSpec, PinnedCheckpoint, Promotion
from eagle3_contract.api.status import Checkpoint, StagePhase, StageProgress, StageStatus
from eagle3_contract.stages import Stage, StagePlan
from eagle3_operator.builders.names import RunRef
from eagle3_operator.reconcile.observe import JobView
from eagle3_operator.reconcile.server_features import ServerFeatures
from eagle3_operator.reconcile.stage_walk import Progress, walk_stages


def reviewed(spec: Eagle3RunSpec) -> bool:
    return spec.serving.promotion is Promotion.REVIEWED


def walk_reviewed(
    ref: RunRef,
    spec: Eagle3RunSpec,
    plans: Sequence[StagePlan],
    previous: dict[str, StageStatus],
    jobs: tuple[JobView, ...],
    spec_configmap: str,
    live: Mapping[str, StageProgress],
    features: ServerFeatures,
) -> tuple[Progress, Progress]:
    """(the training stages' walk, the verify stage's walk): neither waits for the other."""
    training = [p for p in plans if p.stage != Stage.VERIFY]
    check = [p for p in plans if p.stage == Stage.VERIFY]
    return (
        walk_stages(ref, spec, training, previous, jobs, spec_configmap, live, plans, features),
        walk_stages(ref, spec, check, previous, jobs, spec_configmap, live, plans, features),
    )


def with_check(training: Progress, check: Progress) -> Progress:
    """One Progress of both walks: a refused pin is the run's failure first (production's draft is wrong),
    then a training failure; the stage shown is the failed one, else training's, else verify's."""
    failed_walk = check if check.failed else training if training.failed else None
    at = failed_walk or (training if training.blocked_at else check)
    return Progress(
        stages={**training.stages, **check.stages},
        actions=training.actions + check.actions,
        finished=training.finished + check.finished,
        blocked_at=at.blocked_at,
        failed=failed_walk.failed if failed_walk else None,
        stalled=at.stalled,
        suspended=training.suspended or check.suspended,
        gate=training.gate,
        unconfirmed=training.unconfirmed + check.unconfirmed,
        failed_here=training.failed_here + check.failed_here,
    )


def verified_pin(spec: Eagle3RunSpec, check: Progress) -> PinnedCheckpoint | None:
    """The pin, once verify passed (or was skipped: a pin without sha256 serves unchecked)."""
    pin = spec.serving.pinned_checkpoint
    verify = check.stages.get(Stage.VERIFY.value)
    done = (StagePhase.SUCCEEDED, StagePhase.SKIPPED)
    return pin if pin is not None and verify is not None and verify.phase in done else None


def same_draft(pin: PinnedCheckpoint, checkpoint: Checkpoint) -> bool:
    """The pin names this checkpoint: the same directory, or the same weights (a copy)."""
    return pin.path == checkpoint.path or (pin.sha256 is not None and pin.sha256 == checkpoint.sha256)


def candidate(spec: Eagle3RunSpec, exported: Checkpoint | None) -> Checkpoint | None:
    """The current spec's export when it is not what the pin serves (None: nothing new, or promoted)."""
    pin = spec.serving.pinned_checkpoint
    if exported is None or (pin is not None and same_draft(pin, exported)):
        return None
    return exported


def pinned_checkpoint(spec: Eagle3RunSpec, known: Sequence[Checkpoint | None]) -> Checkpoint | None:
    """status.checkpoint of a reviewed run: the pin, with the figures of a known checkpoint it names (the
    export it promoted, the candidate or checkpoint of the previous status)."""
    pin = spec.serving.pinned_checkpoint
    if pin is None:
        return None
    for checkpoint in known:
        if checkpoint is not None and same_draft(pin, checkpoint):
            return checkpoint.model_copy(update={"path": pin.path, "sha256": pin.sha256 or checkpoint.sha256})
    return Checkpoint(path=pin.path, sha256=pin.sha256)


def acceptance_text(checkpoint: Checkpoint) -> str:
    if checkpoint.acceptance_length is None:
        return "acceptance not reported"
    return f"mean acceptance length {checkpoint.acceptance_length:.3f}"


def promote_command(ref: RunRef) -> str:
    return f"eagle3 promote {ref.name} -n {ref.namespace}"


def awaiting_message(ref: RunRef, waiting: Checkpoint) -> str:
    """Ready=False AwaitingPromotion: what waits and what to run."""
    return (
        f"serving.promotion is reviewed: candidate draft {waiting.path} ({acceptance_text(waiting)}) waits "
        f"for review and nothing serves yet; `{promote_command(ref)}` writes the manifest that pins it: "
        "commit it, and vLLM serves the draft once the change is applied"
    )


def waiting_note(ref: RunRef, waiting: Checkpoint) -> str:
    """Appended to Ready=True while the pin serves and a candidate waits."""
    return (
        f"; candidate draft {waiting.path} ({acceptance_text(waiting)}) awaits promotion: "
        f"`{promote_command(ref)}`"
    )

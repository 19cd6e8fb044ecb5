"""One policy for both executors (the operator's walk and `eagle3 run`): when a stage attempt ran out of
memory, the token budget of the attempt after it, and how long an attempt may (and is expected to) take.

A stage that batches by tokens (extract, generate) answers an out-of-memory with its own exit code
(OOM_EXIT_CODE), or is killed by the kernel (`OOMKilled`); the next attempt runs at half the budget, as long
as one sample of `dataset.maxSequenceLength` still fits in a batch.
"""

from __future__ import annotations

import re

from eagle3_contract.api.pods import StageOverride
from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.exit_codes import OOM_EXIT_CODE
from eagle3_contract.stages import Stage

OOM_KILLED = "OOMKilled"
# A Job failed by its podFailurePolicy says which exit code matched ("... failed with exit code 86 matching
# FailJob rule at index 0"): when the pod is gone, that message is all that is left of the exit code.
_POLICY_EXIT_CODE = re.compile(r"\bexit code (\d+)\b")


def is_out_of_memory(exit_code: int | None, reason: str | None = None) -> bool:
    """Whether an attempt ran out of memory: the stage's OOM exit code, or the kernel's OOMKilled."""
    return reason == OOM_KILLED or exit_code == OOM_EXIT_CODE


def policy_exit_code(message: str | None) -> int | None:
    """The exit code a podFailurePolicy failure message names, if any."""
    found = _POLICY_EXIT_CODE.search(message or "")
    return int(found.group(1)) if found else None


def next_token_budget(budget: int | None, max_sequence_length: int) -> int | None:
    """The budget to retry at after an out-of-memory at `budget`: half of it, or None when half would not
    hold one sample of `max_sequence_length` (the stage cannot get smaller: it has failed)."""
    if budget is None or budget // 2 < max_sequence_length:
        return None
    return budget // 2


def out_of_memory_retry_note(attempt: int, budget: int, retry_budget: int) -> str:
    """What the stage's status says when an out-of-memory attempt is retried."""
    return f"attempt {attempt} ran out of memory at a token budget of {budget}; retrying with {retry_budget}"


def out_of_memory_message(stage: str, budget: int | None, max_sequence_length: int) -> str:
    """Why an out-of-memory stage is not retried, and what to change."""
    return (
        f"{stage} ran out of memory even at a token budget of {budget} (halving stops at "
        f"{max_sequence_length}: one sample of dataset.maxSequenceLength must fit); lower "
        "dataset.maxSequenceLength, use more GPUs (verifier.tensorParallelSize) or a smaller model"
    )


# How long a stage is expected to run when spec.stages.<stage>.activeDeadlineSeconds is not set: generous
# figures for a large verifier on one node, for the "stuck in a stage" alert (an override replaces them).
EXPECTED_SECONDS: dict[str, int] = {
    Stage.PREDICT.value: 6 * 3600,  # one vLLM server per acceptance length (synthetic)
    Stage.PREPARE.value: 2 * 3600,
    Stage.GENERATE.value: 48 * 3600,
    Stage.EXTRACT.value: 24 * 3600,
    Stage.VOCAB.value: 2 * 3600,
    Stage.TRAIN.value: 72 * 3600,
    Stage.EVALUATE.value: 6 * 3600,
    Stage.EXPORT.value: 2 * 3600,
    Stage.VERIFY.value: 3600,  # hashing a draft of a few GiB
}


def stage_override(spec: Eagle3RunSpec, stage: Stage) -> StageOverride | None:
    """`spec.stages.<stage>`, if set."""
    override = getattr(spec.stages, stage.value)
    return override if isinstance(override, StageOverride) else None


def stage_deadline(spec: Eagle3RunSpec, stage: Stage) -> int | None:
    """The wall-clock limit of one attempt of `stage` (spec.stages.<stage>.activeDeadlineSeconds): the Job's
    activeDeadlineSeconds in a cluster, the stage process's timeout under `eagle3 run`."""
    override = stage_override(spec, stage)
    return override.active_deadline_seconds if override is not None else None


def expected_seconds(stage: str) -> int:
    """How long an attempt of `stage` is expected to take when no deadline is set (the stuck-run alert)."""
    return EXPECTED_SECONDS.get(stage, 24 * 3600)

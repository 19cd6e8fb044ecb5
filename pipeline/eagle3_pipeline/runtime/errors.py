"""How a stage program fails: a clear message for bad input, a dedicated exit code for out-of-memory."""

from __future__ import annotations

from typing import Any

from eagle3_contract.exit_codes import CHECK_FAILED_EXIT_CODE, OOM_EXIT_CODE


class StageError(Exception):
    """Bad input or environment: the message reaches the status, and the stage's partial output is removed.

    `keep_work=True` keeps it instead, for failures after expensive work that a retry should not redo
    (regenerated rows, extracted hidden states).
    """

    def __init__(self, message: str, *, keep_work: bool = False) -> None:
        super().__init__(message)
        self.keep_work = keep_work


class CheckFailed(StageError):
    """A check found its input wrong (verify: a missing file, another sha256): exit CHECK_FAILED_EXIT_CODE.

    `reason` (CamelCase) becomes the run's condition reason; `detail` (JSON values) joins the termination
    message, so the status can name what was expected and what was found. The same input gives the same
    answer: the operator's Job fails at once and is not retried.
    """

    exit_code = CHECK_FAILED_EXIT_CODE

    def __init__(self, reason: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.detail = detail

    def termination_detail(self) -> dict[str, Any]:
        """The termination message's fields (the operator parses them into the status); built here only, so
        the tests that play a failed check's Job without running it quote the stage's own words."""
        return {"error": str(self), "reason": self.reason, **self.detail}


class OutOfMemory(Exception):
    """The stage ran out of (GPU) memory at its token budget: exit OOM_EXIT_CODE, keep partial output.

    The operator (and the local executor) answer this exit code with a retry at half the token budget, and a
    resumable stage keeps what it finished.
    """

    exit_code = OOM_EXIT_CODE


def is_out_of_memory(exc: BaseException) -> bool:
    """True for torch's CUDA/accelerator OOM errors and the host's MemoryError."""
    if isinstance(exc, MemoryError):
        return True
    name = type(exc).__name__
    text = str(exc)
    return name == "OutOfMemoryError" or (
        isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
    )

"""How a stage program ends: its exit code tells the executors (the operator, `eagle3 run`) what to do next,
and its termination message (a JSON object; `error` on a failure) says why."""

from __future__ import annotations

# Where a stage program writes its termination message: Kubernetes reads /dev/termination-log (the pod's
# terminationMessagePath default); `eagle3 run` gives each attempt a file of its own in this variable.
TERMINATION_LOG = "/dev/termination-log"
ENV_TERMINATION_LOG = "EAGLE3_TERMINATION_LOG"

# Done: the result JSON is the last line of stdout and the container's termination message.
SUCCESS_EXIT_CODE = 0
# Bad input or environment: the message says what, where and what to do; retrying the same input is useless.
STAGE_ERROR_EXIT_CODE = 1
# Out of (GPU) memory: the executors retry with half the token budget (eagle3_contract.policy).
OOM_EXIT_CODE = 86
# A check failed on what it checks (verify: a wrong digest, a missing file): the same files give the same
# answer, so the Job fails at once (podFailurePolicy FailJob) and nothing retries it.
CHECK_FAILED_EXIT_CODE = 87
